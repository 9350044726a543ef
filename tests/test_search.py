"""Greedy and beam search against brute force, uncached decoding and teacher forcing."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention import CrossKV, KVCache
from configs.model import ModelConfig
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from models import beam_search, search
from models.transformer import DecodeState, Transformer
from models.translate import _translate_jit, to_token_lists, translate

VOCAB = 6  # pad, unk, bos, eos + two real tokens
GENERATED = [i for i in range(VOCAB) if i not in (PAD_ID, BOS_ID, EOS_ID)]  # unk is allowed
SRC = np.array([[4, 5, 1, 4, 3], [5, 3, 0, 0, 0], [1, 4, 4, 3, 0]], np.int32)  # padded batch


def tiny_config(vocab=VOCAB, **overrides) -> ModelConfig:
    cfg = dict(
        d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=2, d_ff=32,
        dropout=0.0, attention_dropout=0.0, activation="relu", pre_ln=True,
        positions="sinusoidal", share_embeddings=True, dtype="float32",
        param_dtype="float32", attention_impl="auto",
    )
    cfg.update(overrides)
    return ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, **cfg)


def make_model(seed, vocab=VOCAB, sharpen=2.5, eos_bias=0.0, **overrides):
    """A random tiny model with peaky next-token distributions: the final norm is scaled
    up, and its bias adds `eos_bias` to the eos logit only (through the tied output
    embedding), so that hypotheses end at various lengths."""
    model = Transformer(tiny_config(vocab, **overrides), rngs=nnx.Rngs(seed))
    norm = model.decoder_norm
    norm.scale[...] = norm.scale[...] * sharpen
    table = np.asarray(model.target_embed.tokens.embedding[...])  # [V, D]
    shift = np.zeros(vocab, np.float32)
    shift[EOS_ID] = eos_bias
    norm.bias[...] = norm.bias[...] + jnp.asarray(np.linalg.pinv(table) @ shift)
    return model


@nnx.jit
def _teacher_forced(model, src, tgt_in):
    logits, weights = model(src, tgt_in, return_weights=True)
    return jax.nn.log_softmax(logits, axis=-1), weights


def teacher_force(model, src_row, hyps, max_length=None):
    """Log-probs and attention maps of full hypotheses (ids incl. eos) by teacher forcing.

    Returns (log_probs [N], weights dict over N = len(hyps)); the decoder input is
    [bos] + hyp[:-1], padded to `max_length`.
    """
    width = max_length or max(len(h) for h in hyps)
    tgt_in = np.zeros((len(hyps), width), np.int32)
    for i, h in enumerate(hyps):
        tgt_in[i, : len(h)] = [BOS_ID, *h[:-1]]
    src = np.repeat(np.asarray(src_row)[None], len(hyps), 0)
    lp, weights = _teacher_forced(model, jnp.asarray(src), jnp.asarray(tgt_in))
    lp = np.asarray(lp)
    scores = np.array([sum(lp[i, t, tok] for t, tok in enumerate(h)) for i, h in enumerate(hyps)])
    return scores, jax.tree.map(np.asarray, weights)


def hypotheses(out):
    """Token lists incl. a final eos (if any), checking the padding layout."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    result = []
    for row, n in zip(tokens, lengths, strict=True):
        assert 1 <= n <= len(row)
        assert np.all(row[n:] == PAD_ID)
        hyp = row[:n].tolist()
        assert EOS_ID not in hyp[:-1] and PAD_ID not in hyp and BOS_ID not in hyp
        result.append(hyp)
    return result


def penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def all_hypotheses(max_length, generated=GENERATED):
    """Every hypothesis a search can return: ended by eos within max_length, or cut at it."""
    hyps = [[*p, EOS_ID] for n in range(max_length) for p in itertools.product(generated, repeat=n)]
    return hyps + [list(p) for p in itertools.product(generated, repeat=max_length)]


