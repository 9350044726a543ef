"""Minimum-Bayes-risk selection from an n-best list (Kumar & Byrne 2004; Eikema & Aziz
2020), here over beam search's n-best list.

Each sentence's candidates are both the hypotheses and the evidence: a candidate's
expected utility is its mean sentence-level score (sacreBLEU's BLEU with effective order,
or chrF) against every other candidate as a pseudo-reference, each weighted alike; the
candidate with the highest wins, the better-ranked one on a tie (so a one-entry list,
or candidates that all agree, return beam search's own answer). Its cost is K * (K - 1)
sentence scores a sentence, on the host, after decoding.

`python -m evaluation.mbr --workdir W [--split valid] [--checkpoint last --average_last 10]
[--beam_sizes 5,10,20] [--utilities bleu,chrf] [--length_penalty P] --output OUT.json`
decodes the split's n-best lists once per beam size and scores beam search's own answer
(`top1`) beside each utility's MBR choice: BLEU, lc-tok BLEU and chrF as evaluate.py
reports them, and how many sentences MBR changed. Writes OUT.json and, beside it, each
reading's hypotheses (`<OUT stem>.beam<K>.<top1|mbr-bleu|mbr-chrf>.hyp.txt`, for
`python -m evaluation.significance`).
"""

from __future__ import annotations

import json
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF

from common.errors import UserError

UTILITIES = ("bleu", "chrf")


def utility_metric(utility: str):
    """The sacreBLEU metric object scoring one candidate against one pseudo-reference."""
    if utility == "bleu":
        return BLEU(effective_order=True)  # sentence BLEU: short hypotheses keep a score
    if utility == "chrf":
        return CHRF()
    raise ValueError(f"utility must be one of {UTILITIES}, got {utility!r}")


def expected_utilities(candidates: list[str], utility: str) -> list[float]:
    """[K] each candidate's mean score against the other K - 1 (0.0 for K = 1)."""
    metric = utility_metric(utility)
    k = len(candidates)
    if k < 2:
        return [0.0] * k
    return [sum(metric.sentence_score(c, [o]).score for j, o in enumerate(candidates) if j != i)
            / (k - 1) for i, c in enumerate(candidates)]


def mbr_select(nbest: list[list[str]], utility: str) -> list[int]:
    """Per sentence, the index of the candidate of highest expected utility (the earlier
    on a tie; an empty list gives -1).

    nbest: per sentence, its candidates best-scored first (`translate_ids(nbest=True)`
    decoded to text).
    """
    chosen = []
    for candidates in nbest:
        gains = expected_utilities(candidates, utility)
        chosen.append(max(range(len(gains)), key=lambda i: (gains[i], -i)) if gains else -1)
    return chosen


# ------------------------------------------------------------------ the study command



