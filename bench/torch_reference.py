"""The PyTorch reference: `nn.Transformer` (pre-LN) on the same synthetic batches.

    python bench/torch_reference.py --size tiny|base [--steps 20] [--warmup 3]
        [--threads 2] [--batch_tokens 4096] [--vocab_size 8000] [--dropout 0.2]
        [--device cpu|cuda] [--amp bf16] [--compile] [--json OUT]

Needs PyTorch (not a dependency of attnmt: `pip install torch`, CPU build); no JAX.
On a GPU (`--device cuda`) it is the peer of bench/gpu_peer.py: `--amp bf16` runs the
step under `torch.autocast(bfloat16)` (float32 parameters and optimizer, as attnmt's
`model.dtype=bfloat16`), AdamW is the fused CUDA kernel, `--compile` wraps the model in
`torch.compile(dynamic=True)` (the synthetic batches change shape every step).
`--no_cudnn_attention` turns off PyTorch's cuDNN attention backend (it then picks the
memory-efficient kernel): on an H100 with torch 2.11 the cuDNN backend spent ~8 ms of
host time per call building a plan for every new batch shape (profiled, 3 steps: 0.88 s
of host time in attention for 37 ms of GPU time), which made the step host-bound.
It exists so that the comparison figures of bench/README.md are measured on this
machine, in the same run conditions, and with both token counts, rather than quoted.

Model: token embedding (shared by source, target and the output projection, scaled by
sqrt(d_model)) + sinusoidal positions, `nn.Transformer(d_model, heads, L, L, d_ff,
dropout, batch_first=True, norm_first=True)` with the attention dropout of its
MultiheadAttention modules set to 0 (attnmt's presets have none; nn.Transformer ties it
to `dropout`), causal target mask and key-padding masks, label
smoothing 0.1 with padding ignored, AdamW (lr 1e-3, betas 0.9/0.98, eps 1e-9) with
global-norm clipping at 1.0: the same full training step as bench/train_throughput.py.

Batches: `bench.synthetic.synthetic_batches` (the standard comparison batches).
Timing: `--warmup` steps, then `--steps` measured steps; PyTorch on the CPU is
synchronous, so wall time over the measured steps is the step time. No compilation.
`tokens_per_sec` counts non-pad target tokens (tgt_out), `src_tgt_tokens_per_sec`
adds the non-pad source tokens, as bench/train_throughput.py does.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import write_json  # noqa: E402
from bench.synthetic import synthetic_batches  # noqa: E402
from data.tokenizer import PAD_ID  # noqa: E402

SIZES = {
    "tiny": {"d_model": 128, "layers": 4, "heads": 4, "d_ff": 256},
    "base": {"d_model": 512, "layers": 6, "heads": 8, "d_ff": 2048},
}


def build(size: str, vocab: int, dropout: float, device: str = "cpu"):
    """(model, optimizer) of the reference for one preset."""
    import torch
    from torch import nn

    dims = SIZES[size]

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            d = dims["d_model"]
            self.scale = math.sqrt(d)
            self.embed = nn.Embedding(vocab, d, padding_idx=PAD_ID)
            nn.init.normal_(self.embed.weight, std=d**-0.5)
            self.transformer = nn.Transformer(d, dims["heads"], dims["layers"], dims["layers"],
                                              dims["d_ff"], dropout, batch_first=True,
                                              norm_first=True)
            for module in self.transformer.modules():  # no attention dropout, as attnmt's presets
                if isinstance(module, nn.MultiheadAttention):
                    module.dropout = 0.0
            position = torch.arange(256, dtype=torch.float32)[:, None]
            inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2) / d)
            table = torch.zeros(256, d)
            table[:, 0::2], table[:, 1::2] = torch.sin(position * inv_freq), torch.cos(position * inv_freq)
            self.register_buffer("positions", table)

        def forward(self, src, tgt_in):
            """src [B, S], tgt_in [B, T] int64 -> logits [B, T, vocab]."""
            s = self.embed(src) * self.scale + self.positions[: src.shape[1]]
            t = self.embed(tgt_in) * self.scale + self.positions[: tgt_in.shape[1]]
            length = tgt_in.shape[1]  # True = masked, the same mask type as the padding masks
            causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=src.device),
                                diagonal=1)
            src_pad, tgt_pad = src == PAD_ID, tgt_in == PAD_ID
            h = self.transformer(s, t, tgt_mask=causal, src_key_padding_mask=src_pad,
                                 tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
                                 tgt_is_causal=True)
            return h @ self.embed.weight.T

    model = Reference().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9,
                                  weight_decay=0.0, fused=device == "cuda")
    return model, optimizer


def run(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batches = synthetic_batches(args.warmup + args.steps, args.batch_tokens, args.vocab_size)
    tensors = [{k: torch.from_numpy(v.astype(np.int64)).to(args.device) for k, v in b.items()}
               for b in batches]
    model, optimizer = build(args.size, args.vocab_size, args.dropout, args.device)
    model.train()
    if args.no_cudnn_attention:  # see the docstring: cuDNN plans each new shape on the host
        torch.backends.cuda.enable_cudnn_sdp(False)
    forward = torch.compile(model, dynamic=True) if args.compile else model
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.amp == "bf16")

    def step(batch) -> torch.Tensor:
        with autocast:
            logits = forward(batch["src"], batch["tgt_in"])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               batch["tgt_out"].reshape(-1), ignore_index=PAD_ID,
                               label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.detach()  # no .item() per step: on a GPU that would sync every step

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    warmup_start = time.perf_counter()
    for batch in tensors[: args.warmup]:
        step(batch)
    sync()
    warmup_s = time.perf_counter() - warmup_start
    measured = batches[args.warmup:]
    start = time.perf_counter()
    for batch in tensors[args.warmup:]:
        last_loss = step(batch)
    sync()
    elapsed = time.perf_counter() - start
    tgt = sum(int(np.count_nonzero(b["tgt_out"])) for b in measured)
    src = sum(int(np.count_nonzero(b["src"])) for b in measured)
    return {
        "framework": f"torch {torch.__version__}",
        "size": args.size,
        "model": {**SIZES[args.size], "dropout": args.dropout, "norm_first": True},
        "threads": args.threads,
        "device": (torch.cuda.get_device_name() if args.device == "cuda" else "cpu"),
        "amp": args.amp,
        "compile": args.compile,
        "cudnn_attention": not args.no_cudnn_attention,
        "warmup_s": warmup_s,
        "vocab_size": args.vocab_size,
        "batch_tokens": args.batch_tokens,
        "steps": len(measured),
        "warmup": args.warmup,
        "step_time_s": elapsed / len(measured),
        "tokens_per_sec": tgt / elapsed,
        "src_tgt_tokens_per_sec": (src + tgt) / elapsed,
        "last_loss": float(last_loss.item()),
        "params": sum(p.numel() for p in model.parameters()),
        "host_cpu": platform.processor() or platform.machine(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--steps", type=int, default=20, help="measured steps [20]")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured first steps [3]")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads [2]")
    parser.add_argument("--batch_tokens", type=int, default=4096, help="[4096]")
    parser.add_argument("--vocab_size", type=int, default=8000, help="[8000]")
    parser.add_argument("--dropout", type=float, default=0.2, help="[0.2, as the tiny preset]")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="[cpu]")
    parser.add_argument("--amp", choices=("none", "bf16"), default="none",
                        help="autocast compute dtype [none: float32]")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--no_cudnn_attention", action="store_true",
                        help="disable the cuDNN backend of scaled_dot_product_attention")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if min(args.steps, args.threads) < 1 or args.warmup < 0:
        parser.error("--steps and --threads must be >= 1, --warmup >= 0")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("error: bench/torch_reference.py needs PyTorch (pip install torch)", file=sys.stderr)
        return 2
    result = run(args)
    print(f"torch nn.Transformer {args.size}, {result['device']}, amp {args.amp}, "
          f"compile {args.compile}, {args.threads} threads: "
          f"{result['tokens_per_sec']:,.0f} target tok/s, "
          f"{result['src_tgt_tokens_per_sec']:,.0f} src+tgt tok/s, "
          f"{result['step_time_s'] * 1e3:.0f} ms/step")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
