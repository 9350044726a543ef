"""What a lent GPU window is spent on, in priority order, within one deadline (run through
scripts/gpu_window.sh, which prepares the machine first):

  1. recipe: the tiny recipe (configs/multi30k_de_en.py) from launch to its last step.
     A short warm-up run (`--recipe_warmup_steps`, default 50, and a validation, in a
     scratch workdir) fills the persistent compilation cache first, so the measured run
     is a relaunch that finds its programs compiled; both are timed (0: no warm-up, the
     measured run is a fresh machine's first launch). A measured run cut by the deadline
     is projected to its last step at its steady ms/step.
  2. seeds: one seed, then `--seeds N --together` (default 8), both for `--seed_steps`
     on one packed batch shape (`--seeds_override`, default the recipe's own packing:
     with padded buckets the seeds' batches differ in shape at a step, and each (shape,
     group of seeds) is a program to compile; bench/README.md, "A lent H200 window"):
     ms per step of each between two train logs after warm-up (no validation between);
     then two one-seed runs side by side (two processes), timed over the span they share.
  3. saves: bench/save_stall.py on the recipe's train state: what a checkpoint save holds
     the loop up, in parts (the finite check, the checksum, orbax's call), the background
     write after it, and cProfile's view of one save; then the same in
     `train.flat_optimizer`'s layout (179 arrays instead of 523: `gpu_save_stall_flat.json`).
  4. compile: the recipe's train.py for `--compile_steps` steps (one validation, no
     saves but the last) once per `--compile_variant NAME=FLAGS`, each FLAGS added to
     XLA_FLAGS, each with an empty compilation cache of its own: what XLA's settings do
     to a cold launch's compile seconds and to the steps after it (default: the
     window's own flags, autotuning off, against XLA's defaults).
  5. profile: bench/step_profile.py on the recipe's model (tiny) at 4,096 tokens: step
     against dispatch time and the device-busy time of a trace (host- or device-bound),
     for each of `--profile_variants` (default `pure,flat`: one seed, its optimizer per
     array and `train.flat_optimizer`; `stacked` and `together` step `--seeds` seeds as
     one program).
  6. peer: bench/gpu_peer.py, the base model in bf16 against PyTorch (its own JSON).
  7. sweep: scripts/sweep.py on a plan with the minutes left, going on from the earlier
     windows' results committed in `results/sweep/<plan>/` (`--sweep_earlier`), two runs
     side by side where the seeds phase found that two processes pay (`--sweep_parallel
     auto`: each at most 1.5 times as slow as one alone), else one at a time: each
     run's results, metrics and (for a distillation teacher) its translation of the
     training split come back; checkpoints only with --sweep_pack (a lent machine hands
     back 64 MiB: about two seeds' checkpoints).

    python scripts/gpu_window.py [--phases recipe,seeds,saves,compile,profile,peer,sweep]
        [--deadline_s 570] [--results $OUT/results/bench] [--work /tmp/gpu_window]
        [--plan PLAN.toml]

Writes `<results>/gpu_tiny_recipe_time_to_result.json`, `gpu_seeds_together.json`,
`gpu_save_stall.json`, `gpu_compile_variants.json`, `gpu_step_profile_tiny.json` and (bench/gpu_peer.py)
`gpu_peer*.json`, each naming the device, and the measured runs' metrics.jsonl in
`<results>/../runs/`; the sweep trains and collects in `runs/gpu_window/` of the
repository (`--sweep_runs`, `--sweep_out`: ignored folders, which a warm lent machine
keeps between calls, so a later call's sweep skips the runs done and resumes the one cut
off), and its results are copied to `<results>/../sweep/<plan>` at the end: unpacked over
the repository, they land where the next window's sweep reads them. A phase that does not
fit in the time left is skipped. On a CPU, `--config configs/smoke.py` with a few steps
tries the recipe and seeds phases (tests/test_gpu_window.py). The phases run in the
order `--phases` names them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each phase, and the seconds it needs left before the deadline to start.
PHASES = {"recipe": 0, "seeds": 60, "saves": 45, "compile": 60, "profile": 90, "peer": 120,
          "sweep": 150}
# `--compile_variant`'s default: the flags scripts/device_env.sh gives every run (no GEMM
# autotuning: it compiled dozens of kernel variants a shape), against XLA's own defaults.
COMPILE_VARIANTS = ["window=",
                    "xla_defaults=--xla_gpu_autotune_level=4 --xla_gpu_enable_triton_gemm=true"]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))
from sweep import run_process, write_json  # noqa: E402

from bench.validation_ahead import validation_hook_seconds  # noqa: E402  (standard library only)


def device_name() -> str:
    """The accelerator as JAX and nvidia-smi name it (one child process: this driver
    does not import JAX, so it never holds the GPU's memory)."""
    code = "import jax; d = jax.devices()[0]; print(f'{d.device_kind} / {d.platform} x{jax.device_count()}')"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    name = found.stdout.strip() or f"unknown ({found.stderr.strip()[-200:]})"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True)
        name += f" ({smi.stdout.strip()})" if smi.returncode == 0 else ""
    except OSError:
        pass
    return name


