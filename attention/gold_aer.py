"""The old name of the AER table: `python -m attention.align` does the alignment work.

    python -m attention.gold_aer --workdir runs/de_en \
        --pairs ../shared/data/alignment/de-en/test.de-en \
        --gold ../shared/data/alignment/de-en/gold.talp

A thin alias over `attention.align`: the gold pairs are forced-decoded once
(`models.forced_alignment.Recorded`) and scored with argmax links, heads averaged, for every
decoder layer and the layer mean, on the prediction row and the "shift" row (Chen et al.
2020). Prints the table and writes `<workdir>/eval/gold_aer.json`. For the links
themselves, thresholds, symmetrisation and settings chosen on a dev split, use
`python -m attention.align ... --gold F [--select]`.

Flags follow the absl convention of `configs/cli.py`; bad input gives one `error: ...`
line and exit 2. `score(...)` is the same computation as a Python function.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import flags
from absl import logging as absl_logging

from attention.alignment import read_gold, read_pairs
from attention.alignment_scoring import alignment_scores
from configs import cli
from configs.errors import UserError
from configs.files import require_file, write_atomic

__all__ = ["read_pairs", "score", "report_lines"]  # read_pairs: attention.heads imports it here
FLAGS = flags.FLAGS
RESULT_FILE = Path("eval") / "gold_aer.json"  # relative to the workdir


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    flags.DEFINE_string("workdir", None, "Training run directory. Required.")
    flags.DEFINE_string("pairs", None, "'src ||| tgt' tokenized pairs, one per line. Required.")
    flags.DEFINE_string("gold", None, "Gold alignments (.talp), one line per pair. Required.")
    flags.DEFINE_string("checkpoint", "best", "best | last | STEP")
    flags.DEFINE_integer("batch_size", 32, "Sentences per forced-decoding batch.")


def score(workdir: Path, pairs: Path, gold: Path, checkpoint: str, batch_size: int) -> dict:
    """AER (with precision and recall) of every decoder layer and the layer mean, plain and
    shift reading, argmax links.

    Returns:
      {"pairs", "gold", "sentences": N, "checkpoint_steps": [step],
       "results": [{"layer": 0..L-1 | "mean", "shift": bool, "aer", "precision", "recall"}],
       "best": the result with the lowest AER}.
    Raises:
      UserError: a missing or malformed file, different line counts, not a usable workdir.
    """
    from models.forced_alignment import Recorded  # loads JAX when it forced-decodes

    require_file(pairs)
    if batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {batch_size}")
    sources, targets = read_pairs(pairs)
    golds = read_gold(gold, sources, targets)
    rec = Recorded(workdir, checkpoint, sources, targets, batch_size=batch_size)
    rows = []
    for layer in [*range(rec.num_layers), "mean"]:
        for shift in (False, True):
            scores = alignment_scores(rec.links(layer, shift, None), golds)
            rows.append({"layer": layer, "shift": shift,
                         **{k: scores[k] for k in ("aer", "precision", "recall")}})
    return {"pairs": str(pairs), "gold": str(gold), "sentences": len(sources),
            "checkpoint_steps": [rec.step], "results": rows,
            "best": min(rows, key=lambda r: r["aer"])}


def report_lines(result: dict) -> list[str]:
    """The table printed on stdout: AER in percent per layer, plain and shift, and the best."""
    lines = [f"AER on {result['sentences']} sentences (lower is better), checkpoint step "
             f"{result['checkpoint_steps']}:",
             f"{'layer':>6} {'AER':>8} {'AER shift':>10}"]
    by_key = {(r["layer"], r["shift"]): r["aer"] for r in result["results"]}
    for layer in dict.fromkeys(r["layer"] for r in result["results"]):
        lines.append(f"{layer!s:>6} {100 * by_key[(layer, False)]:8.1f} "
                     f"{100 * by_key[(layer, True)]:10.1f}")
    best = result["best"]
    lines.append(f"best: layer {best['layer']}{' (shift)' if best['shift'] else ''}, "
                 f"AER {100 * best['aer']:.1f}")
    return lines


def main(argv: list[str]) -> None:
    """absl main: scores, prints the table, writes `<workdir>/eval/gold_aer.json`."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    for name in ("workdir", "pairs", "gold"):
        if FLAGS[name].value is None:
            raise UserError(f"--{name} is required")
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO/WARNING chatter
    from models.compilation import enable_compilation_cache

    enable_compilation_cache()  # forced decoding reuses earlier runs' compilations
    workdir = Path(FLAGS.workdir)
    result = score(workdir, Path(FLAGS.pairs), Path(FLAGS.gold), FLAGS.checkpoint,
                   FLAGS.batch_size)
    for line in report_lines(result):
        print(line)
    write_atomic(workdir / RESULT_FILE, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
