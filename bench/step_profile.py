"""Where the train step's time goes, for one batch shape: a profile, not a throughput run.

    python bench/step_profile.py --size base [--dtype bfloat16] [--batch_tokens 4096,32768]
        [--variants nnx,pure,flat,together,stacked] [--seeds 8] [--steps 20]
        [--dropout P] [--trace DIR]
        [--hlo FILE.txt.gz] [--json OUT]

For each `--batch_tokens`, the fullest (most target tokens) of the first 8 Multi30k batches
of the training pipeline (as in bench/train_throughput.py) is fed again and again, so every
program compiles once. The model and train state come from `training.step.create_train_state`
and every step from `make_train_step`, as in train.py; per variant of the train state, derived
from the one `create_train_state` returns:

    nnx        params as an nnx.State of Variables (`nnx.state(model, nnx.Param)`, the
               layout before the train state switched to plain dicts);
    pure       params as plain nested dicts: the state as returned (train.py's layout);
    flat       pure, with `train.flat_optimizer` (training/step.py `flat_adamw`: Adam's
               moments one vector each; 179 arrays instead of 523 for tiny). (Until it
               existed, `pure_flat` wrapped the whole optimizer in `optax.flatten`, the
               clipping included and the decay mask lost.)
    together   `--seeds` N copies of pure, stepped as `train.py --seeds N --together` steps
               them: training/together.py's program (the N states stacked on the device
               from step to step, the step vmapped, each seed with its own dropout key;
               each seed's batch given apart and stacked in the program, the active mask,
               metrics per seed), every seed on the same batch;
    stacked    the vmapped step alone on the same stacked states and a batch stacked
               beforehand: together's cost over stacked is its per-seed inputs and outputs;

it reports `compile_s` (first call), `step_ms` (median of 3 timings of `--steps` steps,
synced once after each) and `dispatch_ms` (host time to issue one step while the device is
still busy: when it is close to `step_ms`, the host is the bottleneck), and
`identity_ms`: time per call of a jitted identity over the same state, donated (flattening
the state, dispatch, building the output tree; no device work): the floor a step pays on
the host for the shape of its state. With `--parts`, the first variant's step is also
timed in parts, each its own program: `forward_ms` (loss), `forward_backward_ms` (loss and
gradient), `optimizer_ms` (clip + AdamW update applied to the parameters).
`--attention_impl`, `--embedding_grad` and `--dropout` override the model config.

`--trace DIR` records 5 steps of each variant and batch size with
`jax.profiler.trace(create_perfetto_trace=True)` and summarises the device activity of
each: kernels per step, device-busy time per step (union of kernel intervals on every
device stream), and the kernels with the most total time; the perfetto JSON stays in DIR.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import write_json  # noqa: E402
from bench.flops import count_matmul_params  # noqa: E402
from bench.matmul_peak import device_info, parse_sizes  # noqa: E402
from bench.train_throughput import (  # noqa: E402
    make_config,
    multi30k_batches,
    shape_of,
)
from bench.train_throughput import parse_args as throughput_args  # noqa: E402
from training.compilation import covered_length  # noqa: E402

VARIANTS = ("nnx", "pure", "flat", "together", "stacked")
SEED_VARIANTS = ("together", "stacked")  # N seeds in one program (--seeds)
MODEL_OVERRIDES = ("attention_impl", "embedding_grad", "vocab_size", "d_model", "num_heads",
                   "d_ff", "layers")


def timed_calls(fn, state, batch, steps: int) -> tuple[object, float, float]:
    """Runs `state = fn(state, batch)` `steps` times, synced once at the end.

    Returns (state, seconds per call, host seconds per call to issue the calls)."""
    import jax

    start = time.perf_counter()
    for _ in range(steps):
        state = fn(state, batch)
    issued = time.perf_counter()
    jax.block_until_ready(state)
    end = time.perf_counter()
    return state, (end - start) / steps, (issued - start) / steps


def setup_variant(graphdef, base: dict, cfg_train, variant: str) -> tuple[dict, object, object]:
    """(train state, jitted train step, its optimizer) of `variant` (module docstring).

    `base` is the state `create_train_state` returned; it is copied, not consumed (the
    step donates its state, and `base` serves every variant)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from training import step as training

    if variant == "flat":
        cfg_train = cfg_train.copy_and_resolve_references()
        cfg_train.flat_optimizer = True
    optimizer = training.build_optimizer(cfg_train)
    state = jax.tree.map(jnp.array, base)
    if variant == "nnx":  # the layout before the train state held plain dicts
        state["params"] = nnx.state(nnx.merge(graphdef, state["params"]), nnx.Param)
    if variant in ("nnx", "flat"):
        state["opt_state"] = optimizer.init(state["params"])
    return state, training.make_train_step(graphdef, cfg_train), optimizer


