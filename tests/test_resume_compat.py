"""A workdir written by an older attnmt still resumes, to the same parameters.

`fixtures/workdir_cef8104/` was made by `train.py --config configs/smoke.py` at commit
cef8104 (before the code was restructured), keeping only its step-20 checkpoint;
`params_step40.npz` holds the parameters that same run reached at step 40. Resuming
the copy with today's code must end at the same parameters.

`fixtures/workdir_align_b2d46ee/` is the same for a word-alignment run made at b2d46ee,
when the alignment keys were model.alignment_*, train.align_* and data.teacher_links
and the checkpoint kept the links' fingerprint as `teacher_links_sha256`: the recipe
configs/align_de_en.py made smoke-sized by ALIGN_ARGS, on the 300 Multi30k pairs and
diagonal teacher links in its data/ (paths relative to the repository root).
"""

import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import DEFAULT_XLA, run_module, run_script

FIXTURE = Path(__file__).parent / "fixtures" / "workdir_cef8104"
ALIGN_FIXTURE = Path(__file__).parent / "fixtures" / "workdir_align_b2d46ee"
ALIGN_DATA = "tests/fixtures/workdir_align_b2d46ee/data"
# The run's command line, today's spelling of it: at b2d46ee the last two were
# --config.train.align_prior_ramp_steps=10 --config.train.align_agreement_start=10.
ALIGN_ARGS = ("--config", "configs/align_de_en.py",
              f"--config.data.train_source={ALIGN_DATA}/train.de",
              f"--config.data.train_target={ALIGN_DATA}/train.en",
              f"--config.alignment.teacher_links={ALIGN_DATA}/train.links",
              "--config.data.vocab_size=200", "--config.data.bucket_step=16",
              "--config.model.d_model=16", "--config.model.num_heads=2",
              "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
              "--config.model.d_ff=32", "--config.train.num_steps=40",
              "--config.train.batch_tokens=512", "--config.train.warmup_steps=10",
              "--config.train.log_every_steps=10", "--config.eval.every_steps=20",
              "--config.eval.batch_size=64", "--config.eval.max_sentences=8",
              "--config.checkpoint.every_steps=20", "--config.attention_maps.num_examples=1",
              "--config.alignment.prior_ramp_steps=10", "--config.alignment.agreement_start=10")
# The resumes train and save, no more: validation and attention maps (keys a resume may
# change) read the parameters without moving them, and compiled at XLA's defaults their
# programs would be most of these tests' time.
TRAINING_ONLY = ("--config.eval.every_steps=0", "--config.attention_maps.enabled=False")


@pytest.mark.slow  # a resume compiled at XLA's defaults, as the fixture was: 25-30 s cold
def test_resume_of_a_workdir_written_before_the_restructure(tmp_path):

    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE, workdir, ignore=shutil.ignore_patterns("params_step40.npz"))
    # Compiled as the fixture was (conftest.py): its parameters are compared to float rounding.
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                        *TRAINING_ONLY, env=DEFAULT_XLA)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step 20" in result.stderr

    assert_same_params(workdir, FIXTURE / "params_step40.npz")


@pytest.mark.slow  # trains and resumes an alignment run: about 80 s on a cold compilation cache
def test_resume_of_an_alignment_run_written_before_the_plugin(tmp_path):
    from alignment.plugin import AlignmentTransformer
    from evaluation.loading import load_params

    workdir = tmp_path / "run"
    shutil.copytree(ALIGN_FIXTURE, workdir,
                    ignore=shutil.ignore_patterns("params_step40.npz", "data"))
    result = run_script("train.py", *ALIGN_ARGS, "--workdir", str(workdir), *TRAINING_ONLY,
                        env=DEFAULT_XLA)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step 20" in result.stderr
    assert isinstance(load_params(workdir, "40").model, AlignmentTransformer)
    assert_same_params(workdir, ALIGN_FIXTURE / "params_step40.npz")

    # The old run's checkpoint reads with attention.align: the heads' and student's links.
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("ein hund läuft . ||| a dog runs .\nzwei männer ||| two men\n",
                     encoding="utf-8")
    old = tmp_path / "old"
    shutil.copytree(ALIGN_FIXTURE, old, ignore=shutil.ignore_patterns("params_step40.npz",
                                                                      "data"))
    result = run_module("attention.align", "--workdir", str(old), "--checkpoint", "20",
                        "--pairs", str(pairs), "--layer", "alignment_heads_student")
    assert result.returncode == 0, result.stderr[-3000:]
    links = result.stdout.splitlines()
    assert len(links) == 2 and all(re.fullmatch(r"(\d+-\d+( \d+-\d+)*)?", line)
                                   for line in links), links


def assert_same_params(workdir: Path, npz: Path) -> None:
    """The parameters of `workdir`'s step 40 are those of `npz` (flattened names)."""
    from evaluation.loading import load_params

    params = load_params(workdir, "40").params
    resumed = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
               for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    with np.load(npz, allow_pickle=False) as expected:
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
            # Another CPU sums in another order (its vector width), and Adam divides each
            # gradient by its own scale, so a rounding difference becomes a step of up to
            # ~1e-6 in a parameter with small gradients (seen: 2.2e-6 in 20 steps on an AMD
            # EPYC against the fixture's Intel Xeon). A wrong resume (other data order,
            # dropout keys or optimizer state) moves parameters by ~lr = 1e-3 a step.
            np.testing.assert_allclose(resumed[name], expected[name], rtol=1e-5, atol=1e-5,
                                       err_msg=name)
