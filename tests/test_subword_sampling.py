"""Subword regularisation (data/sampling.py, Tokenizer sampling): draws fixed by their
seed in any process, fresh each epoch, text-preserving; resumable batches; a resumed training run with
sampling on equals an uninterrupted one."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, run_script
from test_train import final_params, flat

from configs import smoke
from configs.cli import validate_config
from configs.errors import UserError
from data.sampling import SampledEpochs
from data.streaming import training_source
from data.tokenizer import Sampling, load_or_train_tokenizer


def sampling_config(model_type: str = "unigram", pairs: int = 300):
    cfg = smoke.get_config()
    cfg.data.max_train_sentences = pairs
    cfg.data.spm_model_type = model_type
    cfg.data.spm_sampling_alpha = 0.1
    return cfg


def tokenizer_for(cfg, folder):
    sources, targets = next(training_source(cfg.data).chunks(10_000))
    return load_or_train_tokenizer(folder, cfg.data, lambda: ([*sources, *targets], []))


@pytest.fixture(scope="module")
def unigram(tmp_path_factory):
    cfg, folder = sampling_config(), tmp_path_factory.mktemp("tok") / "unigram"
    return cfg, tokenizer_for(cfg, folder), folder


def test_a_draw_is_fixed_by_its_seed_and_keeps_the_text(unigram):
    cfg, tokenizer, _ = unigram
    texts = next(training_source(cfg.data).chunks(50))[1]
    best = tokenizer.encode_target(texts)
    first = tokenizer.encode_target(texts, Sampling(0.5, 16, seed=5))
    tokenizer.encode_target(texts, Sampling(0.5, 16, seed=9))  # no state carried over
    assert tokenizer.encode_target(texts, Sampling(0.5, 16, seed=5)) == first
    other = tokenizer.encode_target(texts, Sampling(0.5, 16, seed=6))
    assert other != first and first != best
    assert sum(map(len, first)) > sum(map(len, best))  # sampled pieces are shorter
    decoded = tokenizer.decode_target(first)
    assert decoded == tokenizer.decode_target(best)  # another segmentation, the same text
    assert tokenizer.encode_target(texts) == best  # the best segmentation is untouched


def test_epochs_differ_and_resume_exactly(unigram):
    cfg, tokenizer, _ = unigram
    source = training_source(cfg.data)
    make = lambda: SampledEpochs(source, tokenizer, cfg.data, batch_tokens=512, seed=3)  # noqa: E731
    epoch0, epoch1 = make().encode_epoch(0), make().encode_epoch(1)
    assert epoch0 == make().encode_epoch(0)
    assert epoch0[0] != epoch1[0] and epoch0[1] != epoch1[1]
    straight = list(itertools.islice(make().iterate(), 60))
    assert {e for e, _, _ in straight} >= {0, 1, 2}  # crosses epochs
    # Batches per epoch follow that epoch's lengths; a resume continues from what the
    # iterator last gave (epoch, index + 1), also at an epoch's end.
    ends = [k for k in range(len(straight) - 1) if straight[k + 1][0] != straight[k][0]]
    for cut in (7, ends[0]):
        epoch, index, _ = straight[cut]
        resumed = list(itertools.islice(make().iterate(epoch, index + 1), len(straight) - cut - 1))
        for (e1, i1, a), (e2, i2, b) in zip(straight[cut + 1:], resumed, strict=True):
            assert (e1, i1) == (e2, i2)
            for key in ("src", "tgt_in", "tgt_out"):
                np.testing.assert_array_equal(a[key], b[key])


def test_a_draw_is_the_same_in_another_process(unigram, tmp_path):
    """SentencePiece's own sampling salts its generator per process; ours must not."""
    cfg, tokenizer, folder = unigram
    texts = next(training_source(cfg.data).chunks(30))[0]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    code = ("import json, sys; from data.tokenizer import Sampling, Tokenizer; "
            f"t = Tokenizer.load({str(folder)!r}); "
            f"texts = json.load(open({str(tmp_path / 'texts.json')!r})); "
            "print(json.dumps(t.encode_source(texts, Sampling(0.5, 16, seed=11))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == tokenizer.encode_source(texts, Sampling(0.5, 16, seed=11))


@pytest.mark.parametrize("key, value, model_type", [
    ("spm_sampling_alpha", -0.1, "unigram"), ("spm_sampling_alpha", 0.1, "bpe"),
    ("spm_nbest_size", 1, "unigram"), ("spm_nbest_size", -1, "unigram")])
def test_settings_that_sample_nothing_or_nonsense_are_refused(key, value, model_type):
    cfg = sampling_config(model_type)
    cfg.data[key] = value
    with pytest.raises(UserError, match=f"data.{key}" if model_type == "unigram" else "unigram"):
        validate_config(cfg)


@pytest.mark.slow
def test_resumed_training_with_sampling_equals_uninterrupted(tmp_path):
    args = ["--config", "configs/smoke.py", "--config.data.max_train_sentences=200",
            "--config.data.spm_sampling_alpha=0.1", "--config.train.num_steps=30",
            "--config.checkpoint.every_steps=13", "--config.eval.every_steps=1000"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = run_script("train.py", *args, "--workdir", str(straight))
    assert result.returncode == 0, result.stderr[-2000:]
    first = run_script("train.py", *args, "--workdir", str(resumed), "--config.train.num_steps=13")
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_script("train.py", *args, "--workdir", str(resumed))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from step 13" in second.stderr
    a, b = flat(final_params(straight, 30)[0]), flat(final_params(resumed, 30)[0])
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=1e-6, err_msg=key)
