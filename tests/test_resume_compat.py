"""A workdir written by an older attnmt still resumes, to the same parameters.

`fixtures/workdir_cef8104/` was made by `train.py --config configs/smoke.py` at commit
cef8104 (before the code was restructured), keeping only its step-20 checkpoint;
`params_step40.npz` holds the parameters that same run reached at step 40. Resuming
the copy with today's code must end at the same parameters.
"""

import shutil
from pathlib import Path

import jax
import numpy as np
from conftest import run_script

FIXTURE = Path(__file__).parent / "fixtures" / "workdir_cef8104"


def test_resume_of_a_workdir_written_before_the_restructure(tmp_path):
    from evaluation.loading import load_params

    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE, workdir, ignore=shutil.ignore_patterns("params_step40.npz"))
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step 20" in result.stderr

    params = load_params(workdir, "40").params
    resumed = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
               for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    with np.load(FIXTURE / "params_step40.npz", allow_pickle=False) as expected:
        assert sorted(resumed) == sorted(expected.files)
        for name in expected.files:
            if name.endswith("key/bias"):
                # A key bias adds q.b_k to every score of a softmax row, which cancels: its
                # exact gradient is 0, so what it holds is rounding noise that Adam scales up
                # to ~lr per step, and another XLA build's noise differs. It still cannot move
                # more than the 20 resumed steps' learning rates (peak 1e-3) allow.
                np.testing.assert_allclose(resumed[name], expected[name], rtol=0, atol=20e-3,
                                           err_msg=name)
                continue
            np.testing.assert_allclose(resumed[name], expected[name], rtol=1e-5, atol=1e-6,
                                       err_msg=name)
