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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attention.alignment import aer, extract_alignment, read_talp
from configs.cli import load_config_json
from configs.errors import UserError


def read_pairs(path: Path) -> tuple[list[str], list[str]]:
    """`src ||| tgt` lines -> (sources, targets)."""
    sources, targets = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "|||" not in line:
            raise UserError(f"{path}:{n}: expected 'source ||| target'")
        src, tgt = line.split("|||", 1)
        sources.append(src.strip())
        targets.append(tgt.strip())
    return sources, targets


def score(workdir: Path, pairs: Path, gold: Path, checkpoint: str, batch_size: int) -> dict:
    """AER per layer / layer mean, plain and shift; returns the result dict."""
    from models.loading import load_params, load_tokenizer
    from models.translate import record_maps

    sources, targets = read_pairs(pairs)
    golds = read_talp(gold)
    if len(golds) != len(sources):
        raise UserError(f"{gold} has {len(golds)} lines but {pairs} has {len(sources)}")
    cfg = load_config_json(workdir)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--pairs", required=True, type=Path, help="'src ||| tgt' tokenized pairs")
    parser.add_argument("--gold", required=True, type=Path, help="gold alignments (.talp)")
    parser.add_argument("--checkpoint", default="best", help="best | last | STEP")
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args(argv)
    try:
        for path in (args.pairs, args.gold):
            if not path.is_file():
                raise UserError(f"file not found: {path}")
        result = score(args.workdir, args.pairs, args.gold, args.checkpoint, args.batch_size)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"AER on {result['sentences']} sentences (lower is better), checkpoint step "
          f"{result['checkpoint_steps']}:")
    print(f"{'layer':>6} {'AER':>8} {'AER shift':>10}")
    by_key = {(r["layer"], r["shift"]): r["aer"] for r in result["results"]}
    for layer in dict.fromkeys(r["layer"] for r in result["results"]):
        print(f"{layer!s:>6} {100 * by_key[(layer, False)]:8.1f} {100 * by_key[(layer, True)]:10.1f}")
    best = result["best"]
    print(f"best: layer {best['layer']}{' (shift)' if best['shift'] else ''}, AER {100 * best['aer']:.1f}")
    out = args.workdir / "eval" / "gold_aer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