def brute_force(log_probs, hyps, alpha):
    """Hypotheses sorted by GNMT-normalized score: (hyps, scores, log_probs)."""
    scores = log_probs / penalty(np.array([len(h) for h in hyps]), alpha)
    order = np.argsort(-scores, kind="stable")
    return [hyps[i] for i in order], scores[order], log_probs[order]


def transformer_brute_force(model, src_row, max_length, alpha):
    hyps = all_hypotheses(max_length)
    return brute_force(teacher_force(model, src_row, hyps)[0], hyps, alpha)


class PrefixModel:
    """A hand-built "model" with a known next-token distribution that depends on the
    whole prefix and on the source, decoded through the same interface as `Transformer`:

      logits_t = A[t] + sum_{j <= t} B[j, fed_j] + sum_s C[src_s],   fed = [bos] + y

    and known "attention maps" (one layer, one head): decoder self-attention row t is
    softmax_{j <= t} G[fed_t, fed_j], cross-attention row t is softmax_s H[fed_t, src_s].
    The per-position terms live in the self-attention cache, so a search that reorders
    beams wrongly gets wrong distributions and wrong maps.
    """

    def __init__(self, a, b, c, g, h, on_step=None):
        self.a, self.b, self.c, self.g, self.h = a, b, c, g, h  # [T,V] [T,V,V] [V,V] [V,V] [V,V]
        self.on_step = on_step  # host callback(position), to count the steps run

    def encode(self, src, return_weights=False):
        valid = src != PAD_ID
        # memory [B, S, V + 1]: the source terms, and the source ids in the last channel
        return jnp.concatenate([self.c[src] * valid[..., None], src[..., None]], -1), valid, None

    def init_decode_state(self, memory, src_valid, max_length):
        batch, vocab = memory.shape[0], self.a.shape[1]
        cache = KVCache.zeros(batch, max_length, 1, vocab, 1)  # key: B[j, fed_j]; value: fed_j
        summary = memory[..., :vocab].sum(1)[:, None, None, :]  # [B, 1, 1, V]
        return DecodeState((cache,), (CrossKV(summary, memory[:, :, None, vocab:], src_valid),))

    def decode_step(self, tokens, state, return_weights=False):
        cache, cross = state.caches[0], state.cross[0]
        pos = cache.index
        if self.on_step is not None:
            jax.debug.callback(self.on_step, pos)
        contribution = self.b[pos][tokens][:, None, None, :]  # [B, 1, 1, V]
        fed = tokens.astype(jnp.float32)[:, None, None, None]
        cache = cache.append(contribution, fed)
        seen = cache.valid_mask()[0, 0, 0]  # [T_max]
        written = jnp.where(seen[None, None, :, None], cache.key, 0.0)  # key [B, H, T, D]
        logits = self.a[pos] + written.sum((1, 2)) + cross.key[:, 0, 0]
        weights = None
        if return_weights:
            fed_j = cache.value[:, 0, :, 0].astype(jnp.int32)  # [B, T_max]
            self_w = jax.nn.softmax(jnp.where(seen, self.g[tokens[:, None], fed_j], -jnp.inf))
            src_ids = cross.value[:, :, 0, 0].astype(jnp.int32)  # [B, S]
            cross_w = jax.nn.softmax(jnp.where(cross.valid, self.h[tokens[:, None], src_ids],
                                               -jnp.inf))
            weights = {"decoder_self": self_w[None, :, None], "cross": cross_w[None, :, None]}
        return logits, DecodeState((cache,), state.cross), weights


def prefix_tables(seed, vocab=VOCAB, max_length=6, scale=1.5, eos_bias=0.0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(max_length, vocab)) * scale
    a[:, EOS_ID] += eos_bias + rng.normal() * 1.5
    b = rng.normal(size=(max_length, vocab, vocab)) * scale
    c = rng.normal(size=(vocab, vocab)) * scale * 0.5
    g, h = rng.normal(size=(2, vocab, vocab)) * 2
    return tuple(jnp.asarray(x, jnp.float32) for x in (a, b, c, g, h))


