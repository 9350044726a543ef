"""Score a trained model's cross-attention against gold word alignments (AER).

    python -m attention.gold_aer --workdir runs/de_en \
        --pairs ../shared/data/alignment/de-en/test.de-en \
        --gold ../shared/data/alignment/de-en/gold.talp

Forced decoding: each gold pair (`source ||| target`, tokenized text) is teacher-forced
through the model, the cross-attention of every layer is recorded, and hard word
alignments are read from it (argmax over source words per target word, SentencePiece
pieces merged into the whitespace words of the gold file). Prints AER per decoder
layer and for the mean of all layers, for the plain reading (the row where the target
word is predicted) and the "shift" reading (the row where it is the decoder input,
Chen et al. 2020), and writes `<workdir>/eval/gold_aer.json`.

Flags follow the absl convention of `configs/cli.py`; bad input (a missing file, a
malformed line, files of different lengths) gives one `error: ...` line and exit 2.
`score(...)` is the same computation as a Python function.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import flags
from absl import logging as absl_logging

from attention.alignment import aer, extract_alignment, read_talp
from configs import cli
from configs.errors import UserError
from configs.files import require_file, write_atomic

FLAGS = flags.FLAGS
RESULT_FILE = Path("eval") / "gold_aer.json"  # relative to the workdir


def define_flags() -> None:
    """Defines the command-line flags (only when run as a script, so that importing this
    module from tests or other tools never adds global flags)."""
    flags.DEFINE_string("workdir", None, "Training run directory (config.json, tokenizer/, "
                        "checkpoints/). Required.")
    flags.DEFINE_string("pairs", None, "'src ||| tgt' tokenized pairs, one per line. Required.")
    flags.DEFINE_string("gold", None, "Gold alignments (.talp), one line per pair. Required.")
    flags.DEFINE_string("checkpoint", "best", "best | last | STEP")
    flags.DEFINE_integer("batch_size", 32, "Sentences per forced-decoding batch.")


def read_pairs(path: Path) -> tuple[list[str], list[str]]:
    """`src ||| tgt` lines -> (sources, targets), both [N] stripped strings.

    Raises UserError naming the file and line of a line without "|||", or a file that is
    not UTF-8.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason})") from None
    sources, targets = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if "|||" not in line:
            raise UserError(f"{path}:{n}: expected 'source ||| target'")
        src, tgt = line.split("|||", 1)
        sources.append(src.strip())
        targets.append(tgt.strip())
    return sources, targets


def score(workdir: Path, pairs: Path, gold: Path, checkpoint: str, batch_size: int) -> dict:
    """AER of every decoder layer and of the layer mean, plain and shift reading.

    Args:
      workdir: a trained run; pairs: N `src ||| tgt` lines; gold: N TALP lines;
      checkpoint: best | last | STEP; batch_size: sentences per forced-decoding batch.
    Returns:
      {"pairs", "gold", "sentences": N, "checkpoint_steps": [step],
       "results": [{"layer": 0..L-1 | "mean", "shift": bool, "aer": float in [0, 1]}],
       "best": the result with the lowest AER}.
    Raises:
      UserError: a missing or malformed file, different line counts, not a usable workdir.
    """
    # Here, not at the top: they load JAX, which `read_pairs` users do not need.
    from models.loading import load_params, load_tokenizer
    from models.translate import record_maps

    workdir, pairs, gold = Path(workdir), Path(pairs), Path(gold)
    require_file(pairs)
    require_file(gold)
    if batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {batch_size}")
    sources, targets = read_pairs(pairs)
    golds = read_talp(gold)
    if len(golds) != len(sources):
        raise UserError(f"{gold} has {len(golds)} lines but {pairs} has {len(sources)}")
    cfg = cli.load_config_json(workdir)
    tokenizer = load_tokenizer(workdir, cfg)
    loaded = load_params(workdir, checkpoint, cfg=cfg, tokenizer=tokenizer)
    model = loaded.model
    num_layers = len(model.decoder_layers)
    settings = [(layer, shift) for layer in [*range(num_layers), "mean"] for shift in (False, True)]
    hyps: dict = {s: [] for s in settings}
    for start in range(0, len(sources), batch_size):
        src_ids = tokenizer.encode_source(sources[start:start + batch_size])
        tgt_ids = tokenizer.encode_target(targets[start:start + batch_size])
        maps = record_maps(model, tokenizer, src_ids, tgt_ids, step=loaded.steps[-1])
        for example in range(maps.num_examples):
            for layer, shift in settings:
                hyps[(layer, shift)].append(
                    extract_alignment(maps, example, layers=layer, heads="mean", shift=shift, words=True))
    rows = [{"layer": layer, "shift": shift, "aer": aer(hyps[(layer, shift)], golds)}
            for layer, shift in settings]
    best = min(rows, key=lambda r: r["aer"])
    return {"pairs": str(pairs), "gold": str(gold), "sentences": len(sources),
            "checkpoint_steps": loaded.steps, "results": rows, "best": best}


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
    # Imported after the flag checks: JAX takes a second or two to load.
    from models.compilation import enable_compilation_cache

    # Before the model is built: forced decoding then reuses earlier runs' compilations.
    enable_compilation_cache()
    workdir = Path(FLAGS.workdir)
    result = score(workdir, Path(FLAGS.pairs), Path(FLAGS.gold), FLAGS.checkpoint,
                   FLAGS.batch_size)
    for line in report_lines(result):
        print(line)
    write_atomic(workdir / RESULT_FILE, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
