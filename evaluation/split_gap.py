"""Where a model's BLEU gap between two splits comes from: the brevity penalty or the
n-gram precisions.

`python -m evaluation.split_gap --valid V1,V2,V3 --test T1,T2,T3 [--metric bleu_lc_tok]`
reads stored evaluation results (evaluate.py's JSON, one model a pair: its reading on
one split and on the other) and splits each pair's gap, BLEU(valid) − BLEU(test), in two.

BLEU = 100 · BP · G, with G the geometric mean of the four n-gram precisions and BP the
brevity penalty. Going from one split to the other changes both factors; the part of
each is its Shapley share (the mean over the two orders of changing them):

    precision part = ½ [(B_v − 100·BP_v·G_t) + (100·BP_t·G_v − B_t)]
    brevity part   = ½ [(B_v − 100·BP_t·G_v) + (100·BP_v·G_t − B_t)]

so the two add up to the gap exactly. A brevity part says the output's length against
the references differs between the splits (a length penalty chosen on one split meets
references of another length on the other); a precision part says the words themselves
match one split's references better.

BP and the precisions are read from the result's sacreBLEU summary line (`<metric>_text`,
e.g. `BLEU = 42.85 74.4/51.6/36.3/26.0 (BP = 0.982 ratio = ...)`: the results store no
counts), where they are rounded to 0.1 and 0.001; the gap itself is the stored score's.
The rounding moves a part by a few hundredths at most.

Light (no JAX): the standard library only.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from common.errors import UserError
from common.files import write_atomic

METRICS = ("bleu", "bleu_lc_tok")
# sacreBLEU's BLEUScore.__str__ (format_score): score, four precisions, BP, ratio, lengths.
_SUMMARY = re.compile(r"= (?P<score>[\d.]+) (?P<p>[\d.]+/[\d.]+/[\d.]+/[\d.]+) "
                      r"\(BP = (?P<bp>[\d.]+) ratio = (?P<ratio>[\d.]+) "
                      r"hyp_len = (?P<hyp>\d+) ref_len = (?P<ref>\d+)\)")


def bleu_parts(result: dict, metric: str = "bleu_lc_tok") -> dict:
    """One evaluation result's BLEU and its factors: {"score", "precisions" [4, %], "bp",
    "ratio", "hyp_len", "ref_len"}; UserError when the result has no such summary line."""
    text = result.get(f"{metric}_text")
    match = _SUMMARY.search(text) if isinstance(text, str) else None
    if match is None or metric not in result:
        raise UserError(f"no {metric} and {metric}_text (sacreBLEU's summary) in "
                        f"{result.get('name', 'the result')}")
    return {"score": float(result[metric]),
            "precisions": [float(p) for p in match["p"].split("/")],
            "bp": float(match["bp"]), "ratio": float(match["ratio"]),
            "hyp_len": int(match["hyp"]), "ref_len": int(match["ref"])}


def _geo_mean(precisions: list[float]) -> float:
    """The geometric mean of four precisions given in percent, as a fraction."""
    if min(precisions) <= 0:
        return 0.0
    return math.exp(sum(math.log(p / 100) for p in precisions) / len(precisions))


def split_gap(valid: dict, test: dict) -> dict:
    """The gap between two readings of one model (`bleu_parts` of each) and its two parts:
    {"gap", "precision_part", "brevity_part", "precision_diffs" [4], "bp": [v, t],
    "ratio": [v, t]}; precision_part + brevity_part == gap."""
    b_v, b_t = valid["score"], test["score"]
    g_v, g_t = _geo_mean(valid["precisions"]), _geo_mean(test["precisions"])
    bp_v, bp_t = valid["bp"], test["bp"]
    precision_part = ((b_v - 100 * bp_v * g_t) + (100 * bp_t * g_v - b_t)) / 2
    return {"gap": b_v - b_t, "precision_part": precision_part,
            "brevity_part": (b_v - b_t) - precision_part,
            "precision_diffs": [v - t for v, t in zip(valid["precisions"],
                                                      test["precisions"], strict=True)],
            "bp": [bp_v, bp_t], "ratio": [valid["ratio"], test["ratio"]]}


def split_gaps(valid: list[dict], test: list[dict], metric: str = "bleu_lc_tok") -> dict:
    """Each model's `split_gap` (result JSONs, paired in order) and their mean:
    {"metric", "models": [...], "mean": {...}}."""
    if metric not in METRICS:
        raise UserError(f"--metric {metric}: one of {', '.join(METRICS)}")
    if not valid or len(valid) != len(test):
        raise UserError(f"--valid and --test must name as many results each, at least one "
                        f"(got {len(valid)} and {len(test)})")
    models = [split_gap(bleu_parts(v, metric), bleu_parts(t, metric))
              for v, t in zip(valid, test, strict=True)]

    def mean(values: list) -> float | list[float]:
        if isinstance(values[0], list):
            return [sum(column) / len(values) for column in zip(*values, strict=True)]
        return sum(values) / len(values)

    return {"metric": metric, "models": models,
            "mean": {key: mean([m[key] for m in models]) for key in models[0]}}


def summary_line(result: dict) -> str:
    """The mean, in one line."""
    m = result["mean"]
    diffs = " / ".join(f"{d:+z.1f}" for d in m["precision_diffs"])
    return (f"{result['metric']} gap {m['gap']:+z.2f} = precisions {m['precision_part']:+z.2f}"
            f" + brevity {m['brevity_part']:+z.2f} (mean of {len(result['models'])}; "
            f"1- to 4-gram precisions {diffs}; BP {m['bp'][0]:.3f} -> {m['bp'][1]:.3f})")


def read_results(paths: list[str]) -> list[dict]:
    """The result JSONs; UserError for a file that is not one."""
    results = []
    for path in paths:
        try:
            result = json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UserError(f"{path}: not a JSON file ({err})") from None
        if not isinstance(result, dict):
            raise UserError(f"{path}: not an evaluate.py result (a JSON object)")
        results.append(result)
    return results


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    from absl import flags

    flags.DEFINE_list("valid", [], "Result JSONs of the models on the first split.")
    flags.DEFINE_list("test", [], "Result JSONs of the same models, in the same order, on "
                      "the second split.")
    flags.DEFINE_enum("metric", "bleu_lc_tok", list(METRICS), "The BLEU split.")
    flags.DEFINE_string("output", None, "Also write the result here (.json).")


def main(argv: list[str]) -> None:
    """absl main: reads every file, splits each gap, prints the mean, writes --output."""
    from absl import flags

    f = flags.FLAGS
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    output = Path(f.output) if f.output else None
    if output is not None and output.suffix != ".json":
        raise UserError(f"--output {output}: must be a .json file")
    result = split_gaps(read_results(f.valid), read_results(f.test), f.metric)
    result.update(valid_files=list(f.valid), test_files=list(f.test))
    sys.stdout.write(summary_line(result) + "\n")
    if output is not None:
        write_atomic(output, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    from common import cli

    define_flags()
    cli.run(main)