def events(workdir: Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def steady_ms_per_step(workdir: Path, after: int = 100) -> float | None:
    """ms per step between the first train log at or past step `after` and the last one,
    over windows with no validation inside (its decoding is not a step's cost; a
    validation at step v is in the window that ends at v, whose log runs after it)."""
    log = events(workdir)
    valid_steps = {e["step"] for e in log if e["split"] == "valid"}
    train = [e for e in log if e["split"] == "train" and e["step"] >= after]
    seconds, steps = 0.0, 0
    for a, b in zip(train, train[1:], strict=False):
        if not any(a["step"] < v <= b["step"] for v in valid_steps):
            seconds += b["time"] - a["time"]
            steps += b["step"] - a["step"]
    return 1000 * seconds / steps if steps else None


def run_figures(workdir: Path, after: int) -> dict:
    """A measured train.py run's figures from its metrics.jsonl: its compile seconds, steady
    ms a step past step `after`, validation BLEU, each validation's hold on training and
    its parts (loss, decoding, maps), and each hook's seconds summed."""
    log = events(workdir)
    valid = [e for e in log if e["split"] == "valid"]
    return {"compile_seconds": last_compile_seconds(workdir),
            "ms_per_step_steady": steady_ms_per_step(workdir, after=after),
            "valid_bleu": {str(e["step"]): e.get("bleu") for e in valid},
            "validation_hook_s": validation_hook_seconds(log),
            "validation_parts_s": {str(e["step"]): {k: e.get(f"seconds_{k}")
                                                    for k in ("loss", "decode", "maps")}
                                   for e in valid},
            "seconds_in_hooks": hook_seconds([e for e in log if e["split"] == "train"])}


def hook_seconds(train: list[dict]) -> dict[str, float]:
    """Each hook's wall seconds over a run's train events (`seconds_in_<hook>`: saves,
    validations, logs; the last event holds the end's validation and save)."""
    totals: dict[str, float] = {}
    for event in train:
        for key, value in event.items():
            if key.startswith("seconds_in_"):
                name = key[len("seconds_in_"):]
                totals[name] = round(totals.get(name, 0.0) + value, 2)
    return totals


def overlap_ms_per_step(workdirs: list[Path], after: int = 100) -> list[float | None]:
    """Each run's ms per step while all of them were stepping (past step `after`): between
    its first and last train log inside the span they share (runs side by side start
    and end apart: their lone steps are not the shared cost)."""
    logs = [[e for e in events(w) if e["split"] == "train" and e["step"] >= after]
            for w in workdirs]
    if not all(logs):
        return [None] * len(workdirs)
    begin, end = max(log[0]["time"] for log in logs), min(log[-1]["time"] for log in logs)
    result = []
    for log in logs:
        inside = [e for e in log if begin <= e["time"] <= end]
        steps = inside[-1]["step"] - inside[0]["step"] if len(inside) > 1 else 0
        result.append(1000 * (inside[-1]["time"] - inside[0]["time"]) / steps if steps else None)
    return result


def train_argv(config: str, workdir: Path, overrides: list[str], *more: str) -> list[str]:
    return [sys.executable, "train.py", "--config", config, "--workdir", str(workdir),
            *overrides, *more]


def phase_recipe(args, left) -> dict:
    """Warm-up (fills the compilation cache), then the measured launch to the last step."""
    work = args.work / "recipe"
    result = {"config": args.config, "overrides": args.override, "warmup": None}
    if args.recipe_warmup_steps:
        steps = args.recipe_warmup_steps
        warm = train_argv(args.config, work / "warmup", args.override,
                          f"--config.train.num_steps={steps}", f"--config.eval.every_steps={steps}",
                          "--config.checkpoint.every_steps=100000")
        start = time.time()
        code, cut = run_process(warm, args.work / "recipe_warmup.log", left())
        result["warmup"] = {"command": " ".join(warm[1:]), "exit_code": code, "cut": cut,
                            "wall_seconds": round(time.time() - start, 1),
                            "compile_seconds": last_compile_seconds(work / "warmup")}
    measured = train_argv(args.config, work / "run", args.override)
    start = time.time()
    code, cut = run_process(measured, args.work / "recipe_run.log", left())
    wall = time.time() - start
    keep_metrics(args, work / "run", "recipe_run")
    train = [e for e in events(work / "run") if e["split"] == "train"]
    last = train[-1]["step"] if train else 0
    figures = run_figures(work / "run", args.log_every)
    ms = figures["ms_per_step_steady"]
    target = args.steps
    result["run"] = {
        "command": " ".join(measured[1:]), "exit_code": code,
        "stopped_by": "deadline (SIGINT; saved)" if cut else "end of training",
        "launch_to_exit_s": round(wall, 1), "last_step": last, "num_steps_target": target,
        **figures,
        "launch_to_last_step_s": round(wall, 1) if last >= target else (
            round(wall + (target - last) * ms / 1000, 1) if ms else None),
        "projected": last < target}
    return result


def phase_seeds(args, left) -> dict:
    """One seed, then `--seeds N --together`, then two one-seed runs side by side (two
    processes: what the sweep's `--parallel` does), each for --seed_steps steps on the same
    config and overrides; ms per (all-seeds) step of each."""
    def run(name: str, *more: str) -> tuple[dict, list[Path]]:
        parent = args.work / name
        argv = train_argv(args.config, parent, [*args.override, *args.seeds_override],
                          f"--config.train.num_steps={args.seed_steps}",
                          "--config.eval.every_steps=0", "--config.eval.max_sentences=8",
                          "--config.eval.beam_size=1", "--config.checkpoint.every_steps=100000",
                          # No save inside the timed span: a recipe's last saves
                          # (checkpoint.last_every_steps) would fall in every log interval.
                          "--config.checkpoint.last_every_steps=0",
                          "--config.attention_maps.enabled=False",
                          f"--config.train.log_every_steps={args.log_every}", *more)
        start = time.time()
        code, cut = run_process(argv, args.work / f"{name}.log", left())
        workdirs = [parent / f"seed{k}" for k in range(args.seeds)] if more else [parent]
        return {"command": " ".join(argv[1:]), "exit_code": code, "cut": cut,
                "wall_seconds": round(time.time() - start, 1),
                "compile_seconds": last_compile_seconds(workdirs[0])}, workdirs

    one, (one_dir,) = run("one_seed")
    keep_metrics(args, one_dir, "seeds_one")
    together, dirs = run("seeds", "--seeds", str(args.seeds), "--together")
    for k, workdir in enumerate(dirs):
        keep_metrics(args, workdir, f"seeds_together_seed{k}")
    one_ms = steady_ms_per_step(one_dir, after=args.log_every)
    per_seed = [steady_ms_per_step(workdir, after=args.log_every) for workdir in dirs]
    together_ms = None if None in per_seed else max(per_seed)
    with ThreadPoolExecutor(2) as pool:
        sides = list(pool.map(run, ("side_by_side_a", "side_by_side_b")))
    side_ms = overlap_ms_per_step([dirs[0] for _, dirs in sides], after=args.log_every)
    sides_ms = None if None in side_ms else max(side_ms)
    return {"seeds": args.seeds, "steps": args.seed_steps, "overrides": args.seeds_override,
            "one_seed": {**one, "ms_per_step": one_ms},
            "together": {**together, "ms_per_step": together_ms,
                         "ms_per_step_by_seed": per_seed},
            "ratio_together_to_one": round(together_ms / one_ms, 3)
            if together_ms and one_ms else None,
            "target_ratio": 2.0,
            "two_processes": {"runs": [side for side, _ in sides], "ms_per_step": side_ms},
            "ratio_two_processes_to_one": round(sides_ms / one_ms, 3)
            if sides_ms and one_ms else None}


def sweep_parallel(choice: str, seeds: dict | None) -> int:
    """--sweep_parallel: a number, or "auto": 2 when two processes side by side each
    stepped at most 1.5 times as slowly as one alone in this window's seeds phase (so
    two runs at once do at least 4/3 of the work), else 1."""
    if choice != "auto":
        return int(choice)
    ratio = (seeds or {}).get("ratio_two_processes_to_one")
    return 2 if ratio is not None and ratio <= 1.5 else 1


def sweep_argv(args, seconds: float, parallel: int) -> list[str]:
    """scripts/sweep.py's command: the plan's runs (`--sweep_only` variants), in `seconds`."""
    return [sys.executable, "scripts/sweep.py", args.plan, "--runs", str(args.sweep_runs),
            "--out", str(args.sweep_out), "--deadline_minutes", f"{seconds / 60:.2f}",
            "--parallel", str(parallel),
            *(["--only", args.sweep_only] if args.sweep_only else []),
            *(["--pack"] if args.sweep_pack else []),
            *(["--earlier", str(args.sweep_earlier)] if args.sweep_earlier.is_dir() else [])]


def phase_saves(args, left) -> tuple[int, bool]:
    """bench/save_stall.py: the recipe's train state saved as train.py saves it, 100 steps
    apart at the H200's ~7 ms a step; then the same state in `train.flat_optimizer`'s
    layout (a third of the arrays)."""
    code, cut = 0, False
    for layout, more in (("", []), ("_flat", ["--flat_optimizer"])):
        argv = [sys.executable, "bench/save_stall.py", "--config", args.config, "--saves", "8",
                "--apart_s", "0.7", "--profile", *more,
                "--json", str(args.results / f"gpu_save_stall{layout}.json")]
        code, cut = run_process(argv, args.work / f"saves{layout}.log", left())
        if code or cut:
            break
    return code, cut


def phase_compile(args, left) -> dict:
    """The recipe's short run once per `--compile_variant` (module docstring): a later
    variant's flags override the window's where they name the same flag."""
    result = {"config": args.config, "overrides": args.override, "steps": args.compile_steps,
              "base_xla_flags": os.environ.get("XLA_FLAGS", ""), "runs": {}}
    for variant in args.compile_variant:
        name, _, flags = variant.partition("=")
        work = args.work / "compile" / name
        shutil.rmtree(work, ignore_errors=True)  # cold: no checkpoint, no cached program
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(work / "xla_cache"),
               "XLA_FLAGS": f"{result['base_xla_flags']} {flags}".strip()}
        argv = train_argv(args.config, work / "run", args.override,
                          f"--config.train.num_steps={args.compile_steps}",
                          f"--config.eval.every_steps={args.compile_steps}",
                          "--config.checkpoint.every_steps=100000",
                          "--config.checkpoint.last_every_steps=0")
        start = time.time()
        code, cut = run_process(argv, args.work / f"compile_{name}.log", left(), env=env)
        keep_metrics(args, work / "run", f"compile_{name}")
        result["runs"][name] = {
            "xla_flags": env["XLA_FLAGS"], "exit_code": code, "cut": cut,
            "launch_to_exit_s": round(time.time() - start, 1),
            **run_figures(work / "run", args.log_every)}
    return result