def prefix_weights(tables, src_row, hyp, max_length):
    """NumPy maps of PrefixModel for [bos] + hyp: (decoder_self [T, T], cross [T, S])."""
    g, h = np.asarray(tables[3], np.float64), np.asarray(tables[4], np.float64)
    src_row = np.asarray(src_row)
    fed = [BOS_ID, *hyp[:-1]]
    self_w = np.zeros((max_length, max_length))
    cross_w = np.zeros((max_length, len(src_row)))
    for t, tok in enumerate(fed):
        e = np.exp(g[tok, fed[: t + 1]])
        self_w[t, : t + 1] = e / e.sum()
        e = np.where(src_row != PAD_ID, np.exp(h[tok, src_row]), 0.0)
        cross_w[t] = e / e.sum()
    return self_w, cross_w


def prefix_log_probs(tables, src_row, hyps):
    """NumPy teacher forcing of PrefixModel: the log-prob of each hypothesis [N]."""
    a, b, c = (np.asarray(x, np.float64) for x in tables[:3])
    width = max(len(h) for h in hyps)
    fed = np.full((len(hyps), width), BOS_ID)
    out = np.zeros((len(hyps), width), int)
    mask = np.zeros((len(hyps), width), bool)
    for i, h in enumerate(hyps):
        fed[i, 1 : len(h)] = h[:-1]
        out[i, : len(h)], mask[i, : len(h)] = h, True
    positions = np.arange(width)
    logits = a[None, :width] + c[nonpad(src_row)].sum(0) + np.cumsum(b[positions, fed], axis=1)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, out[..., None], axis=-1)[..., 0]
    return np.where(mask, picked, 0.0).sum(1)


STEPS = []  # positions fed by PrefixModel (one callback object, so one compilation)


@functools.partial(jax.jit, static_argnames=("beam", "max_length", "return_weights", "nbest"))
def prefix_search(tables, src, alpha, *, beam, max_length, early_exit=True, return_weights=False,
                  nbest=False):
    """beam 0: greedy_search; beam >= 1: the beam search loop itself (no greedy routing)."""
    model = PrefixModel(*tables, on_step=STEPS.append)
    if beam == 0:
        return search.greedy_search(model, src, max_length=max_length,
                                    return_weights=return_weights)
    return beam_search._beam_search(model, src, beam_size=beam, alpha=alpha, max_length=max_length,
                               return_weights=return_weights, early_exit=early_exit,
                               nbest=nbest)


def nonpad(row):
    return np.asarray(row)[np.asarray(row) != PAD_ID]


# ---------------------------------------------------------------- helpers