def setup_seeds(graphdef, base: dict, cfg_train, variant: str, seeds: int,
                batch: dict) -> tuple[object, object, dict]:
    """(state, `(state, batch) -> state`, the batch it takes) of `seeds` copies of the pure
    train state `base` in one program, as `variant` ("together" or "stacked", module
    docstring) runs them; every seed's batch is `batch` (stacked once here for "stacked")."""
    import functools

    import jax
    import jax.numpy as jnp

    from training.step import make_train_step
    from training.together import _stack, _together

    step_fn = make_train_step(graphdef, cfg_train, jit=False)
    keys = jnp.stack([jax.random.key(k) for k in range(seeds)])
    state = _stack((base,) * seeds)  # new arrays: `base` serves the other variants
    if variant == "together":
        program = jax.jit(functools.partial(_together, step_fn), donate_argnums=0)
        active = jnp.ones(seeds, bool)
        return state, lambda s, b: program(s, (b,) * seeds, None, keys, active)[0], batch
    program = jax.jit(jax.vmap(step_fn), donate_argnums=0)
    return state, lambda s, b: program(s, b, None, keys)[0], _stack((batch,) * seeds)


def trace_summary(trace_dir: Path, steps: int, top: int = 15) -> dict:
    """Device kernels of the newest perfetto trace under `trace_dir` (see docstring)."""
    path = max(trace_dir.glob("plugins/profile/*/perfetto_trace.json.gz"),
               key=lambda p: p.stat().st_mtime)
    with gzip.open(path) as file:
        events = json.load(file)["traceEvents"]
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
               and "/device:" in e["args"]["name"]}
    kernels = [e for e in events if e.get("ph") == "X" and e["pid"] in devices]
    if not kernels:
        return {"trace": str(path), "device_events": 0}
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(e["dur"])
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    busy = covered_length(spans)
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "trace": str(path),
        "kernels_per_step": len(kernels) / steps,
        "device_busy_ms_per_step": busy / steps / 1e3,
        "device_span_ms_per_step": wall / steps / 1e3,
        "kernel_ms_per_step": sum(e["dur"] for e in kernels) / steps / 1e3,
        "top_kernels": [{"name": name[:120], "calls_per_step": len(d) / steps,
                         "ms_per_step": sum(d) / steps / 1e3} for name, d in ranked],
    }


def part_programs(graphdef, cfg_train, state, batch, optimizer=None) -> dict[str, tuple]:
    """{name: (jitted fn, its arguments)} for the parts of the train step, each its own
    program: "forward" (the loss), "forward+backward" (`value_and_grad` of it) and
    "optimizer" (the update applied to the parameters; `optimizer` defaults to
    `build_optimizer(cfg_train)`, the train step's). Also used by bench/compile_profile.py."""
    import jax
    import optax
    from flax import nnx

    from training.step import batch_loss, build_optimizer

    key = jax.random.key(0)
    optimizer = build_optimizer(cfg_train) if optimizer is None else optimizer

    def loss(params, b):
        return batch_loss(nnx.merge(graphdef, params), b, cfg_train.label_smoothing, key)[0]

    def update(opt_state, params, grads):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return opt_state, optax.apply_updates(params, updates)

    params = state["params"]
    grads = jax.tree.map(lambda x: x * 1e-3, params)
    return {
        "forward": (jax.jit(loss), (params, batch)),
        "forward+backward": (jax.jit(jax.value_and_grad(loss)), (params, batch)),
        "optimizer": (jax.jit(update), (state["opt_state"], params, grads)),
    }


