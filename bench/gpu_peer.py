"""attnmt and its PyTorch peer on one GPU, in one call: the base model at 32,768 tokens.

    python bench/gpu_peer.py [--batch_tokens 32768] [--steps 20] [--warmup 3]
        [--pack_length 128] [--attention_impl auto] [--torch_compile]
        [--json results/bench/gpu_peer.json]

Runs, one after the other in child processes (each framework owns the GPU's memory alone
while it runs; JAX would otherwise take 75% of it up front):

  1. `bench/torch_reference.py --size base --device cuda --amp bf16` on the standard
     synthetic batches, with PyTorch's default attention backends and again without the
     cuDNN one (`--no_cudnn_attention`), and with `--compile` when `--torch_compile` is
     given; the fastest of these is the peer;
  2. `bench/train_throughput.py --size base --dtype bfloat16 --synthetic` on the same
     batches (same seed, same token budget, same dims), packed into `--pack_length` rows
     (0 = padded like the peer; every batch then has its own shape and compiles once).

Writes one JSON: `device`, `attnmt` (its whole result; `tokens_per_sec` and `mfu` count
non-pad target tokens, as bench/README's 15.2%), `torch` (the best of the peer's runs,
with every run under `torch_runs`), and `ratio` = attnmt / torch target tokens per
second. Each child's own JSON stays beside it (`<json stem>_attnmt.json`, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import write_json  # noqa: E402


def child(script: str, args: list[str], json_path: Path) -> dict:
    """Run `python bench/<script> args --json json_path`; its result, or exit with its error."""
    command = [sys.executable, str(REPO / "bench" / script), *args, "--json", str(json_path)]
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"error: {script} exited with {done.returncode}")
    return json.loads(json_path.read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch_tokens", type=int, default=32768, help="[32768]")
    parser.add_argument("--steps", type=int, default=20, help="measured steps [20]")
    parser.add_argument("--warmup", type=int, default=3, help="[3]")
    parser.add_argument("--pack_length", type=int, default=128,
                        help="attnmt packs pairs into rows this long, 0 = padded [128]")
    parser.add_argument("--attention_impl", choices=("auto", "xla", "cudnn"), default="auto")
    parser.add_argument("--torch_compile", action="store_true",
                        help="also time the peer under torch.compile; the faster run counts")
    parser.add_argument("--json", type=Path, default=REPO / "results" / "bench" / "gpu_peer.json")
    args = parser.parse_args(argv)

    common = ["--size", "base", "--batch_tokens", str(args.batch_tokens),
              "--steps", str(args.steps), "--warmup", str(args.warmup)]
    stem = args.json.with_suffix("")
    peer_args = [*common, "--device", "cuda", "--amp", "bf16"]
    torch_runs = [child("torch_reference.py", peer_args, Path(f"{stem}_torch.json")),
                  child("torch_reference.py", [*peer_args, "--no_cudnn_attention"],
                        Path(f"{stem}_torch_no_cudnn.json"))]
    if args.torch_compile:
        torch_runs.append(child("torch_reference.py",
                                [*peer_args, "--compile"],
                                Path(f"{stem}_torch_compile.json")))
    attnmt = child("train_throughput.py",
                   [*common, "--dtype", "bfloat16", "--synthetic",
                    "--pack_length", str(args.pack_length),
                    "--attention_impl", args.attention_impl],
                   Path(f"{stem}_attnmt.json"))
    peer = max(torch_runs, key=lambda run: run["tokens_per_sec"])
    result = {
        "device": attnmt["device"],
        "jax_version": attnmt["jax_version"],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "batch_tokens": args.batch_tokens,
        "attnmt": attnmt,
        "torch": peer,
        "torch_runs": torch_runs,
        "ratio": attnmt["tokens_per_sec"] / peer["tokens_per_sec"],
    }
    write_json(args.json, result)
    print(f"{result['device']}: attnmt {attnmt['tokens_per_sec']:,.0f} target tok/s "
          f"(MFU {attnmt['mfu']:.1%} non-pad, {attnmt['mfu_padded']:.1%} padded), "
          f"torch {peer['tokens_per_sec']:,.0f} (compile {peer['compile']}, cuDNN attention "
          f"{peer['cudnn_attention']}): "
          f"ratio {result['ratio']:.2f}")
    return result


if __name__ == "__main__":
    main()
