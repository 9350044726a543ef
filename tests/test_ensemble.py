"""Ensemble decoding (models/ensemble.py, `evaluate.py --ensemble`): the mean of the
members' log-probabilities, against NumPy and teacher forcing; one model twice equals
the model; members with other tokenizers are refused."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_script
from test_evaluate import _copy_run
from test_search import (
    SRC,
    _teacher_forced,
    all_hypotheses,
    brute_force,
    hypotheses,
    make_model,
    teacher_force,
)

from common.errors import UserError
from configs import resolved
from data.corpora import load_corpus
from data.tokenizer import BOS_ID, PAD_ID
from models import search
from models.ensemble import Ensemble, mean_log_probs
from models.translate import translate


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_mean_log_probs_is_the_mean_of_log_softmax():
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(2, 3, 7)).astype(np.float32) * 4 for _ in range(3)]
    expected = np.mean([_log_softmax(x) for x in logits], axis=0)
    np.testing.assert_allclose(mean_log_probs([jnp.asarray(x) for x in logits]), expected,
                               atol=1e-5)
    # not a renormalized distribution: the members disagree, so it sums to less than 1
    assert np.all(np.exp(expected).sum(-1) < 0.999)


def _ensemble_log_probs(models, src_row, hyps):
    """Teacher-forced log-probability of each hypothesis under the ensemble: the mean over
    members of their own (the step-wise mean, summed over steps)."""
    return np.mean([teacher_force(m, src_row, hyps)[0] for m in models], axis=0)


def test_greedy_follows_the_mean_of_two_different_models():
    """Greedy ensemble search == at every step, the argmax of the two models' mean
    log-softmax, teacher-forced on the prefix it chose (uncached, one model at a time);
    its log-probs are the ensemble's."""
    # two random models of a larger vocabulary: the ensemble picks tokens neither would
    models = [make_model(seed, vocab=32, sharpen=1.5) for seed in (2, 3)]
    max_length = 5
    out = search.greedy_search(Ensemble(models), jnp.asarray(SRC), max_length=max_length)
    hyps = hypotheses(out)
    tgt_in = np.zeros((len(SRC), max_length), np.int32)
    for b, hyp in enumerate(hyps):
        tgt_in[b, : len(hyp)] = [BOS_ID, *hyp[:-1]]
    # the decoder is causal: row t of the whole hypothesis sees only its prefix
    mean = np.mean([np.asarray(_teacher_forced(m, jnp.asarray(SRC), jnp.asarray(tgt_in))[0])
                    for m in models], axis=0)
    mean[..., [PAD_ID, BOS_ID]] = -np.inf
    for b, hyp in enumerate(hyps):
        assert hyp == np.argmax(mean[b, : len(hyp)], axis=-1).tolist(), b
        np.testing.assert_allclose(out.log_probs[b], _ensemble_log_probs(models, SRC[b], [hyp])[0],
                                   atol=1e-5)
    # the members disagree, so this is neither model's own greedy search
    for model in models:
        alone = search.greedy_search(model, jnp.asarray(SRC), max_length=max_length)
        assert not np.array_equal(alone.tokens, out.tokens)


def test_exhaustive_ensemble_beam_equals_brute_force_on_the_mean():
    """A beam wide enough to keep every candidate returns the best hypothesis under the
    ensemble's mean log-probability (each member's caches follow the reordered beams)."""
    models, max_length, alpha = [make_model(1), make_model(2)], 3, 0.6
    hyps = all_hypotheses(max_length)
    out = translate(Ensemble(models), SRC, beam_size=len(hyps), length_penalty=alpha,
                    max_length=max_length)
    clear = 0
    for b, hyp in enumerate(hypotheses(out)):
        best, scores, lps = brute_force(_ensemble_log_probs(models, SRC[b], hyps), hyps, alpha)
        np.testing.assert_allclose(out.scores[b], scores[0], atol=1e-5)
        if scores[0] - scores[1] > 1e-3:
            clear += 1
            assert hyp == best[0]
            np.testing.assert_allclose(out.log_probs[b], lps[0], atol=1e-5)
    assert clear >= 2  # not a test of ties


