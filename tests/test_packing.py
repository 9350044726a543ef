"""Sequence packing (data/packing.py): the same pairs, fewer positions, the same maths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention.masks import segment_mask
from configs.model import ModelConfig
from data.batching import make_batch
from data.packing import pack_batch
from models.transformer import Transformer
from training.step import batch_loss


def random_batch(rng: np.random.Generator, pairs: int, vocab: int = 50, max_len: int = 20,
                 pad_rows: int = 2):
    sources = [list(rng.integers(4, vocab, rng.integers(1, max_len))) + [3] for _ in range(pairs)]
    targets = [list(rng.integers(4, vocab, rng.integers(1, max_len))) for _ in range(pairs)]
    src_len = max(len(s) for s in sources)
    tgt_len = max(len(t) for t in targets) + 1
    return make_batch(sources, targets, range(pairs), pairs + pad_rows, src_len, tgt_len)


def pairs_of(batch) -> list[tuple]:
    """The (source, decoder input, decoder target) token tuples of a padded or packed batch."""
    out = []
    if "src_segments" not in batch:
        for r in range(batch["src"].shape[0]):
            s, t = batch["src"][r], batch["tgt_out"][r]
            if s.any() or t.any():
                out.append((tuple(s[s > 0]), tuple(batch["tgt_in"][r][t > 0]), tuple(t[t > 0])))
        return sorted(out)
    for r in range(batch["src"].shape[0]):
        for seg in range(1, batch["src_segments"][r].max() + 1):
            s = batch["src_segments"][r] == seg
            t = batch["tgt_segments"][r] == seg
            out.append((tuple(batch["src"][r][s]), tuple(batch["tgt_in"][r][t]),
                        tuple(batch["tgt_out"][r][t])))
    return sorted(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packing_keeps_every_pair_and_lays_out_segments(seed):
    rng = np.random.default_rng(seed)
    batch = random_batch(rng, pairs=int(rng.integers(5, 40)))
    packed = pack_batch(batch, length=24, rows_multiple=8)
    assert pairs_of(packed) == pairs_of(batch)
    assert packed["num_tokens"] == batch["num_tokens"]
    rows, length = packed["src"].shape
    assert rows % 8 == 0 and length >= 24 and length % 8 == 0
    assert packed["src"].size + packed["tgt_out"].size <= batch["src"].size + batch["tgt_out"].size + 2 * 8 * length
    for side in ("src", "tgt"):
        seg, pos = packed[f"{side}_segments"], packed[f"{side}_positions"]
        for r in range(rows):
            ids = seg[r][seg[r] > 0]
            assert np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)  # contiguous runs 1, 2, ..
            assert np.all(seg[r][len(ids):] == 0)  # padding only at the end of a row
            for k in np.unique(ids):
                np.testing.assert_array_equal(pos[r][seg[r] == k], np.arange(np.sum(ids == k)))
        ids = packed["src" if side == "src" else "tgt_out"]
        np.testing.assert_array_equal(ids > 0, seg > 0)
    # A pair is on the same row with the same segment number on both sides.
    np.testing.assert_array_equal(packed["src_segments"].max(1), packed["tgt_segments"].max(1))


def test_long_sentences_widen_the_row():
    batch = random_batch(np.random.default_rng(3), pairs=6, max_len=60)
    packed = pack_batch(batch, length=16)
    longest = max(np.count_nonzero(batch["src"], 1).max(), np.count_nonzero(batch["tgt_out"], 1).max())
    assert packed["src"].shape[1] >= longest and packed["src"].shape[1] % 8 == 0
    assert pairs_of(packed) == pairs_of(batch)


def test_segment_mask_matches_numpy():
    q = np.array([[1, 1, 2, 2, 0], [1, 2, 3, 0, 0]])
    k = np.array([[1, 2, 2, 0], [3, 3, 1, 2]])
    expected = (q[:, None, :, None] == k[:, None, None, :]) & (k > 0)[:, None, None, :]
    np.testing.assert_array_equal(np.asarray(segment_mask(jnp.asarray(q), jnp.asarray(k))), expected)


def tiny_model() -> Transformer:
    config = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, num_heads=4,
                         num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.0,
                         max_positions=256)
    return Transformer(config, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_packed_loss_and_gradients_equal_the_padded_ones(seed):
    """Packing changes only which positions are computed: every pair's loss and the
    gradient of their sum are those of the padded batch."""
    model = tiny_model()
    graphdef, params = nnx.split(model, nnx.Param)
    batch = random_batch(np.random.default_rng(seed), pairs=25)
    packed = pack_batch(batch, length=32, rows_multiple=4)
    assert packed["src"].size < batch["src"].size  # the point of packing

    def sums(p, b):
        b = {k: jnp.asarray(v) for k, v in b.items() if k != "num_tokens"}
        return batch_loss(nnx.merge(graphdef, p), b, label_smoothing=0.1)[1]

    def total(p, b):
        return sums(p, b)["loss_sum"]

    padded_sums, packed_sums = sums(params, batch), sums(params, packed)
    for key in ("loss_sum", "nll_sum", "tokens"):
        np.testing.assert_allclose(float(packed_sums[key]), float(padded_sums[key]), rtol=2e-5)
    padded_grads = jax.grad(total)(params, batch)
    packed_grads = jax.grad(total)(params, packed)
    for a, b in zip(jax.tree.leaves(packed_grads), jax.tree.leaves(padded_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)


def test_packed_rows_keep_few_shapes():
    from data.packing import packed_rows

    # Nominal 64 rows (a 4,096-position batch in rows of 64): multiples of 8 in [32, 64],
    # multiples of 32 beyond.
    assert [packed_rows(n, 64, 8) for n in (1, 10, 33, 50, 56, 57, 64)] == [32, 32, 40, 56, 56, 64, 64]
    assert [packed_rows(n, 64, 8) for n in (65, 90, 97)] == [96, 96, 128]
    assert packed_rows(3, 2, 8) == 8  # tiny batches: at least one multiple