def test_max_target_length_and_penalty():
    assert search.max_target_length(10) == 25
    assert search.max_target_length([3, 7, 5]) == 21  # ceil(1.5 * 7 + 10) = ceil(20.5)
    assert search.max_target_length(np.array([7]), multiple=8) == 24
    assert search.max_target_length([4], ratio=2.0, extra=0) == 8
    np.testing.assert_allclose(beam_search.gnmt_penalty(7, 0.6), (12 / 6) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(beam_search.gnmt_penalty(3, 0.0), 1.0)


def test_to_token_lists():
    out = search.SearchOutput(
        tokens=np.array([[4, 5, EOS_ID, 0], [1, 4, 4, 5]]), lengths=np.array([3, 4]),
        log_probs=np.zeros(2), scores=np.zeros(2), weights=None,
    )
    assert to_token_lists(out) == [[4, 5], [1, 4, 4, 5]]


def test_prefix_model_matches_its_numpy_reference():
    """The hand-built model's cached decoding agrees with its NumPy teacher forcing."""
    tables = prefix_tables(0)
    out = prefix_search(tables, jnp.asarray(SRC), 0.0, beam=0, max_length=6)
    for b, hyp in enumerate(hypotheses(out)):
        np.testing.assert_allclose(out.log_probs[b], prefix_log_probs(tables, SRC[b], [hyp])[0],
                                   atol=1e-4)


# ---------------------------------------------------------------- exactness (hand-built model)

EXHAUSTIVE_LENGTH = 4
# beams enough for every candidate at every step: 27 live prefixes x (3 tokens + eos)
EXHAUSTIVE_BEAM = len(GENERATED) ** (EXHAUSTIVE_LENGTH - 1) * (len(GENERATED) + 1)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0, -0.5])
def test_exhaustive_beam_equals_brute_force(alpha):
    """With a beam wide enough to keep every candidate, beam search is exact: it returns
    the best of all hypotheses under the GNMT-normalized score. A narrow beam is not."""
    hyps = all_hypotheses(EXHAUSTIVE_LENGTH)
    winners, narrow_misses = set(), 0
    for seed in range(10):
        tables = prefix_tables(seed, max_length=EXHAUSTIVE_LENGTH)
        out = prefix_search(tables, jnp.asarray(SRC), alpha, beam=EXHAUSTIVE_BEAM,
                            max_length=EXHAUSTIVE_LENGTH)
        narrow = prefix_search(tables, jnp.asarray(SRC), alpha, beam=2,
                               max_length=EXHAUSTIVE_LENGTH)
        for b, hyp in enumerate(hypotheses(out)):
            best, scores, lps = brute_force(prefix_log_probs(tables, SRC[b], hyps), hyps, alpha)
            np.testing.assert_allclose(out.scores[b], scores[0], atol=1e-4)
            np.testing.assert_allclose(out.log_probs[b], lps[0], atol=1e-4)
            if scores[0] - scores[1] > 1e-3:
                assert hyp == best[0], (seed, b)
            winners.add((len(best[0]), best[0][-1] == EOS_ID))
            narrow_misses += bool(narrow.scores[b] < scores[0] - 1e-3)
    # the cases are not trivial: winners of several lengths, cut at max_length or not
    assert len(winners) >= 3 and any(not ended for _, ended in winners), winners
    if alpha == 0.6:
        assert narrow_misses >= 1


@pytest.mark.parametrize("beam", [2, 3])
def test_small_beam_returns_a_valid_correctly_scored_hypothesis(beam):
    max_length = 6
    hyps = all_hypotheses(max_length)
    for seed in range(5):
        tables = prefix_tables(seed, max_length=max_length)
        out = prefix_search(tables, jnp.asarray(SRC), 0.6, beam=beam, max_length=max_length)
        for b, hyp in enumerate(hypotheses(out)):
            assert set(hyp[:-1]) <= set(GENERATED) and hyp[-1] in [*GENERATED, EOS_ID]
            assert hyp[-1] == EOS_ID or len(hyp) == max_length
            lp = prefix_log_probs(tables, SRC[b], [hyp])[0]
            np.testing.assert_allclose(out.log_probs[b], lp, atol=1e-4)
            np.testing.assert_allclose(out.scores[b], lp / penalty(len(hyp), 0.6), atol=1e-4)
            _, scores, _ = brute_force(prefix_log_probs(tables, SRC[b], hyps), hyps, 0.6)
            assert out.scores[b] <= scores[0] + 1e-4


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0, -0.5])
def test_early_exit_bound_does_not_change_the_result(alpha):
    """The early exit (store full, no live beam can beat its worst entry) stops only when
    nothing better can come: searching on to max_length finds the same best hypothesis."""
    max_length, exited_early = 6, 0
    for seed in range(10):
        tables = prefix_tables(seed, max_length=max_length, eos_bias=3.0)
        for beam in (2, 3):
            STEPS.clear()
            fast = prefix_search(tables, jnp.asarray(SRC), alpha, beam=beam, max_length=max_length)
            jax.effects_barrier()
            exited_early += max(int(p) for p in STEPS) < max_length - 1
            slow = prefix_search(tables, jnp.asarray(SRC), alpha, beam=beam,
                                 max_length=max_length, early_exit=False)
            np.testing.assert_array_equal(fast.tokens, slow.tokens)
            np.testing.assert_allclose(fast.scores, slow.scores, atol=1e-6)
    assert exited_early >= 2  # the whole batch stopped before max_length


