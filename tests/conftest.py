"""Shared test setup.

Every test process and every subprocess it starts (train.py, evaluate.py) shares one
persistent XLA compilation cache, so the end-to-end tests pay for each compilation once,
and compiles them cheaply: XLA's backend optimization level 0 and its older CPU fusion
code generator (`--xla_cpu_use_fusion_emitters=false`; what each saves: bench/README.md,
"Test suite"). The same programs, results equal to float rounding; most of a short test
run is compiling.
Speed is measured in bench/, never in tests. A test that compares with numbers written
by default-compiled code (a stored fixture) sets `DEFAULT_XLA` in its subprocesses.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ATTNMT_TEST_XLA_CACHE", Path(tempfile.gettempdir()) / "attnmt-test-xla"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
DEFAULT_XLA = {"XLA_FLAGS": " ".join(flag for flag in os.environ.get("XLA_FLAGS", "").split()
                                     if flag not in FAST_COMPILE)}
os.environ["XLA_FLAGS"] = " ".join([DEFAULT_XLA["XLA_FLAGS"], *FAST_COMPILE]).strip()


# A tiny English test set and three systems' translations of it, for the scoring tests.
REFS = ["A man in a blue shirt is playing the guitar.", "Two dogs run through the snow.",
        "A woman's bag lies on the street.", "Children play football in a park.",
        "The old man reads a newspaper on a bench.", "A girl jumps into the lake."]
SYS_A = ["A man in a blue shirt plays guitar.", "Two dogs are running in the snow.",
         "The bag of a woman lies on the road.", "Kids are playing soccer in a park.",
         "An old man is reading a paper on a bench.", "A girl jumps in the water."]
SYS_B = ["A man in a blue shirt is playing a guitar.", "Two dogs run through snow.",
         "A woman's bag is lying on the street.", "Children playing football in the park.",
         "The old man reads the newspaper on a bench.", "A girl jumps into a lake."]
SYS_C = ["A man wearing blue plays the guitar.", "Two dogs run through the snow.",
         "A bag lies on the street.", "Children play in a park.",
         "An old man reads on a bench.", "A girl is jumping into the lake."]


def xla_flags(*flags: str) -> dict:
    """A subprocess environment with these XLA flags added to the tests' own."""
    return {"XLA_FLAGS": " ".join([os.environ["XLA_FLAGS"], *flags])}


def run_script(script: str, *args: str, timeout: float = 600, env: dict | None = None,
               input: str | None = None):
    """Run `python <script> args...` from the repository root; returns CompletedProcess."""
    return _run([str(REPO / script), *args], timeout, env, input)


def run_module(module: str, *args: str, timeout: float = 600, env: dict | None = None,
               input: str | None = None):
    """Run `python -m <module> args...` from the repository root; returns CompletedProcess."""
    return _run(["-m", module, *args], timeout, env, input)


def _run(argv: list[str], timeout: float, env: dict | None, input: str | None):
    import subprocess

    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, input=input,
        timeout=timeout, env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory) -> Path:
    """A workdir trained once with configs/smoke.py (40 steps), shared by read-only tests."""
    workdir = tmp_path_factory.mktemp("smoke") / "run"
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir
