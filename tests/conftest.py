"""Shared test setup.

Every test process and every subprocess it starts (train.py, evaluate.py) shares one
persistent XLA compilation cache, so the end-to-end tests pay for each compilation once.
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
