"""Is a recipe better than another over its seeds? A paired bootstrap of two groups.

`python -m evaluation.significance --reference REF --baseline A1,A2,A3 --candidate B1,B2`
reads stored hypothesis files (evaluate.py's `<name>.hyp.txt`, one line per reference
line) of the seeds of two recipes and resamples the test sentences with replacement:
each resample scores every system on the same sentences, and the gain is the candidate
seeds' mean score minus the baseline seeds' mean score. It prints the gain on the whole
set, its 95% percentile interval, the resamples' standard deviation and
`p_not_better`, the share of resamples in which the candidate is not ahead (a one-sided
p-value for "the candidate's mean is higher"). With one file a side this is sacreBLEU's
paired bootstrap (`--paired-bs`) reporting the interval of the difference instead of
its two-sided p.

Why groups: the recipes here are judged on the mean of seeds, and a comparison of one
seed against one seed mixes the recipe's effect with the seeds' spread. What it does
not do: resample the seeds themselves (two or three seeds a side cannot estimate that
spread), so the interval is the sentences' sampling noise for these trained models.

The scores are those evaluate.py gives runs on raw text (`data.text_protocol=raw`): the
hypotheses are detokenised, cased, and `bleu_lc_tok` lowercases and tokenises both sides.
A group trained on the literature's text (`lc_norm_tok`: its hypotheses already lowercased
and tokenised) is named by `--baseline_protocol` / `--candidate_protocol`; it is compared on
`bleu_lc_tok` only, its hypotheses with Moses' escapes undone, against the same raw
reference lowercased and tokenised, so that both protocols meet on one text (chrF and cased
BLEU of lowercased text would not be the same score).

The standard deviation is there to compare two gains measured on different sentence
sets (validation and test): their resamples are independent, so the difference of the
gains has deviation sqrt(sd_1² + sd_2²).

Light (no JAX): sacreBLEU and NumPy only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.files import write_atomic
from configs.base import TEXT_PROTOCOLS
from data.protocol import RAW
from evaluation.inputs import read_text
from evaluation.scoring import METRICS, lc_tok_as_written, metric_for

DEFAULT_RESAMPLES = 1000


def sentence_stats(metric, hyps: list[str], refs: list[str]) -> np.ndarray:
    """Each sentence's sufficient statistics for `metric` (sacreBLEU's BLEU or chrF).

    Returns float64 [N, K]: summing rows over any multiset of sentences and scoring the sum
    with `metric._compute_score_from_stats` gives the corpus score of those sentences.
    """
    # sacreBLEU's own paired tests use these two methods the same way (significance.py).
    return np.asarray(metric._extract_corpus_statistics(hyps, [refs]), dtype=np.float64)


def resampled_scores(metric, stats: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Corpus scores of the resamples: stats [N, K], indices int [R, N] -> float [R]."""
    return np.array([metric._compute_score_from_stats(stats[ix].sum(0).tolist()).score
                     for ix in indices])


def compare_groups(refs: list[str], baseline: list[list[str]], candidate: list[list[str]], *,
                   metric: str = "bleu", target_lang: str = "en",
                   resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                   protocols: tuple[str, str] = (RAW, RAW)) -> dict:
    """Paired bootstrap of the candidate group's mean score against the baseline group's.

    Args:
      refs: N reference lines.
      baseline, candidate: lists of systems, each N hypothesis lines (one per seed).
      metric: one of `evaluation.scoring.METRICS`.
      resamples: R, the number of resamples of the N sentences (the same for every system).
      seed: seeds the resampling, so a comparison reads the same when run again.
      protocols: the text protocol (data/protocol.py) each group was trained and
        translated in, (baseline, candidate); `refs` are raw text whatever they are. A
        group not in "raw" is scored on `bleu_lc_tok` only (UserError otherwise).

    Returns a dict: `baseline` / `candidate` {scores [per system], mean}, `gain` (candidate
    mean − baseline mean on all sentences), `ci95` [low, high] of the resampled gains,
    `sd`, `p_not_better` (share of resampled gains ≤ 0), `resamples`, `sentences`,
    `metric`, `signature`, and `resampled_gains` (float [R], for a caller that combines
    comparisons; not written by the command).
    """
    if metric not in METRICS:
        raise UserError(f"--metric {metric}: one of {', '.join(METRICS)}")
    if not baseline or not candidate:
        raise UserError("both groups need at least one hypothesis file")
    if resamples < 1:
        raise UserError(f"--resamples {resamples}: must be at least 1")
    for protocol in protocols:
        if protocol not in TEXT_PROTOCOLS:
            raise UserError(f"text protocol {protocol!r}: one of {', '.join(TEXT_PROTOCOLS)}")
    if metric != "bleu_lc_tok" and set(protocols) != {RAW}:
        raise UserError(f"--metric {metric}: a group in another text protocol than raw is "
                        f"compared on bleu_lc_tok only")
    n = len(refs)
    indices = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    everything = np.arange(n)[None]
    scorer, prepare = metric_for(metric, target_lang)
    ref_text = prepare(refs)  # once: the references are every system's
    groups = {}
    for side, systems, protocol in (("baseline", baseline, protocols[0]),
                                    ("candidate", candidate, protocols[1])):
        # lc_norm_tok hypotheses are in bleu_lc_tok's form already but for the escapes.
        to_metric = prepare if protocol == RAW else lc_tok_as_written
        full, samples = [], []
        for hyps in systems:
            stats = sentence_stats(scorer, to_metric(hyps), ref_text)
            full.append(float(resampled_scores(scorer, stats, everything)[0]))
            samples.append(resampled_scores(scorer, stats, indices))
        groups[side] = {"scores": full, "mean": float(np.mean(full)),
                        "resampled_mean": np.mean(samples, axis=0)}
    gains = groups["candidate"].pop("resampled_mean") - groups["baseline"].pop("resampled_mean")
    low, high = np.percentile(gains, [2.5, 97.5])
    return {"metric": metric, "signature": str(scorer.get_signature()), "sentences": n,
            "resamples": resamples, "seed": seed, "baseline": groups["baseline"],
            "candidate": groups["candidate"],
            "protocols": {"baseline": protocols[0], "candidate": protocols[1]},
            "gain": groups["candidate"]["mean"] - groups["baseline"]["mean"],
            "ci95": [float(low), float(high)], "sd": float(gains.std()),
            "p_not_better": float(np.mean(gains <= 0)), "resampled_gains": gains}