def nbest_lists(out) -> list[list[list[int]]]:
    """Each sentence's n-best entries as token lists (eos included), -inf entries left out."""
    tokens, lengths, scores = (np.asarray(x) for x in (out.tokens, out.lengths, out.scores))
    return [hypotheses(search.SearchOutput(tokens[b][np.isfinite(scores[b])],
                                           lengths[b][np.isfinite(scores[b])], None, None, None))
            for b in range(len(tokens))]


@pytest.mark.parametrize("alpha", [0.0, 0.6, -0.5])
def test_exhaustive_nbest_is_every_hypothesis_best_first(alpha):
    """With a beam as wide as the number of hypotheses, the n-best list is all of them,
    in brute force's order, each with its own log-prob and normalized score."""
    hyps = all_hypotheses(EXHAUSTIVE_LENGTH)
    beam = len(hyps) + 2  # two entries more than there are hypotheses: left at -inf
    for seed in range(4):
        tables = prefix_tables(seed, max_length=EXHAUSTIVE_LENGTH)
        out = prefix_search(tables, jnp.asarray(SRC), alpha, beam=beam,
                            max_length=EXHAUSTIVE_LENGTH, nbest=True)
        assert out.tokens.shape == (len(SRC), beam, EXHAUSTIVE_LENGTH)
        for b, found in enumerate(nbest_lists(out)):
            _, scores, _ = brute_force(prefix_log_probs(tables, SRC[b], hyps), hyps, alpha)
            assert sorted(map(tuple, found)) == sorted(map(tuple, hyps))
            np.testing.assert_allclose(out.scores[b, : len(hyps)], scores, atol=1e-4)
            lp = prefix_log_probs(tables, SRC[b], found)
            np.testing.assert_allclose(out.log_probs[b, : len(hyps)], lp, atol=1e-4)
            assert np.all(np.isneginf(out.scores[b, len(hyps):]))
            assert not np.asarray(out.lengths[b, len(hyps):]).any()  # never filled: empty
            assert not np.asarray(out.tokens[b, len(hyps):]).any()


@pytest.mark.parametrize("beam", [2, 4])
def test_nbest_starts_with_the_beams_hypothesis_and_scores_each_entry(beam):
    """A narrow beam's n-best: entry 0 is beam search's answer; the entries are distinct,
    best first, and each is scored as teacher forcing scores it."""
    max_length = 6
    for seed in range(6):
        tables = prefix_tables(seed, max_length=max_length, eos_bias=1.0)
        one = prefix_search(tables, jnp.asarray(SRC), 0.6, beam=beam, max_length=max_length)
        out = prefix_search(tables, jnp.asarray(SRC), 0.6, beam=beam, max_length=max_length,
                            nbest=True)
        np.testing.assert_array_equal(out.tokens[:, 0], one.tokens)
        np.testing.assert_array_equal(out.lengths[:, 0], one.lengths)
        np.testing.assert_allclose(out.scores[:, 0], one.scores, atol=1e-6)
        for b, found in enumerate(nbest_lists(out)):
            assert len(found) == beam and len(set(map(tuple, found))) == beam
            assert np.all(np.diff(np.asarray(out.scores[b])) <= 1e-6)
            lp = prefix_log_probs(tables, SRC[b], found)
            np.testing.assert_allclose(out.log_probs[b], lp, atol=1e-4)
            lengths = np.array([len(h) for h in found])
            np.testing.assert_allclose(out.scores[b], lp / penalty(lengths, 0.6), atol=1e-4)


def test_beam_loop_with_one_beam_and_no_penalty_is_greedy():
    """The beam machinery itself (first step, admission, reordering, stopping) with one beam."""
    for seed in range(10):
        tables = prefix_tables(seed)
        greedy = prefix_search(tables, jnp.asarray(SRC), 0.0, beam=0, max_length=6)
        beam = prefix_search(tables, jnp.asarray(SRC), 0.0, beam=1, max_length=6)
        np.testing.assert_array_equal(greedy.tokens, beam.tokens)
        np.testing.assert_array_equal(greedy.lengths, beam.lengths)
        np.testing.assert_allclose(greedy.log_probs, beam.log_probs, atol=1e-5)


