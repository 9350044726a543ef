"""What a process pays before its first line of attnmt work: Python, ml_dtypes, JAX, a CLI.

    python -m bench.startup [--repeats 5] [--json OUT]

Each command runs `--repeats` times as a fresh subprocess of this Python, one after
another; the result is the median wall time of each (`median_s`, with `all_s`):

  * `python`: the interpreter alone (`-c pass`),
  * `ml_dtypes`: `import ml_dtypes`, the numeric types every JAX import loads first,
  * `jax`: `import jax`,
  * `train_bad_flag`: `train.py --config configs/smoke.py --config.model.d_modle=64`, an
    error found before anything is written (exit 2): train.py's imports and flag parsing.

Every CLI and every end-to-end test's subprocess pays `jax` once (bench/README.md,
"Start-up", holds the figures). `versions` names the packages measured.
"""

from __future__ import annotations

import argparse
import importlib.metadata
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

COMMANDS = {
    "python": ["-c", "pass"],
    "ml_dtypes": ["-c", "import ml_dtypes"],
    "jax": ["-c", "import jax"],
    "train_bad_flag": ["train.py", "--config", "configs/smoke.py", "--workdir", "{tmp}/run",
                       "--config.model.d_modle=64"],
}
EXIT_CODES = {"train_bad_flag": 2}  # the others exit 0
PACKAGES = ("jax", "jaxlib", "ml_dtypes", "numpy", "flax", "orbax-checkpoint", "optax")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def time_command(argv: list[str], expect: int) -> float:
    """Wall seconds of one `python argv...` from the repository root."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != expect:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}, not {expect}: "
                           f"{result.stderr[-2000:]}")
    return seconds


def run(args: argparse.Namespace) -> dict:
    """{"commands": {name: {"median_s", "all_s"}}, "repeats", "versions"}."""
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in COMMANDS.items():
            argv = [part.format(tmp=tmp) for part in argv]
            times = [time_command(argv, EXIT_CODES.get(name, 0)) for _ in range(args.repeats)]
            rows[name] = {"median_s": round(statistics.median(times), 3),
                          "all_s": [round(t, 3) for t in times]}
    return {"commands": rows, "repeats": args.repeats,
            "versions": {p: importlib.metadata.version(p) for p in PACKAGES}}


def print_table(result: dict) -> None:
    print(" ".join(f"{p} {v}" for p, v in result["versions"].items()))
    for name, row in result["commands"].items():
        print(f"{name:>16}  {row['median_s']:.2f} s")


def main(argv=None) -> None:
    finish(parse_args(argv), run, print_table)


if __name__ == "__main__":
    main()
