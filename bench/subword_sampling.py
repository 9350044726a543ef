"""What subword regularisation costs: one epoch's sampled encoding (data/sampling.py).

    python bench/subword_sampling.py [--config multi30k_de_en_cpu]
        [--settings 0.1:8,0.1:16,0.5:16,0.1:64] [--json results/bench/subword_sampling.json]

For each alpha:l setting (l is unused by a BPE config's BPE-dropout), the wall time of
`SampledEpochs.encode_epoch(0)` over the config's whole training split (this is the work
the background thread does once per epoch, off the training step's path) and the tokens
of the sampled epoch against the best segmentation (sampled pieces are shorter, so a batch of `train.batch_tokens` holds
fewer pairs). The tokenizer and the deterministic encoding come from the data cache
(`--cache_dir`, trained there on first use), as train.py gets them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.cache import DataCache  # noqa: E402
from data.sampling import SampledEpochs  # noqa: E402
from data.streaming import training_source  # noqa: E402


def parse_settings(text: str) -> list[tuple[float, int]]:
    return [(float(a), int(n)) for a, n in (item.split(":") for item in text.split(","))]


def run(args: argparse.Namespace) -> dict:
    cfg = importlib.import_module(f"configs.{args.config}").get_config()
    source = training_source(cfg.data)
    cache = DataCache(args.cache_dir)
    corpus = cache.scan(source)
    tokenizer_dir = args.cache_dir / "bench_tokenizer" / args.config
    tokenizer = cache.tokenizer(tokenizer_dir, cfg.data, source, corpus)
    src, tgt, _ = cache.encoded(source, corpus, tokenizer, tokenizer_dir, cfg.data.max_length,
                                cfg.data.long_pairs)
    best = int(src.lengths.sum() + tgt.lengths.sum())
    result = {"config": args.config, "vocab_size": cfg.data.vocab_size,
              "model_type": cfg.data.spm_model_type, "pairs": len(src), "best_tokens": best,
              "machine": platform.processor() or platform.machine(), "settings": []}
    for alpha, nbest in args.settings:
        cfg.data.spm_sampling_alpha, cfg.data.spm_nbest_size = alpha, nbest
        epochs = SampledEpochs(source, tokenizer, cfg.data, batch_tokens=cfg.train.batch_tokens)
        start = time.perf_counter()
        sources, targets, dropped = epochs.encode_epoch(0)
        seconds = time.perf_counter() - start
        tokens = sum(map(len, sources)) + sum(map(len, targets))
        if cfg.data.spm_model_type == "bpe":  # BPE-dropout: alpha skips merges, no l
            nbest = None
        row = {"alpha": alpha, "nbest_size": nbest, "epoch_encode_s": round(seconds, 2),
               "tokens_vs_best": round(tokens / best, 4), "dropped": dropped}
        result["settings"].append(row)
        print(f"alpha {alpha:<4} l {nbest or '-':<3} {seconds:6.1f} s per epoch, "
              f"tokens x{tokens / best:.3f} of the best segmentation, {dropped} dropped",
              flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="multi30k_de_en_cpu",
                        help="a configs/ module [multi30k_de_en_cpu]")
    parser.add_argument("--settings", type=parse_settings,
                        default=parse_settings("0.1:8,0.1:16,0.5:16,0.1:64"),
                        help="alpha:l pairs, comma-separated [0.1:8,0.1:16,0.5:16,0.1:64]")
    parser.add_argument("--cache_dir", type=Path, default=Path("runs/bench_cache"))
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