@pytest.mark.parametrize("beam", [0, 3])
def test_recorded_maps_follow_the_returned_hypothesis(beam):
    """The maps recorded during the search are those of the returned hypothesis, row t
    being the step that fed token t of [bos] + hypothesis, however its beam moved."""
    max_length = 6
    for seed in range(8):
        tables = prefix_tables(seed, max_length=max_length)
        out = prefix_search(tables, jnp.asarray(SRC), 0.6, beam=beam, max_length=max_length,
                            return_weights=True)
        plain = prefix_search(tables, jnp.asarray(SRC), 0.6, beam=beam, max_length=max_length)
        np.testing.assert_array_equal(out.tokens, plain.tokens)
        w = jax.tree.map(np.asarray, out.weights)
        assert w["decoder_self"].shape == (1, len(SRC), 1, max_length, max_length)
        assert w["cross"].shape == (1, len(SRC), 1, max_length, SRC.shape[1])
        for b, hyp in enumerate(hypotheses(out)):
            self_w, cross_w = prefix_weights(tables, SRC[b], hyp, max_length)
            n = len(hyp)
            np.testing.assert_allclose(w["decoder_self"][0, b, 0], np.where(
                np.arange(max_length)[:, None] < n, self_w, 0.0), atol=1e-5)
            np.testing.assert_allclose(w["cross"][0, b, 0], np.where(
                np.arange(max_length)[:, None] < n, cross_w, 0.0), atol=1e-5)


# ---------------------------------------------------------------- the Transformer


@pytest.mark.parametrize("alpha", [0.6, -0.5])
def test_transformer_exhaustive_beam_equals_brute_force(alpha):
    max_length = 3
    beam = len(GENERATED) ** (max_length - 1) * (len(GENERATED) + 1)  # 36
    winners = set()
    for seed in range(4):
        model = make_model(seed)
        out = translate(model, SRC, beam_size=beam, length_penalty=alpha,
                               max_length=max_length)
        for b, hyp in enumerate(hypotheses(out)):
            best, scores, lps = transformer_brute_force(model, SRC[b], max_length, alpha)
            np.testing.assert_allclose(out.scores[b], scores[0], atol=1e-5)
            if scores[0] - scores[1] > 1e-3:
                assert hyp == best[0]
                np.testing.assert_allclose(out.log_probs[b], lps[0], atol=1e-5)
            winners.add(len(best[0]))
    assert len(winners) >= 2


def test_greedy_cached_equals_uncached():
    """Cached greedy == argmax of the full teacher-forced model re-run on the growing prefix."""
    model = make_model(1)
    max_length = 6
    out = translate(model, SRC, beam_size=1, max_length=max_length, length_penalty=0.6)
    for b in range(len(SRC)):
        prefix, total = [BOS_ID], 0.0
        for _ in range(max_length):
            tgt_in = np.zeros((1, max_length), np.int32)  # causal: the padding changes nothing
            tgt_in[0, : len(prefix)] = prefix
            lp, _ = _teacher_forced(model, jnp.asarray(SRC[b : b + 1]), jnp.asarray(tgt_in))
            lp = np.asarray(lp[0, len(prefix) - 1]).copy()
            lp[[PAD_ID, BOS_ID]] = -np.inf
            token = int(np.argmax(lp))
            total += lp[token]
            prefix.append(token)
            if token == EOS_ID:
                break
        assert hypotheses(out)[b] == prefix[1:]
        np.testing.assert_allclose(out.log_probs[b], total, atol=1e-5)
        np.testing.assert_allclose(out.scores[b], total / penalty(len(prefix) - 1, 0.6), atol=1e-5)


@functools.partial(nnx.jit, static_argnames=("max_length",))
def _greedy(model, src, max_length):
    return search.greedy_search(model, src, max_length=max_length)