def time_program(fn, args: tuple, steps: int) -> float:
    """Seconds per call of `fn(*args)` after a first (compiling) call, synced at the end."""
    import jax

    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(steps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / steps


def profile(args: argparse.Namespace) -> dict:
    """Every measurement of the module docstring; returns the JSON result."""
    import jax
    from flax import nnx

    from data.batching import padding_fraction
    from training.distributed import make_mesh, shard_batch
    from training.step import create_train_state

    mesh = make_mesh()
    rows = []
    result = {"size": args.size, "dtype": args.dtype, "steps": args.steps, "rows": rows,
              **device_info()}
    for index, batch_tokens in enumerate(args.batch_tokens):
        overrides = [f"--{key}={getattr(args, key)}" for key in MODEL_OVERRIDES
                     if getattr(args, key) is not None]
        cfg = make_config(throughput_args(["--size", args.size, "--dtype", args.dtype,
                                           "--batch_tokens", str(batch_tokens), *overrides]))
        cfg.model.dropout = args.dropout if args.dropout is not None else cfg.model.dropout
        candidates, vocab, _ = multi30k_batches(cfg, 8, args.cache_dir, mesh.size)
        # The fullest of the first 8 batches: a bucket's last batch can be mostly pad rows.
        host_batch = max(candidates, key=lambda b: int((b["tgt_out"] != 0).sum()))
        graphdef, base = create_train_state(cfg, vocab, vocab, mesh)
        counter = count_matmul_params(nnx.merge(graphdef, base["params"]))
        model_gflop = counter.batch_flops(host_batch)[0] / 1e9
        for variant in args.variants:
            seeds, step, batch = 1, None, shard_batch(host_batch, mesh)
            if variant in SEED_VARIANTS:
                seeds = args.seeds
                state, fn, batch = setup_seeds(graphdef, base, cfg.train, variant, seeds, batch)
            else:
                state, step, optimizer = setup_variant(graphdef, base, cfg.train, variant)
                fn = lambda s, b, step=step: step(s, b)[0]  # noqa: E731
            row = {"batch_tokens": batch_tokens, "shape": "x".join(map(str, shape_of(host_batch))),
                   "variant": variant, "seeds": seeds, "dropout": cfg.model.dropout,
                   "attention_impl": cfg.model.attention_impl,
                   "embedding_grad": cfg.model.embedding_grad,
                   "padding_fraction": padding_fraction([host_batch]),
                   "model_gflop_per_step": model_gflop * seeds}
            start = time.perf_counter()
            state = jax.block_until_ready(fn(state, batch))
            row["compile_s"] = time.perf_counter() - start
            timings = []
            for _ in range(3):
                state, per_step, dispatch = timed_calls(fn, state, batch, args.steps)
                timings.append((per_step, dispatch))
            row["step_ms"] = statistics.median(t for t, _ in timings) * 1e3
            row["dispatch_ms"] = statistics.median(d for _, d in timings) * 1e3
            row["tflops_per_sec"] = row["model_gflop_per_step"] / row["step_ms"]
            identity = jax.jit(lambda s, b: s, donate_argnums=0)
            state = jax.block_until_ready(identity(state, batch))
            state, identity_s, _ = timed_calls(identity, state, batch, args.steps)
            row["identity_ms"] = identity_s * 1e3
            if args.hlo and index == 0 and variant == args.variants[0] and step is not None:
                hlo = step.lower(state, batch).compile().as_text()
                args.hlo.parent.mkdir(parents=True, exist_ok=True)
                with gzip.open(args.hlo, "wt") as file:
                    file.write(hlo)
            if args.trace:
                with jax.profiler.trace(str(args.trace), create_perfetto_trace=True):
                    state, _, _ = timed_calls(fn, state, batch, 5)
                row["trace"] = trace_summary(args.trace, 5)
            if args.parts and variant == args.variants[0] and step is not None:
                programs = part_programs(graphdef, cfg.train, state, batch, optimizer)
                for name, (program, program_args) in programs.items():
                    row[f"{name.replace('+', '_')}_ms"] = (
                        time_program(program, program_args, args.steps) * 1e3)
                del programs
            del state
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
            if args.json:
                write_json(args.json, result)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "base"), required=True)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--batch_tokens", type=parse_sizes, default=(4096,), help="[4096]")
    parser.add_argument("--variants", type=lambda t: t.split(","),
                        default=[v for v in VARIANTS if v not in SEED_VARIANTS],
                        help=f"of {','.join(VARIANTS)} [those of one seed]")
    parser.add_argument("--seeds", type=int, default=8, help="seeds of together / stacked [8]")
    parser.add_argument("--steps", type=int, default=20, help="[20]")
    parser.add_argument("--trace", type=Path, help="record and summarise a profiler trace here")
    parser.add_argument("--dropout", type=float, help="override model.dropout [0.2]")
    parser.add_argument("--attention_impl", choices=("auto", "xla", "cudnn"))
    parser.add_argument("--embedding_grad", choices=("auto", "scatter", "one_hot"))
    for key in ("vocab_size", "d_model", "num_heads", "d_ff", "layers"):  # quick checks only
        parser.add_argument(f"--{key}", type=int, help="as in bench/train_throughput.py")
    parser.add_argument("--parts", action="store_true",
                        help="also time forward, forward+backward and optimizer alone")
    parser.add_argument("--hlo", type=Path, help="write the compiled step's HLO (.txt.gz) here")
    parser.add_argument("--cache_dir", type=Path,
                        default=Path.home() / ".cache" / "attnmt" / "bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    return args


def main(argv: list[str] | None = None) -> None:
    result = profile(parse_args(argv))
    print(f"device: {result['device']}")
    for row in result["rows"]:
        parts = " ".join(f"{k[:-3]} {row[k]:.2f}" for k in ("forward_ms", "forward_backward_ms",
                                                              "optimizer_ms") if k in row)
        print(f"{row['batch_tokens']:>6} {row['shape']:>11} {row['variant']:>9} x{row['seeds']}: step "
              f"{row['step_ms']:.2f} ms (dispatch {row['dispatch_ms']:.2f}, identity "
              f"{row['identity_ms']:.2f}), {row['tflops_per_sec']:.1f} TFLOP/s, compile "
              f"{row['compile_s']:.1f} s {parts}")


if __name__ == "__main__":
    main()
