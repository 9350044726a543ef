"""Where the compile time of one train step goes, for one batch shape.

    python bench/compile_profile.py --size tiny|base [--layers L] [--json OUT]

Takes bench/train_throughput.py's options (model presets and overrides, --vocab_size,
--cache_dir; its timing options are ignored) and its first Multi30k batch (the project's
own pipeline), sets up the run as train.py does (`training.step.create_train_state`,
`make_train_step`), and compiles, each from scratch and timed on its own:

  * `trace+lower`: tracing the full train step to StableHLO (`jit(...).lower`);
  * `step`: XLA compiling that full step (forward, backward, AdamW, non-finite guard);
  * `forward`, `forward+backward`, `optimizer`: the loss alone, `value_and_grad` of it,
    and the AdamW update alone, as separate programs (`bench.step_profile.part_programs`;
    their sum exceeds `step`: XLA shares work inside one program);

with the number of instructions of each optimized HLO module. Set XLA_FLAGS to compare
compiler options. The persistent compilation cache is switched off, so every compile is
a real one even where the environment sets JAX_COMPILATION_CACHE_DIR.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import write_json  # noqa: E402
from bench.step_profile import part_programs  # noqa: E402
from bench.train_throughput import make_config, multi30k_batches, parse_args  # noqa: E402

PARTS = ("trace+lower", "step", "forward", "forward+backward", "optimizer")


def timed_compile(lowered) -> tuple[float, int]:
    """(seconds XLA takes to compile `lowered`, instructions in the optimized HLO)."""
    start = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    text = compiled.as_text()
    return seconds, sum(1 for line in text.splitlines() if " = " in line)


def run(args: argparse.Namespace) -> dict:
    """Compile the step and its parts once each; returns {part: {"seconds", "hlo_instructions"}}."""
    import jax

    from training.distributed import make_mesh, shard_batch
    from training.step import create_train_state, make_train_step

    jax.config.update("jax_enable_compilation_cache", False)
    cfg = make_config(args)
    mesh = make_mesh()
    batches, vocab, _ = multi30k_batches(cfg, 1, args.cache_dir, mesh.size)
    graphdef, state = create_train_state(cfg, vocab, vocab, mesh)
    batch = shard_batch(batches[0], mesh)

    result = {"size": args.size or "config", "layers": cfg.model.num_encoder_layers,
              "shape": "x".join(map(str, (*batches[0]["src"].shape, batches[0]["tgt_out"].shape[1]))),
              "state_arrays": len(jax.tree.leaves(state)), "backend": jax.default_backend()}
    start = time.perf_counter()
    lowered = make_train_step(graphdef, cfg.train).lower(state, batch)
    result["trace+lower"] = {"seconds": time.perf_counter() - start, "hlo_instructions": None}
    parts = {"step": lowered}
    for name, (program, program_args) in part_programs(graphdef, cfg.train, state, batch).items():
        parts[name] = program.lower(*program_args)
    for name, part in parts.items():
        seconds, instructions = timed_compile(part)
        result[name] = {"seconds": seconds, "hlo_instructions": instructions}
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, description=__doc__.split("\n\n")[0])
    result = run(args)
    print(f"{args.size}, {result['layers']}+{result['layers']} layers, batch {result['shape']}, "
          f"{result['state_arrays']} state arrays, {result['backend']}")
    for name in PARTS:
        count = result[name]["hlo_instructions"]
        print(f"  {name:<18} {result[name]['seconds']:7.2f} s"
              + ("" if count is None else f"   {count:>7,} HLO instructions"))
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