def test_greedy_equals_beam_size_one():
    for seed in (0, 2):
        model = make_model(seed)
        greedy = _greedy(model, jnp.asarray(SRC), max_length=6)
        one = translate(model, SRC, beam_size=1, length_penalty=0.6, max_length=6)
        np.testing.assert_array_equal(greedy.tokens, one.tokens)
        np.testing.assert_array_equal(greedy.lengths, one.lengths)
        np.testing.assert_allclose(greedy.log_probs, one.log_probs, atol=1e-5)
        np.testing.assert_allclose(greedy.scores, greedy.log_probs)
        np.testing.assert_allclose(one.scores, greedy.log_probs / penalty(greedy.lengths, 0.6),
                                   atol=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_recorded_weights_equal_teacher_forced(beam):
    model = make_model(2)
    max_length = 6
    out = translate(model, SRC, beam_size=beam, max_length=max_length, return_weights=True)
    w = jax.tree.map(np.asarray, out.weights)
    layers, heads = len(model.decoder_layers), model.decoder_layers[0].self_attention.num_heads
    assert w["decoder_self"].shape == (layers, len(SRC), heads, max_length, max_length)
    assert w["cross"].shape == (layers, len(SRC), heads, max_length, SRC.shape[1])
    assert w["encoder_self"].shape == (1, len(SRC), heads, SRC.shape[1], SRC.shape[1])
    plain = translate(model, SRC, beam_size=beam, max_length=max_length)
    assert plain.weights is None
    np.testing.assert_array_equal(plain.tokens, out.tokens)
    np.testing.assert_allclose(plain.scores, out.scores, atol=1e-6)
    for b, hyp in enumerate(hypotheses(out)):
        n = len(hyp)
        _, tf = teacher_force(model, SRC[b], [hyp], max_length=max_length)
        np.testing.assert_allclose(w["encoder_self"][:, b], tf["encoder_self"][:, 0], atol=1e-5)
        np.testing.assert_allclose(w["decoder_self"][:, b, :, :n], tf["decoder_self"][:, 0, :, :n],
                                   atol=1e-5)
        np.testing.assert_allclose(w["cross"][:, b, :, :n], tf["cross"][:, 0, :, :n], atol=1e-5)
        # rows sum to 1 over valid keys; future keys, padded keys, rows past the end: 0
        self_w, cross_w = w["decoder_self"][:, b], w["cross"][:, b]
        np.testing.assert_allclose(self_w[:, :, :n].sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(cross_w[:, :, :n].sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(self_w, k=1) == 0)
        assert np.all(self_w[:, :, n:] == 0) and np.all(cross_w[:, :, n:] == 0)
        assert np.all(cross_w[..., SRC[b] == PAD_ID] == 0)


@pytest.mark.parametrize("beam", [1, 3])
def test_batch_independence(beam):
    """A sentence decodes the same alone (no padding) as inside a padded batch."""
    model = make_model(2)
    batch = translate(model, SRC, beam_size=beam, max_length=6, return_weights=True)
    for b in (1,):  # the most padded one
        row = nonpad(SRC[b])
        alone = translate(model, row[None], beam_size=beam, max_length=6,
                                 return_weights=True)
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[b])
        np.testing.assert_array_equal(alone.lengths[0], batch.lengths[b])
        np.testing.assert_allclose(alone.scores[0], batch.scores[b], atol=1e-5)
        np.testing.assert_allclose(alone.weights["decoder_self"][:, 0],
                                   batch.weights["decoder_self"][:, b], atol=1e-5)
        np.testing.assert_allclose(alone.weights["cross"][:, 0],
                                   batch.weights["cross"][:, b, :, :, : len(row)], atol=1e-5)


def test_no_recompilation():
    """Same shapes: one compilation, whatever the values, length penalty or parameters."""
    jitted = _translate_jit
    before = jitted._cache_size()
    model = make_model(0)
    first = translate(model, SRC, beam_size=3, max_length=6)
    after_first = jitted._cache_size()
    assert after_first <= before + 1
    translate(model, SRC[:, ::-1].copy(), beam_size=3, max_length=6, length_penalty=1.0)
    second = translate(make_model(1), SRC, beam_size=3, max_length=6)
    assert jitted._cache_size() == after_first
    assert not np.allclose(first.scores, second.scores)


def test_filler_rows_are_done_from_the_start():
    """All-pad rows (eval batches filled up to their size) never hold the loop: a sentence
    decodes the same beside them, and they produce nothing (length 0, greedy or beam)."""
    config = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, num_heads=2,
                         num_encoder_layers=1, num_decoder_layers=1, d_ff=32, dropout=0.0)
    model = Transformer(config, rngs=nnx.Rngs(0))
    src = jnp.array([[5, 6, 7, EOS_ID]])
    padded = jnp.concatenate([src, jnp.zeros((3, 4), jnp.int32)])
    # jitted (one program a shape), as decoding runs: op by op, a cold compilation cache
    # compiles each of the loop's operations on its own
    for decode in (lambda s: _greedy(model, s, max_length=12),
                   lambda s: translate(model, s, beam_size=3, max_length=12)):
        alone, together = decode(src), decode(padded)
        np.testing.assert_array_equal(np.asarray(together.tokens[0]), np.asarray(alone.tokens[0]))
    for out in (_greedy(model, padded, max_length=12),
                translate(model, padded, beam_size=3, max_length=12)):
        assert np.asarray(out.lengths)[1:].tolist() == [0, 0, 0]
        assert not np.asarray(out.tokens)[1:].any()


