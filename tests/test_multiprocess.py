"""Multi-process training on real processes: two train.py processes (one CPU device each,
a coordinator on 127.0.0.1, gradients over gloo) end at the same parameters as one
process with two devices on the same global batches."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, run_script, xla_flags

SMOKE = ["--config", "configs/smoke.py", "--config.train.num_steps=6",
         "--config.eval.every_steps=0", "--config.eval.max_sentences=8",
         "--config.attention_maps.enabled=False"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_multiprocess_training_equals_one_process(tmp_path):
    from evaluation.loading import load_params

    port = free_port()
    workers = [subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *SMOKE, "--workdir", str(tmp_path / "two")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
             "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(rank)}) for rank in (0, 1)]
    outputs = [w.communicate(timeout=300) for w in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
        assert "2 device(s)" in err
    one = run_script("train.py", *SMOKE, "--workdir", str(tmp_path / "one"),
                     env=xla_flags("--xla_force_host_platform_device_count=2"))
    assert one.returncode == 0, one.stderr[-3000:]

    two_params = load_params(tmp_path / "two", "last")
    one_params = load_params(tmp_path / "one", "last")
    assert two_params.steps == one_params.steps == [6]
    for a, b in zip(jax.tree.leaves(two_params.params), jax.tree.leaves(one_params.params),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
