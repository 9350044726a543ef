"""What asking for contributions costs: attention maps of a whole split with and without
the norm-based maps and ALTI+ (models/contributions.py).

    python bench/contribution_cost.py --workdir pretrained/de_en_cpu [--split valid]
        [--beam_size 1] [--checkpoint best] [--max_sentences 0] [--json OUT]

Loads the run as evaluate.py does, then records the maps of the decoded hypotheses of
every sentence of the split (`models.translate.record_maps_grouped`, evaluate.py's
`--save_attention N` path without writing files) twice per setting, weights alone and
with `contributions=True`, alternating. Reports, per setting, the first pass (with
compilation) and the best of the later passes, in seconds, and the ratio of the
steady times; the maps of both settings must hold the same weights.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish, load_run  # noqa: E402


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns the JSON result."""
    import os

    import jax
    import numpy as np

    from models.translate import record_maps_grouped

    cfg, tokenizer, loaded, sources, _ = load_run(args.workdir, args.checkpoint, args.split,
                                                  args.max_sentences)
    source_ids = tokenizer.encode_source(sources)
    seconds: dict[str, list[float]] = {"weights": [], "contributions": []}
    maps = {}
    for _ in range(args.passes):
        for setting in seconds:
            start = time.perf_counter()
            maps[setting] = record_maps_grouped(
                loaded.model, tokenizer, source_ids, beam_size=args.beam_size,
                length_penalty=float(cfg.eval.length_penalty), step=loaded.steps[-1],
                batch_size=int(cfg.eval.batch_size), contributions=setting == "contributions")
            seconds[setting].append(time.perf_counter() - start)
    same = all(np.array_equal(getattr(maps["weights"], k), getattr(maps["contributions"], k))
               for k in ("encoder_self", "decoder_self", "cross"))
    steady = {k: min(v[1:]) for k, v in seconds.items()}
    return {
        "workdir": str(args.workdir),
        "checkpoint_step": loaded.steps[-1],
        "split": args.split,
        "num_sentences": len(sources),
        "beam_size": args.beam_size,
        "model": {k: cfg.model[k] for k in ("d_model", "num_encoder_layers",
                                            "num_decoder_layers", "num_heads", "d_ff",
                                            "pre_ln")},
        "passes": args.passes,
        "seconds": seconds,
        "first_pass_s": {k: v[0] for k, v in seconds.items()},
        "steady_s": steady,
        "ratio_steady": steady["contributions"] / steady["weights"],
        "same_weights": same,
        "mean_source_share": float(maps["contributions"].source_share.sum()
                                   / maps["contributions"].target_lengths.sum()),
        "device": f"{jax.default_backend()} x{jax.device_count()}",
        "cpu_count": os.cpu_count(),
        "note": "record_maps_grouped with and without contributions, files not written",
    }


def print_table(result: dict) -> None:
    print(f"{result['num_sentences']} sentences, {result['split']}, beam {result['beam_size']}, "
          f"{result['device']}")
    for setting in ("weights", "contributions"):
        print(f"  {setting:<14} first pass {result['first_pass_s'][setting]:7.1f} s   "
              f"steady {result['steady_s'][setting]:7.1f} s")
    print(f"  contributions / weights (steady): {result['ratio_steady']:.2f}x; same weights: "
          f"{result['same_weights']}; mean source share {result['mean_source_share']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--split", default="valid")
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--beam_size", type=int, default=1)
    parser.add_argument("--max_sentences", type=int, default=0)
    parser.add_argument("--passes", type=int, default=2, help="at least 2: the first compiles")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.passes < 2:
        parser.error("--passes must be at least 2")
    finish(args, run, print_table)


if __name__ == "__main__":
    main()