def test_transformer_nbest_entry_zero_is_the_translation_and_entries_score_as_forced():
    """models/translate.py's n-best on a Transformer: entry 0 is `translate`'s answer, and
    each entry's log-prob is what teacher forcing it gives."""
    from models.translate import to_nbest_lists, translate_split

    model = make_model(3, eos_bias=1.0)
    graphdef, state = nnx.split(model)
    one = translate(model, SRC, beam_size=4, length_penalty=0.6, max_length=6)
    out = translate_split(graphdef, state, SRC, beam_size=4, length_penalty=0.6, max_length=6,
                          nbest=True)
    np.testing.assert_array_equal(out.tokens[:, 0], one.tokens)
    np.testing.assert_allclose(out.scores[:, 0], one.scores, atol=1e-6)
    lists = to_nbest_lists(jax.device_get(out))
    assert lists[0][0] == (to_token_lists(one)[0], pytest.approx(float(one.scores[0])))
    assert all(len(x) == 4 for x in lists)
    for b, found in enumerate(nbest_lists(out)):
        forced, _ = teacher_force(model, SRC[b], found, max_length=6)
        np.testing.assert_allclose(out.log_probs[b], forced, atol=1e-4)


def test_sequence_log_probs_equal_the_searchs_for_every_nbest_entry():
    """Teacher forcing a corpus's pairs (models/translate.py) gives each n-best entry the
    log-prob the search summed for it, whatever batch and padding it lands in."""
    from models.translate import sequence_log_probs, to_nbest_lists, translate_split

    model = make_model(3, eos_bias=1.0)
    graphdef, state = nnx.split(model)
    out = jax.device_get(translate_split(graphdef, state, SRC, beam_size=3, length_penalty=0.6,
                                         max_length=8, nbest=True))
    lists = to_nbest_lists(out)
    ended = [(b, j) for b in range(len(SRC)) for j in range(3)
             if out.tokens[b, j, out.lengths[b, j] - 1] == EOS_ID]
    assert len(ended) >= 6
    sources = [nonpad(SRC[b]).tolist() for b, _ in ended]
    targets = [lists[b][j][0] for b, j in ended]
    got = sequence_log_probs(model, sources, targets, batch_size=4, bucket_step=3)
    np.testing.assert_allclose(got, [out.log_probs[b, j] for b, j in ended], atol=1e-4)
