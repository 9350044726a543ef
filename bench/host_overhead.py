"""The host's share of a training step: train.py's real loop against the bare jitted step,
on a micro model whose compute is negligible (what is left is the loop's own cost).

    python -m bench.host_overhead [--steps 300] [--profile] [--json results/bench/host_overhead.json]

1. loop: `train.train` (train.py's Python API: batcher, prefetch thread, packing as
   configured, progress bar, metrics.jsonl / TensorBoard, the periodic hooks) on
   configs/smoke.py's data with a micro model (d_model 16, 1+1 layers, 2 heads, d_ff
   32), logging every `--log_every` steps and validating / saving only at the end.
   `loop_ms_per_step` = wall time between the train events of steps `--log_every` and
   `--log_every + --steps` (each written after its metrics reached the host, so each is
   a sync point), less the compile seconds logged in between (a bucket shape seen for
   the first time), over `--steps`.
2. bare: the same config's train step (training/step.py `make_train_step`) on the first
   `--steps` batches of the same pipeline (bench/train_throughput.py `multi30k_batches`),
   placed on the device beforehand, every shape compiled before timing; one sync at the
   end: `bare_ms_per_step`.
`ratio` = loop / bare (1.0 = the loop costs nothing over its steps). `--repeat N` measures
both N times, alternating (this CPU's speed drifts by +-20% between runs), and reports
the medians, every run kept in `runs`. `--profile` runs the loop under cProfile (which
slows it: use it to see where the time goes, not for the ratio) and keeps the functions
with the most own time (`profile_top`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import tempfile
import time
from pathlib import Path


def micro_config(log_every: int, steps: int):
    """configs/smoke.py with a micro model; logs every `log_every`, validates at the end."""
    from configs import smoke

    cfg = smoke.get_config()
    cfg.model.d_model, cfg.model.num_heads, cfg.model.d_ff = 16, 2, 32
    cfg.model.num_encoder_layers = cfg.model.num_decoder_layers = 1
    cfg.train.num_steps = log_every + steps
    cfg.train.log_every_steps = log_every
    cfg.eval.every_steps = 0  # only after the last step (outside the measured window)
    cfg.checkpoint.every_steps = log_every + steps  # only at the end
    cfg.attention_maps.enabled = False
    return cfg


def loop_ms_per_step(cfg, workdir: Path, log_every: int, steps: int,
                     profile: bool) -> tuple[float, list[str]]:
    """(ms per step of train.py's loop over the window, the profile's top lines or [])."""
    import train

    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    code = train.train(cfg, workdir)
    if profiler:
        profiler.disable()
    if code:
        raise SystemExit(f"train.train exited with {code}")
    events = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train_events = {e["step"]: e for e in events if e["split"] == "train"}
    first, last = train_events[log_every], train_events[log_every + steps]
    compiling = last["compile_seconds"] - first["compile_seconds"]
    ms = 1000 * (last["time"] - first["time"] - compiling) / steps
    top: list[str] = []
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
        top = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()][-16:]
    return ms, top


def bare_ms_per_step(cfg, steps: int, cache_dir: Path) -> float:
    """ms per step of the jitted train step alone on pre-placed batches (module docstring)."""
    import jax

    from bench.train_throughput import multi30k_batches
    from training.distributed import make_mesh, shard_batch
    from training.step import create_train_state, make_train_step

    mesh = make_mesh()
    batches, vocab, _ = multi30k_batches(cfg, steps, cache_dir, mesh.size)
    graphdef, state = create_train_state(cfg, vocab, vocab, mesh)
    step = make_train_step(graphdef, cfg.train)
    placed = [shard_batch(b, mesh) for b in batches]
    seen = set()
    for batch in placed:  # compile every shape first
        shape = tuple(v.shape for v in batch.values())
        if shape not in seen:
            seen.add(shape)
            state, metrics = step(state, batch)
    jax.block_until_ready(state)
    start = time.perf_counter()
    for batch in placed:
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    return 1000 * (time.perf_counter() - start) / steps


def run(args: argparse.Namespace) -> dict:
    import statistics

    import jax

    cfg = micro_config(args.log_every, args.steps)
    runs, top = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            cfg.data.cache_dir = str(Path(tmp) / "data_cache")
            loop, top = loop_ms_per_step(cfg, Path(tmp) / "run", args.log_every, args.steps,
                                         args.profile)
            bare = bare_ms_per_step(cfg, args.steps, Path(tmp) / "bench_cache")
        runs.append({"loop_ms_per_step": loop, "bare_ms_per_step": bare, "ratio": loop / bare})
    return {**{key: statistics.median(r[key] for r in runs)
               for key in ("loop_ms_per_step", "bare_ms_per_step", "ratio")},
            "runs": runs, "steps": args.steps, "batch_tokens": cfg.train.batch_tokens,
            "model": "d_model 16, 1+1 layers, 2 heads, d_ff 32, vocab 200",
            "pack_length": cfg.data.pack_length, "profiled": args.profile, "profile_top": top,
            "device": str(jax.devices()[0].device_kind), "cpu": platform.processor() or
            platform.machine(), "time": time.time()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log_every", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args)
    for r in result["runs"]:
        print(f"loop {r['loop_ms_per_step']:.2f} ms/step, bare {r['bare_ms_per_step']:.2f} "
              f"ms/step, ratio {r['ratio']:.2f}")
    print(f"median: loop {result['loop_ms_per_step']:.2f}, bare {result['bare_ms_per_step']:.2f}, "
          f"ratio {result['ratio']:.2f}")
    for line in result["profile_top"]:
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
