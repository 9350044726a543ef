"""What a checkpoint save holds the training loop up (training/checkpoint.save), part by part.

    python -m bench.save_stall [--config configs/multi30k_de_en.py] [--saves 6]
        [--apart_s 0.5] [--variants device_arrays,host_copy] [--flat_optimizer]
        [--profile] [--json OUT]

The config's fresh train state (training/step.create_train_state: the recipe's model and
Adam's moments, both vocabularies `data.vocab_size` entries), on the default device, saved
`--saves` times `--apart_s` seconds apart into a temporary folder, as train.py's Saver saves
it (`check_finite`'s read, then `training/checkpoint.save`). Each save is timed on the
calling thread:

  * `finite_check_s`: `check_finite`, the one scalar read back (every pending step awaited),
  * `save_s`: `training/checkpoint.save`: the state's CRC-32 (`state_checksum`: the whole
    state read to the host), then orbax's `CheckpointManager.save` returning (its
    synchronous part: the device-to-host copy, the step's folders, a previous save still
    writing awaited),
  * `held_s`: the two together, what the loop is held,
  * `checksum_s`: `state_checksum` of the device state alone, called before the save
    (not held: what the checksum costs when it reads the device arrays itself).

Then one more save, waited for at once: `write_s`, the background write that follows
the call (`wait_until_finished`). Each of `--variants` saves into its own folder:
`device_arrays`, the device arrays handed to orbax, which reads each of the state's
arrays to the host itself (and the checksum reads them once more); `host_copy`, the
state read to the host first in one batched `jax.device_get` and that copy checksummed
and saved, as train.py saves (`training/checkpoint.save`'s `host_copy`). With
`--profile`, cProfile's 25 functions of largest cumulative time during the last spaced
save's `save_s` (`profile_top`): where it goes. The recipes' saves come 100 steps apart
over their last 1,000 steps (0.7 s on an H200, ~80 s on the 2-core CPU): `--apart_s`
stands for that. `--flat_optimizer` saves the state of `train.flat_optimizer` instead
(Adam's moments one vector each; `arrays` in the result counts the state's arrays).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish, load_config_file  # noqa: E402

PARTS = ("finite_check_s", "save_s", "held_s", "checksum_s")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/multi30k_de_en.py")
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--apart_s", type=float, default=0.5)
    parser.add_argument("--variants", default="device_arrays,host_copy",
                        help="device_arrays (orbax reads each array), host_copy (the state "
                             "read to the host in one batched transfer, then saved: "
                             "train.py's) [both]")
    parser.add_argument("--flat_optimizer", action="store_true",
                        help="the state of train.flat_optimizer=True")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    if not args.variants or set(args.variants) - {"device_arrays", "host_copy"}:
        parser.error(f"--variants: choose from device_arrays, host_copy (got {args.variants})")
    if args.saves < 1 or args.apart_s < 0:
        parser.error("--saves must be at least 1 and --apart_s at least 0")
    if not Path(args.config).is_file():
        parser.error(f"--config: no such file: {args.config}")
    return args


def profile_top(profiler: cProfile.Profile, n: int = 25) -> list[dict]:
    """The `n` functions of largest cumulative time: [{function, calls, cumulative_s}]."""
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = sorted(stats.stats.items(), key=lambda item: item[1][3], reverse=True)[:n]
    return [{"function": f"{Path(file).name}:{line}({name})", "calls": calls,
             "cumulative_s": round(cumulative, 4)}
            for (file, line, name), (_, calls, _, cumulative, _) in rows]


def time_saves(args: argparse.Namespace, state: dict, host_copy: bool) -> dict:
    """One variant's saves (module docstring) into a fresh folder: the median of each part,
    each save's parts (`runs`), `write_s`, the steps saved and, with --profile,
    `profile_top`. `host_copy`: training/checkpoint.save's own flag."""
    from training import checkpoint as ckpt
    from training.hooks import check_finite

    times: dict[str, list[float]] = {part: [] for part in PARTS}
    profiler = cProfile.Profile() if args.profile else None

    def save(manager, step: int) -> None:
        ckpt.save(manager, step, state, {"step": step}, host_copy=host_copy)

    with tempfile.TemporaryDirectory() as tmp:
        manager = ckpt.make_manager(Path(tmp) / "checkpoints", keep=args.saves + 1)
        for step in range(1, args.saves + 1):
            time.sleep(args.apart_s)
            start = time.perf_counter()
            ckpt.state_checksum(state)
            summed = time.perf_counter()
            check_finite(state, manager)
            finite = time.perf_counter()
            if profiler and step == args.saves:
                profiler.enable()
            save(manager, step)
            if profiler and step == args.saves:
                profiler.disable()
            saved = time.perf_counter()
            for part, seconds in zip(PARTS, (finite - summed, saved - finite, saved - summed,
                                             summed - start), strict=True):
                times[part].append(seconds)
        manager.wait_until_finished()
        time.sleep(args.apart_s)
        save(manager, args.saves + 1)
        start = time.perf_counter()
        manager.wait_until_finished()
        write_s = time.perf_counter() - start
        saved_steps = sorted(manager.all_steps())
    return {**{part: round(statistics.median(values), 6) for part, values in times.items()},
            "write_s": round(write_s, 6), "saved_steps": saved_steps,
            "runs": {part: [round(v, 6) for v in values] for part, values in times.items()},
            **({"profile_top": profile_top(profiler)} if profiler else {})}


def run(args: argparse.Namespace) -> dict:
    import jax

    from bench.matmul_peak import host_cpu
    from training.step import create_train_state

    cfg = load_config_file(args.config)
    cfg.train.flat_optimizer = args.flat_optimizer
    _, state = create_train_state(cfg, cfg.data.vocab_size, cfg.data.vocab_size)
    state = jax.block_until_ready(state)
    leaves = jax.tree.leaves(state)
    variants = {name: time_saves(args, state, host_copy=name == "host_copy")
                for name in args.variants}
    return {"variants": variants, "saves": args.saves, "apart_s": args.apart_s,
            "config": args.config, "flat_optimizer": args.flat_optimizer, "arrays": len(leaves),
            "state_mb": round(sum(x.nbytes for x in leaves) / 2**20, 1),
            "device": str(jax.devices()[0]), "jax_version": jax.__version__,
            "machine": host_cpu(), "time": time.time()}


def print_table(result: dict) -> None:
    print(f"{result['saves']} saves of {result['arrays']} arrays, {result['state_mb']} MB, "
          f"{result['apart_s']} s apart on {result['device']}; median seconds:")
    names = list(result["variants"])
    print(f"  {'':16s} " + " ".join(f"{name:>10s}" for name in names))
    for part in (*PARTS, "write_s"):
        print(f"  {part:16s} " + " ".join(f"{result['variants'][name][part]:10.4f}"
                                           for name in names))
    for name in names:
        for row in result["variants"][name].get("profile_top", [])[:8]:
            print(f"  {name}: {row['cumulative_s']:8.4f} s {row['calls']:6d}  {row['function']}")


if __name__ == "__main__":
    finish(parse_args(), run, print_table)
