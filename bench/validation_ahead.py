"""What compiling validation's programs ahead (`eval.precompile`, evaluation/precompile.py)
saves a run: train.py launched cold with the option off and on, alternating.

    python -m bench.validation_ahead [--config configs/multi30k_de_en.py] [--steps 200]
        [--eval_at 100] [--repeat 1] [--override key=value ...] [--json OUT]

Each run is `train.py --config CONFIG` in a fresh workdir with a fresh, empty XLA
compilation cache ($JAX_COMPILATION_CACHE_DIR), training `--steps` steps, validating at
step `--eval_at` and at the end as the config validates (beam, length penalty, split),
logging every `--eval_at` steps and saving only at the end. Per run:

  * `wall_s`: launch to exit;
  * `first_validation_hook_s`: `validation_hook_seconds` of step `--eval_at` (the
    validation hook's `seconds_in_validate` less its attention maps): how long the first
    validation held training up, its compiling included unless it was done ahead, and
    the wait for the train step still running when it began (the hook's first sync; on
    this CPU up to one step, the same in both arms; the field before it,
    `first_validation_s`, was timed from the train event written before validation);
  * `compile_seconds`: the run's XLA compiling, from its last train event (the union of
    the spans, background threads' included).

The medians of each arm and `first_validation_hook_saved_s` (off less on) are reported; every
run is kept in `runs`. The data cache is warmed by a first, untimed run (one step, no decoding).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/multi30k_de_en.py")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval_at", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1, help="runs per arm, alternating")
    parser.add_argument("--override", action="append", default=[],
                        help="a train.py --config.KEY=VALUE for every run, as KEY=VALUE")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 0 < args.eval_at < args.steps:
        parser.error(f"--eval_at must lie between 0 and --steps ({args.steps})")
    return args


def train_argv(args: argparse.Namespace, workdir: Path, steps: int, precompile: bool) -> list[str]:
    """The train.py command of one run."""
    settings = {"train.num_steps": steps, "train.log_every_steps": args.eval_at,
                "eval.every_steps": args.eval_at, "checkpoint.every_steps": steps,
                "checkpoint.last_every_steps": 0, "eval.precompile": precompile}
    return [sys.executable, str(REPO / "train.py"), "--config", args.config,
            "--workdir", str(workdir),
            *(f"--config.{key}={value}" for key, value in settings.items()),
            *(f"--config.{item}" for item in args.override)]


def _train(argv: list[str], cache: Path, name: str) -> float:
    """Runs train.py with its own XLA cache folder; returns the wall seconds."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"train.py failed ({name}):\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def validation_hook_seconds(events: list[dict]) -> dict[str, float]:
    """{step: seconds its validation hook held training up}, from metrics.jsonl's events: the
    validation hook's seconds in the train event of its step (`seconds_in_validate`; the
    log runs after the step's validation, training/hooks.py `train_hooks`) less the
    attention maps it recorded (the valid event's `seconds_maps`): the validation's loss
    and decoding, and what it waited for (its programs compiled ahead, the train steps
    still running on the device when it began)."""
    train = {e["step"]: e for e in events if e["split"] == "train"}
    return {str(e["step"]): round(train[e["step"]]["seconds_in_validate"]
                                  - e.get("seconds_maps", 0.0), 2)
            for e in events if e["split"] == "valid" and "seconds_in_validate" in
            train.get(e["step"], {})}


def one_run(args: argparse.Namespace, scratch: Path, name: str, precompile: bool) -> dict:
    """Trains one cold run; returns its figures (module docstring)."""
    workdir = scratch / name
    wall = _train(train_argv(args, workdir, args.steps, precompile), scratch / f"{name}-xla", name)
    events = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    valid = next(e for e in events if e["split"] == "valid" and e["step"] == args.eval_at)
    last_train = max((e for e in events if e["split"] == "train"), key=lambda e: e["step"])
    return {"precompile": precompile, "wall_s": round(wall, 2),
            "first_validation_hook_s": validation_hook_seconds(events)[str(args.eval_at)],
            "valid_bleu": valid.get("bleu"),
            "compile_seconds": round(last_train["compile_seconds"], 2)}


def run(args: argparse.Namespace) -> dict:
    runs = []
    with tempfile.TemporaryDirectory(prefix="validation_ahead_") as tmp:
        scratch = Path(tmp)
        # Untimed: fills the data cache (tokenizer, encoded corpus) every run then reads;
        # one step and a loss-only validation, so it compiles no decoding.
        _train(train_argv(args, scratch / "warm", 1, False)
               + ["--config.eval.decode=False", "--config.attention_maps.enabled=False"],
               scratch / "warm-xla", "warm-up")
        for i in range(args.repeat):
            for precompile in (False, True):
                runs.append(one_run(args, scratch, f"r{i}-{'on' if precompile else 'off'}",
                                    precompile))
                print(json.dumps(runs[-1]), file=sys.stderr)

    def median(key: str, precompile: bool) -> float:
        return round(statistics.median(r[key] for r in runs if r["precompile"] == precompile), 2)

    arms = {name: {key: median(key, flag) for key in ("wall_s", "first_validation_hook_s",
                                                      "compile_seconds")}
            for name, flag in (("off", False), ("on", True))}
    return {"config": args.config, "overrides": args.override, "steps": args.steps,
            "eval_at": args.eval_at, "repeat": args.repeat, "machine": platform.processor()
            or platform.machine(), "cpu_count": os.cpu_count(), "arms": arms,
            "first_validation_hook_saved_s": round(arms["off"]["first_validation_hook_s"]
                                                   - arms["on"]["first_validation_hook_s"], 2),
            "wall_saved_s": round(arms["off"]["wall_s"] - arms["on"]["wall_s"], 2),
            "runs": runs}


def print_table(result: dict) -> None:
    print("eval.precompile  wall_s  first_validation_hook_s  compile_seconds")
    for name, arm in result["arms"].items():
        print(f"{name:>15}  {arm['wall_s']:6.1f}  {arm['first_validation_hook_s']:23.1f}  "
              f"{arm['compile_seconds']:15.1f}")


if __name__ == "__main__":
    finish(parse_args(), run, print_table)
