"""Subword regularisation (data/sampling.py, data/subword_draws.py): l-best sampling and
BPE-dropout draws fixed by their seed in any process, fresh each epoch, text-preserving;
BPE-dropout against SentencePiece (the same segmentation at p = 0) and the paper's code
(the same segmentation with the same draws); resumable batches; a resumed training run with sampling on
equals an uninterrupted one."""

import heapq
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, run_script
from test_train import final_params, flat

from common.errors import UserError
from configs import smoke
from configs.validation import validate_config
from data.sampling import SampledEpochs
from data.streaming import training_source
from data.subword_draws import BpeDropout, Sampling
from data.tokenizer import load_or_train_tokenizer


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


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    cfg, folder = sampling_config("bpe", pairs=2000), tmp_path_factory.mktemp("tok") / "bpe"
    return cfg, tokenizer_for(cfg, folder), folder


def bpe_dropout(tokenizer) -> BpeDropout:
    return BpeDropout(tokenizer._source)


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


def test_bpe_dropout_draw_is_fixed_by_its_seed_and_keeps_the_text(bpe):
    cfg, tokenizer, _ = bpe
    texts = next(training_source(cfg.data).chunks(50))[0]
    best = tokenizer.encode_source(texts)
    first = tokenizer.encode_source(texts, Sampling(0.1, 16, seed=5, model_type="bpe"))
    assert tokenizer.encode_source(texts, Sampling(0.1, 16, seed=5, model_type="bpe")) == first
    assert tokenizer.encode_source(texts, Sampling(0.1, 16, seed=6, model_type="bpe")) != first
    assert first != best and sum(map(len, first)) > sum(map(len, best))
    assert all(row[-1] == tokenizer.eos_id for row in first)
    assert tokenizer._source.decode(first) == tokenizer._source.decode(best)


def test_bpe_dropout_at_zero_is_sentencepieces_segmentation(bpe):
    """Every training sentence of both sides, piece for piece: the merge order is right."""
    cfg, tokenizer, _ = bpe
    sources, targets = next(training_source(cfg.data).chunks(10_000))
    texts = [*sources, *targets, "Ünïcödé ☃ wörds, n0t  in\tthe vocabulary!"]
    ours = bpe_dropout(tokenizer).encode(texts, 0.0, np.random.default_rng(0))
    assert ours == tokenizer._source.encode(texts)
    # p = 1 skips every merge: the characters (the unknown ones keep SentencePiece's pieces).
    chars = bpe_dropout(tokenizer).merge(list("\u2581abcab"), 1.0, np.random.default_rng(0))
    assert chars == list("\u2581abcab")


def papers_bpe_dropout(merges: dict, chars: list[str], p: float, rng) -> list[str]:
    """The paper's code (Provilkov et al. 2020, `bpe.py`'s `tokenize_word`), ported: a heap
    of [priority, position] over a list that shrinks as pairs merge; merges dropped since
    the last merge are pushed back after it."""
    tokens, heap, dropped = list(chars), [], []
    for pos in range(len(tokens) - 1):
        if (tokens[pos], tokens[pos + 1]) in merges:
            heap.append([merges[tokens[pos], tokens[pos + 1]], pos])
    heapq.heapify(heap)
    while heap:
        priority, pos = heapq.heappop(heap)
        if pos > len(tokens) - 2 or merges.get((tokens[pos], tokens[pos + 1])) != priority:
            continue
        if rng.random() < p:
            dropped.append([priority, pos])
            continue
        tokens[pos:pos + 2] = [tokens[pos] + tokens[pos + 1]]
        for pair in heap:
            if pair[1] > pos:
                pair[1] -= 1
        for priority_, position in dropped:
            heapq.heappush(heap, [priority_, position - 1 if position > pos else position])
        dropped = []
        if pos > 0 and (tokens[pos - 1], tokens[pos]) in merges:
            heapq.heappush(heap, [merges[tokens[pos - 1], tokens[pos]], pos - 1])
        if pos < len(tokens) - 1 and (tokens[pos], tokens[pos + 1]) in merges:
            heapq.heappush(heap, [merges[tokens[pos], tokens[pos + 1]], pos])
    return tokens


def test_bpe_dropout_is_the_papers_algorithm(bpe):
    """With the same draws, piece for piece the paper's code on the model's merges (a + b
    merges when it is a piece, earlier-learned pieces first), over every word of 300
    training sentences, five draws each."""
    cfg, tokenizer, _ = bpe
    dropout = bpe_dropout(tokenizer)
    merges = {(a, b): -dropout.pieces[a + b][1] for a in dropout.pieces for b in dropout.pieces
              if a + b in dropout.pieces}
    sources, _ = next(training_source(cfg.data).chunks(300))
    words = {"\u2581" + word for text in sources for word in text.split()}
    words = sorted(w for w in words if all(char in dropout.pieces for char in w))
    assert len(words) > 300
    differ = 0
    for draw, word in itertools.product(range(5), words):
        ours = dropout.merge(list(word), 0.1, np.random.default_rng(draw))
        theirs = papers_bpe_dropout(merges, list(word), 0.1, np.random.default_rng(draw))
        assert ours == theirs, word
        differ += ours != dropout.merge(list(word), 0.0, np.random.default_rng(draw))
    assert differ > 100  # the draws do split words


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


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_a_draw_is_the_same_in_another_process(model_type, request, tmp_path):
    """SentencePiece's own sampling salts its generator per process; ours must not."""
    cfg, tokenizer, folder = request.getfixturevalue(model_type)
    sampling = Sampling(0.5 if model_type == "unigram" else 0.1, 16, 11, model_type)
    texts = next(training_source(cfg.data).chunks(30))[0]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    code = ("import json, sys; from data.tokenizer import Tokenizer; "
            "from data.subword_draws import Sampling; "
            f"t = Tokenizer.load({str(folder)!r}); "
            f"texts = json.load(open({str(tmp_path / 'texts.json')!r})); "
            f"print(json.dumps(t.encode_source(texts, {sampling!r})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == tokenizer.encode_source(texts, sampling)
    assert json.loads(result.stdout) != tokenizer.encode_source(texts)


@pytest.mark.parametrize("key, value, model_type", [
    ("spm_sampling_alpha", -0.1, "unigram"), ("spm_sampling_alpha", 1.0, "bpe"),
    ("spm_nbest_size", 1, "unigram"), ("spm_nbest_size", -1, "unigram")])
def test_settings_that_sample_nothing_or_nonsense_are_refused(key, value, model_type):
    cfg = sampling_config(model_type)
    cfg.data[key] = value
    with pytest.raises(UserError, match=f"data.{key}"):
        validate_config(cfg)
    if model_type == "bpe":  # BPE-dropout below 1 is fine, whatever l says
        cfg.data.spm_sampling_alpha, cfg.data.spm_nbest_size = 0.1, 1
        validate_config(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_resumed_training_with_sampling_equals_uninterrupted(model_type, tmp_path):
    args = ["--config", "configs/smoke.py", "--config.data.max_train_sentences=200",
            f"--config.data.spm_model_type={model_type}",
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