def test_ensemble_beam_scores_are_the_teacher_forced_mean():
    """A narrow beam over two models whose beams reorder: the returned hypothesis' log-prob
    is the mean of the members' teacher-forced log-probs (each member's caches followed
    the beams)."""
    models = [make_model(seed, vocab=32, sharpen=1.5) for seed in (2, 3)]
    out = translate(Ensemble(models), SRC, beam_size=3, length_penalty=0.6, max_length=6)
    for b, hyp in enumerate(hypotheses(out)):
        np.testing.assert_allclose(out.log_probs[b], _ensemble_log_probs(models, SRC[b], [hyp])[0],
                                   atol=1e-5)


def test_one_model_twice_equals_the_model():
    """Beam search (greedy: through evaluate() below) of [model, model] == the model's."""
    model = make_model(2, vocab=32, sharpen=1.5)  # beams that reorder (the vocab-6 one's do not)
    single = translate(model, SRC, beam_size=3, max_length=6, return_weights=True)
    twice = translate(Ensemble([model, model]), SRC, beam_size=3, max_length=6,
                      return_weights=True)
    np.testing.assert_array_equal(twice.tokens, single.tokens)
    np.testing.assert_array_equal(twice.lengths, single.lengths)
    np.testing.assert_allclose(twice.scores, single.scores, atol=1e-6)
    for kind in ("encoder_self", "decoder_self", "cross"):  # the first member's maps
        np.testing.assert_allclose(twice.weights[kind], single.weights[kind], atol=1e-6)


def test_evaluate_ensemble_of_the_same_run(smoke_workdir, tmp_path):
    """Through evaluate(): the same run twice (a copy) translates exactly as the run does
    (greedy; beam search above), and the JSON lists the members."""
    from evaluate import evaluate
    from evaluation.corpus import translate_lines
    from evaluation.loading import load_params, load_tokenizer

    run = _copy_run(smoke_workdir, tmp_path / "copy")
    cfg = resolved.load_config_json(smoke_workdir)
    loaded, tokenizer = load_params(smoke_workdir), load_tokenizer(smoke_workdir, cfg)
    sources = load_corpus(cfg.data, "valid")[0][:12]
    result = evaluate(run, ensemble=[str(smoke_workdir)], split="valid", max_sentences=12,
                      beam_size=1, name="ens")
    written = json.loads((run / "eval" / "ens.json").read_text())
    assert written["ensemble"] == result["ensemble"] == [str(run), str(smoke_workdir)]
    assert written["checkpoint"]["member_steps"] == [loaded.steps, loaded.steps]
    decoding = result["decoding"]
    single, _ = translate_lines(loaded.model, tokenizer, sources, beam_size=1,
                                length_penalty=decoding["length_penalty"],
                                batch_size=decoding["batch_size"],
                                bucket_step=decoding["bucket_step"])
    assert (run / "eval" / "ens.hyp.txt").read_text().splitlines() == single


def _retokenized_copy(smoke_workdir, path, vocab_size: int):
    """A copy of the run whose tokenizer is retrained on other text (same settings)."""
    from data.tokenizer import train_tokenizer

    run = _copy_run(smoke_workdir, path)
    sources, targets = load_corpus(resolved.load_config_json(run).data, "valid")
    train_tokenizer(sources[:500] + targets[:500], run / "tokenizer" / "spm",
                    vocab_size=vocab_size)
    return run


def test_members_with_another_tokenizer_are_refused(smoke_workdir, tmp_path):
    from evaluate import evaluate

    run = _copy_run(smoke_workdir, tmp_path / "run")
    other = _retokenized_copy(smoke_workdir, tmp_path / "other", vocab_size=200)
    result = run_script("evaluate.py", "--workdir", str(run), "--ensemble", str(other),
                        "--split", "valid", "--max_sentences", "4")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: --ensemble: the tokenizer in") and "differs" in lines[0]
    assert not (run / "eval").exists() and not (other / "eval").exists()

    smaller = _retokenized_copy(smoke_workdir, tmp_path / "smaller", vocab_size=100)
    with pytest.raises(UserError, match="vocabulary sizes 100/100"):
        evaluate(run, ensemble=[str(smaller)], split="valid", max_sentences=4)
    assert not (run / "eval").exists()