def study(workdir: Path, *, split: str, checkpoint: str | None, average_last: int,
          beam_sizes: list[int], utilities: list[str], length_penalty: float | None,
          batch_size: int | None, max_sentences: int) -> tuple[dict, dict[str, list[str]]]:
    """The readings of the module's command: (result, {reading label: hypotheses})."""
    from configs import resolved
    from data.protocol import protocol_of
    from evaluation.corpus import clean_line
    from evaluation.inputs import read_inputs
    from evaluation.loading import load_params, load_tokenizer
    from evaluation.scoring import score
    from models.translate import translate_ids

    cfg = resolved.load_config_json(workdir)
    inputs = read_inputs(cfg, split, None, None, max_sentences)
    tokenizer = load_tokenizer(workdir, cfg)
    loaded = load_params(workdir, checkpoint, average_last, cfg=cfg, tokenizer=tokenizer)
    penalty = float(cfg.eval.length_penalty) if length_penalty is None else length_penalty
    protocol = protocol_of(cfg.data)
    todo = [i for i, s in enumerate(inputs.sources) if s]  # empty lines stay empty
    ids = tokenizer.encode_source([inputs.sources[i] for i in todo])
    readings, hyps = [], {}
    for k in beam_sizes:
        nbest = translate_ids(loaded.model, ids, beam_size=k, length_penalty=penalty,
                              batch_size=batch_size or int(cfg.eval.batch_size),
                              bucket_step=int(cfg.data.bucket_step), nbest=True)
        texts = [[clean_line(t) for t in tokenizer.decode_target(c)] for c in nbest]
        picks = {"top1": [0] * len(texts)}
        picks.update({f"mbr-{u}": mbr_select(texts, u) for u in utilities})
        for selection, chosen in picks.items():
            lines = [""] * len(inputs.sources)
            for i, candidates, j in zip(todo, texts, chosen, strict=True):
                lines[i] = candidates[j] if candidates else ""
            scores = score(lines, inputs.references, compat_lc_tok=True,
                           target_lang=cfg.data.target_lang, text_protocol=protocol)
            label = f"beam{k}.{selection}"
            hyps[label] = lines
            readings.append({"label": label, "beam_size": k, "selection": selection,
                             "changed": sum(j != 0 for j in chosen),
                             **{key: scores[key] for key in ("bleu", "bleu_lc_tok", "chrf")}})
    result = {"workdir": str(workdir), "split": inputs.split, "text_protocol": protocol,
              "num_sentences": len(inputs.sources), "checkpoint_step": loaded.steps[-1],
              "checkpoint": {"requested": loaded.requested, "steps": loaded.steps},
              "length_penalty": penalty, "readings": readings,
              "signatures": {key: scores[f"{key}_signature"]
                             for key in ("bleu", "bleu_lc_tok", "chrf")}}
    return result, hyps


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    from absl import flags

    flags.DEFINE_string("workdir", None, "The training run.")
    flags.DEFINE_enum("split", "valid", ["valid", "test"], "The split decoded.")
    flags.DEFINE_string("checkpoint", None, "best | last | STEP (as evaluate.py).")
    flags.DEFINE_integer("average_last", 0, "Average the N newest checkpoints (as evaluate.py).")
    flags.DEFINE_list("beam_sizes", ["5", "10", "20"], "n-best sizes, one decoding each.")
    flags.DEFINE_list("utilities", list(UTILITIES), f"MBR utilities, of {UTILITIES}.")
    flags.DEFINE_float("length_penalty", None, "GNMT alpha (default: the config's).")
    flags.DEFINE_integer("batch_size", None, "Sentences per batch (default: the config's).")
    flags.DEFINE_integer("max_sentences", 0, "Only the first N lines (0 = all).")
    flags.DEFINE_string("output", None, "The result (.json); the hypotheses beside it.")


def main(argv: list[str]) -> None:
    """absl main: checks every flag before decoding, then writes the result and texts."""
    from absl import flags
    from absl import logging as absl_logging

    from common import cli
    from common.files import write_atomic

    f = flags.FLAGS
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not f.workdir or not f.output:
        raise UserError("--workdir and --output are required")
    output = Path(f.output)
    if output.suffix != ".json":
        raise UserError(f"--output {output}: must be a .json file")
    bad = [u for u in f.utilities if u not in UTILITIES]
    if bad or not f.utilities:
        raise UserError(f"--utilities {','.join(f.utilities)}: each one of {', '.join(UTILITIES)}")
    try:
        beam_sizes = [int(k) for k in f.beam_sizes]
    except ValueError:
        beam_sizes = []
    if not beam_sizes or min(beam_sizes) < 2:
        raise UserError(f"--beam_sizes {','.join(f.beam_sizes)}: integers of at least 2")
    if f.length_penalty is not None and f.length_penalty < 0:
        raise UserError(f"--length_penalty must be >= 0, got {f.length_penalty}")
    if not output.parent.is_dir():
        raise UserError(f"--output {output}: its folder does not exist")
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO lines on every restore
    result, hyps = study(Path(f.workdir), split=f.split, checkpoint=f.checkpoint,
                         average_last=f.average_last, beam_sizes=beam_sizes,
                         utilities=list(f.utilities), length_penalty=f.length_penalty,
                         batch_size=f.batch_size, max_sentences=f.max_sentences)
    files = {}
    for label, lines in hyps.items():
        path = output.with_name(f"{output.stem}.{label}.hyp.txt")
        write_atomic(path, "".join(line + "\n" for line in lines))
        files[label] = str(path)
    result["files"] = files
    for r in result["readings"]:
        print(f"{r['label']:<18} BLEU {r['bleu']:.2f}  lc-tok {r['bleu_lc_tok']:.2f}  "
              f"chrF {r['chrf']:.2f}  changed {r['changed']}")
    write_atomic(output, json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    from common import cli

    define_flags()
    cli.run(main)