def phase_profile(args, left) -> tuple[int, bool]:
    """bench/step_profile.py: the recipe's model (tiny) on one 4,096-token batch shape."""
    argv = [sys.executable, "bench/step_profile.py", "--size", "tiny", "--batch_tokens", "4096",
            "--variants", args.profile_variants, "--seeds", str(args.seeds),
            "--trace", str(args.work / "trace"),
            "--json", str(args.results / "gpu_step_profile_tiny.json")]
    return run_process(argv, args.work / "profile.log", left())


def last_compile_seconds(workdir: Path) -> float | None:
    train = [e for e in events(workdir) if e["split"] == "train"]
    return train[-1].get("compile_seconds") if train else None


def keep_metrics(args, workdir: Path, name: str) -> None:
    """A measured run's metrics.jsonl (its steps' times, input waits, compile seconds),
    back with the results as `<results>/../runs/<name>.metrics.jsonl`."""
    source = workdir / "metrics.jsonl"
    if source.is_file():
        (args.results.parent / "runs").mkdir(parents=True, exist_ok=True)
        (args.results.parent / "runs" / f"{name}.metrics.jsonl").write_bytes(source.read_bytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default="recipe,seeds,saves,compile,profile,peer,sweep")
    parser.add_argument("--deadline_s", type=float, default=570.0,
                        help="seconds from start to the last phase's end [570]")
    parser.add_argument("--config", default="configs/multi30k_de_en.py")
    parser.add_argument("--override", action="append", default=[],
                        help="a --config.KEY=VALUE flag for every training (repeatable)")
    parser.add_argument("--steps", type=int, default=8000, help="the recipe's last step")
    parser.add_argument("--recipe_warmup_steps", type=int, default=50,
                        help="the recipe's warm-up run (0: none, a cold launch) [50]")
    parser.add_argument("--compile_variant", action="append", default=None,
                        help="NAME=XLA_FLAGS of the compile phase (repeatable) "
                             f"[{'; '.join(COMPILE_VARIANTS)}]")
    parser.add_argument("--compile_steps", type=int, default=600)
    parser.add_argument("--profile_variants", default="pure,flat",
                        help="bench/step_profile.py's variants [pure,flat]")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--seed_steps", type=int, default=600)
    parser.add_argument("--seeds_override", action="append", default=None,
                        help="a --config.KEY=VALUE flag of the seeds phase's runs (repeatable) "
                             "[the recipe's packing: pack_length 64, batch_tokens 2944]")
    parser.add_argument("--log_every", type=int, default=100)
    parser.add_argument("--results", type=Path,
                        default=Path(os.environ.get("OUT", "/tmp/out")) / "results" / "bench")
    parser.add_argument("--sweep_runs", type=Path, default=Path("runs/gpu_window/sweep"))
    parser.add_argument("--sweep_out", type=Path,
                        default=Path("runs/gpu_window/sweep_results"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_window"))
    parser.add_argument("--plan", default="scripts/plans/anchors.toml")
    parser.add_argument("--sweep_earlier", type=Path, default=None,
                        help="the earlier windows' sweep results [results/sweep/<plan>]")
    parser.add_argument("--sweep_parallel", default="auto",
                        help="runs the sweep trains side by side: N, or auto (from the seeds "
                             "phase's two processes; 1 without it) [auto]")
    parser.add_argument("--sweep_only", default="",
                        help="the plan's variants the sweep runs, comma-separated [all]")
    parser.add_argument("--sweep_pack", action="store_true",
                        help="the sweep also hands back each run's newest checkpoints")
    parser.add_argument("--peer_args", default="", help="more flags for bench/gpu_peer.py")
    args = parser.parse_args(argv)
    # Inside the repository (relative to it), wherever the driver was started from.
    args.sweep_runs, args.sweep_out = REPO / args.sweep_runs, REPO / args.sweep_out
    plan_name = Path(args.plan).stem
    args.sweep_earlier = REPO / (args.sweep_earlier or Path("results/sweep") / plan_name)
    args.compile_variant = args.compile_variant or COMPILE_VARIANTS
    if bad := [v for v in args.compile_variant
               if "=" not in v or not re.fullmatch(r"\w+", v.partition("=")[0])]:
        print(f"error: --compile_variant wants NAME=XLA_FLAGS, got {bad}", file=sys.stderr)
        return 2
    if args.seeds_override is None:
        args.seeds_override = ["--config.data.pack_length=64", "--config.train.batch_tokens=2944"]
    start = time.time()
    phases = [p for p in args.phases.split(",") if p]
    if unknown := [p for p in phases if p not in PHASES]:
        print(f"error: --phases: unknown {unknown}; choose from {list(PHASES)}", file=sys.stderr)
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)

    def left() -> float:
        return max(1.0, start + args.deadline_s - time.time())

    device = device_name()
    print(f"gpu_window: {device}; phases {phases}; {args.deadline_s:.0f} s", flush=True)
    seeds = None

    def recipe() -> None:
        result = {"device": device, **phase_recipe(args, left)}
        write_json(args.results / "gpu_tiny_recipe_time_to_result.json", result)
        print(f"gpu_window: recipe {json.dumps(result['run'])}", flush=True)

    def seeds_phase() -> None:
        nonlocal seeds
        seeds = {"device": device, **phase_seeds(args, left)}
        write_json(args.results / "gpu_seeds_together.json", seeds)
        print(f"gpu_window: seeds {json.dumps(seeds)}", flush=True)

    def saves() -> None:
        code, cut = phase_saves(args, left)
        print(f"gpu_window: saves exit {code}{' (deadline)' if cut else ''}", flush=True)

    def compile_phase() -> None:
        result = {"device": device, **phase_compile(args, left)}
        write_json(args.results / "gpu_compile_variants.json", result)
        print(f"gpu_window: compile {json.dumps(result['runs'])}", flush=True)

    def profile() -> None:
        code, cut = phase_profile(args, left)
        print(f"gpu_window: profile exit {code}{' (deadline)' if cut else ''}", flush=True)

    def peer() -> None:
        argv = [sys.executable, "bench/gpu_peer.py", "--json", str(args.results / "gpu_peer.json"),
                *args.peer_args.split()]
        code, cut = run_process(argv, args.work / "peer.log", left())
        print(f"gpu_window: peer exit {code}{' (deadline)' if cut else ''}", flush=True)

    def sweep() -> None:
        argv = sweep_argv(args, left() - 10, sweep_parallel(args.sweep_parallel, seeds))
        code, _ = run_process(argv, args.work / "sweep.log", left())
        if args.sweep_out.is_dir():  # every result so far, those of earlier calls too
            shutil.copytree(args.sweep_out, args.results.parent / "sweep" / plan_name,
                            dirs_exist_ok=True)
        print(f"gpu_window: sweep exit {code}", flush=True)

    runs = {"recipe": recipe, "seeds": seeds_phase, "saves": saves, "compile": compile_phase,
            "profile": profile, "peer": peer, "sweep": sweep}
    for phase in phases:
        if left() > PHASES[phase]:
            runs[phase]()
        else:
            print(f"gpu_window: {phase} skipped ({left():.0f} s left)", flush=True)
    for log in sorted(args.work.glob("*.log")):  # what happened, back with the results
        (args.results.parent / "logs").mkdir(parents=True, exist_ok=True)
        (args.results.parent / "logs" / log.name).write_bytes(log.read_bytes()[-200_000:])
    print(f"gpu_window: done in {time.time() - start:.0f} s; results in {args.results}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