def read_group(paths: list[str], n: int, reference: str) -> list[list[str]]:
    """The hypothesis files of one group; UserError for a file whose line count is not
    the reference's (a hypothesis file of another split, or one cut short)."""
    systems = []
    for path in paths:
        lines, name = read_text(path)
        if len(lines) != n:
            raise UserError(f"{name} has {len(lines)} lines, {reference} has {n}: not "
                            f"hypotheses of that reference")
        systems.append(lines)
    return systems


def summary_lines(result: dict, baseline: list[str], candidate: list[str]) -> list[str]:
    """What the command prints: each side's scores, the gain and its interval."""
    def side(name: str, paths: list[str]) -> str:
        group = result[name]
        each = ", ".join(f"{s:.2f}" for s in group["scores"])
        return f"{name:9s} mean {group['mean']:.2f} over {len(paths)} ({each})"
    low, high = result["ci95"]
    return [f"{result['metric']} ({result['signature']}), {result['sentences']} sentences, "
            f"{result['resamples']} paired resamples",
            side("baseline", baseline), side("candidate", candidate),
            f"gain {result['gain']:+z.2f}, 95% interval [{low:+z.2f}, {high:+z.2f}], sd "
            f"{result['sd']:.2f}, p_not_better {result['p_not_better']:.3f}"]


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    from absl import flags

    flags.DEFINE_string("reference", None, "Reference file (plain or gzip), one line a sentence.")
    flags.DEFINE_list("baseline", [], "Hypothesis files of the baseline's seeds.")
    flags.DEFINE_list("candidate", [], "Hypothesis files of the candidate's seeds.")
    flags.DEFINE_enum("metric", "bleu", list(METRICS), "The score compared.")
    flags.DEFINE_string("target_lang", "en", "Target language (Moses' rules, for bleu_lc_tok).")
    flags.DEFINE_enum("baseline_protocol", RAW, list(TEXT_PROTOCOLS),
                      "Text protocol the baseline was trained in (lc_norm_tok: bleu_lc_tok only).")
    flags.DEFINE_enum("candidate_protocol", RAW, list(TEXT_PROTOCOLS),
                      "Text protocol the candidate was trained in (lc_norm_tok: bleu_lc_tok only).")
    flags.DEFINE_integer("resamples", DEFAULT_RESAMPLES, "Bootstrap resamples.")
    flags.DEFINE_integer("seed", 0, "Seed of the resampling.")
    flags.DEFINE_string("output", None, "Also write the result here (.json).")


def main(argv: list[str]) -> None:
    """absl main: reads and checks every file, compares, prints, writes --output."""
    from absl import flags

    f = flags.FLAGS
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not f.reference:
        raise UserError("--reference is required")
    if not f.baseline or not f.candidate:
        raise UserError("--baseline and --candidate each need at least one hypothesis file")
    output = Path(f.output) if f.output else None
    if output is not None and output.suffix != ".json":
        raise UserError(f"--output {output}: must be a .json file")
    refs, ref_name = read_text(f.reference)
    baseline = read_group(f.baseline, len(refs), ref_name)
    candidate = read_group(f.candidate, len(refs), ref_name)
    result = compare_groups(refs, baseline, candidate, metric=f.metric,
                            target_lang=f.target_lang, resamples=f.resamples, seed=f.seed,
                            protocols=(f.baseline_protocol, f.candidate_protocol))
    del result["resampled_gains"]
    result.update(reference=f.reference, baseline_files=list(f.baseline),
                  candidate_files=list(f.candidate))
    for line in summary_lines(result, f.baseline, f.candidate):
        sys.stdout.write(line + "\n")
    if output is not None:
        write_atomic(output, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    from common import cli

    define_flags()
    cli.run(main)
