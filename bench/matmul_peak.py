"""The machine's dense matmul peak, measured: the denominator of model-FLOPs utilisation.

    python bench/matmul_peak.py [--sizes 1024,2048,4096] [--repeats 5]
                                [--dtypes float32,bfloat16] [--json OUT]

For each dtype and each square size n, a jitted `a @ b` on [n, n] operands (standard
normal, generated on the device) is compiled and run once, then timed `--repeats` times;
each timing runs the matmul back to back enough times to last >= `min_seconds`, with
`jax.block_until_ready` only at the end of the timing. A matmul counts 2·n³ FLOPs. The
peak is the best GFLOP/s over every size and repeat.

Matmuls use JAX's default precision, as the model does (on NVIDIA GPUs since Ampere that
lets float32 matmuls run as TF32; on CPU float32 is exact float32). bfloat16 is measured
where it is supported; on CPUs without native bf16 units XLA may emulate it, which is
slow but still reported (that is what a bf16 model would get there).

`measure_peak(dtype)` is what `train_throughput.py` and `decode_speed.py` call.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

DEFAULT_SIZES = (1024, 2048, 4096)


def matmul_gflops(n: int, dtype: str = "float32", repeats: int = 5,
                  min_seconds: float = 0.2) -> float:
    """Best GFLOP/s of a jitted [n, n] @ [n, n] matmul in `dtype` over `repeats` timings."""
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(key_b, (n, n), jnp.float32).astype(dtype)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, b))  # compile + first run

    start = time.perf_counter()
    jax.block_until_ready(matmul(a, b))
    single = max(time.perf_counter() - start, 1e-9)
    calls = max(1, math.ceil(min_seconds / single))

    # Outputs stay alive until synced; bound them to ~512 MiB (one sync per chunk).
    live = max(1, (512 << 20) // (n * n * jnp.dtype(dtype).itemsize))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        outs = []
        for _ in range(calls):
            outs.append(matmul(a, b))
            if len(outs) == live:
                jax.block_until_ready(outs)
                outs = []
        jax.block_until_ready(outs)
        best = min(best, (time.perf_counter() - start) / calls)
    return 2.0 * n**3 / best / 1e9


def measure_peak_by_size(dtype: str = "float32", sizes: tuple[int, ...] = DEFAULT_SIZES,
                         repeats: int = 5) -> dict[int, float | None]:
    """GFLOP/s per size; None for a size that failed (e.g. out of memory, unsupported dtype)."""
    result: dict[int, float | None] = {}
    for n in sizes:
        try:
            result[n] = matmul_gflops(n, dtype, repeats)
        except Exception as err:  # noqa: BLE001 - reported, never fatal for a benchmark
            print(f"matmul_peak: {dtype} n={n} failed: {type(err).__name__}: {err}",
                  file=sys.stderr)
            result[n] = None
    return result


def measure_peak(dtype: str = "float32", sizes: tuple[int, ...] = DEFAULT_SIZES,
                 repeats: int = 5) -> float | None:
    """The peak in GFLOP/s: the best of `measure_peak_by_size`; None if every size failed."""
    values = [v for v in measure_peak_by_size(dtype, sizes, repeats).values() if v is not None]
    return max(values) if values else None


PEAK_DTYPES = ("float32", "bfloat16")


def measure_peaks(sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = 5,
                  dtypes: tuple[str, ...] = PEAK_DTYPES) -> dict[str, float | None]:
    """`measure_peak` for each dtype (float32 and bfloat16 by default): {dtype: GFLOP/s}."""
    return {dtype: measure_peak(dtype, sizes, repeats) for dtype in dtypes}


def device_info() -> dict:
    """The first device's kind and platform, the device count and the JAX version."""
    device = jax.devices()[0]
    return {"device": f"{device.device_kind} / {device.platform}",
            "device_count": jax.device_count(), "jax_version": jax.__version__,
            "host_cpu": host_cpu(), "host_cpu_count": os.cpu_count()}


def host_cpu() -> str:
    """The host CPU's model name (Linux /proc/cpuinfo; platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_sizes(text: str) -> tuple[int, ...]:
    """'1024,2048' -> (1024, 2048)."""
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive integers, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES,
                        help="square matrix sizes, comma-separated [1024,2048,4096]")
    parser.add_argument("--repeats", type=int, default=5, help="timings per size [5]")
    parser.add_argument("--dtypes", default=",".join(PEAK_DTYPES),
                        help="comma-separated dtypes [float32,bfloat16]")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)

    result: dict = {**device_info(), "sizes": list(args.sizes), "repeats": args.repeats,
                    "precision": "default", "flops_per_matmul": "2 * n**3", "peaks": {}}
    print(f"{'dtype':<10} {'n':>6} {'GFLOP/s':>10}")
    for dtype in args.dtypes.split(","):
        by_size = measure_peak_by_size(dtype, args.sizes, args.repeats)
        for n, value in by_size.items():
            print(f"{dtype:<10} {n:>6} {'failed' if value is None else f'{value:10.1f}':>10}")
        values = [v for v in by_size.values() if v is not None]
        result["peaks"][dtype] = {"peak_gflops": max(values) if values else None,
                                  "by_size": {str(n): v for n, v in by_size.items()}}
    result["peak_gflops"] = result["peaks"].get("float32", {}).get("peak_gflops")
    for dtype, peak in result["peaks"].items():
        print(f"peak {dtype}: {peak['peak_gflops']} GFLOP/s on {result['device']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
