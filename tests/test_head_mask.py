"""Head masks (Michel et al. 2019): free when absent, exact when all ones, a removed head
contributes nothing, per-row masks equal separate runs; in teacher forcing and search."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention import CrossAttention
from configs.model import ModelConfig
from models.beam_search import beam_search
from models.search import greedy_search
from models.transformer import Transformer

KINDS = ("encoder_self", "decoder_self", "cross")


def tiny_model(seed: int = 0) -> Transformer:
    config = ModelConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=32, num_heads=4,
                         num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.0)
    return Transformer(config, rngs=nnx.Rngs(seed))


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, 40, (3, 7)).astype(np.int32)
    src[:, -1], src[0, 4:] = 3, 0  # eos; one padded row
    src[0, 3] = 3
    tgt = rng.integers(4, 40, (3, 6)).astype(np.int32)
    tgt[:, 0] = 2
    return jnp.asarray(src), jnp.asarray(tgt)


def ones(model, value=1.0):
    return {k: jnp.full((2, 4), value, jnp.float32) for k in KINDS}


def test_all_ones_mask_reproduces_the_unmasked_model_exactly():
    model, (src, tgt) = tiny_model(), batch()
    plain, plain_w = model(src, tgt, return_weights=True)
    masked, masked_w = model(src, tgt, return_weights=True, head_mask=ones(model))
    np.testing.assert_array_equal(np.asarray(masked), np.asarray(plain))
    for kind in KINDS:
        np.testing.assert_array_equal(np.asarray(masked_w[kind]), np.asarray(plain_w[kind]))
    for search in (lambda **kw: greedy_search(model, src, max_length=9, **kw),
                   lambda **kw: beam_search(model, src, beam_size=3, max_length=9, **kw)):
        a, b = search(), search(head_mask=ones(model))
        np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
        np.testing.assert_array_equal(np.asarray(a.scores), np.asarray(b.scores))


def test_a_cross_attention_layer_with_every_head_masked_ignores_the_source():
    layer = CrossAttention(16, 4, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 5, 16))
    memories = [jax.random.normal(jax.random.key(k), (2, 6, 16)) for k in (2, 3)]
    valid = jnp.ones((2, 6), bool)
    outs = [layer(x, m, valid, head_mask=jnp.zeros(4))[0] for m in memories]
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(outs[1]), atol=0)
    kept = [layer(x, m, valid, head_mask=jnp.array([0.0, 1.0, 0.0, 0.0]))[0] for m in memories]
    assert not np.allclose(np.asarray(kept[0]), np.asarray(kept[1]))

    # The whole model: with every cross-attention head removed the source cannot matter.
    model, (src, tgt) = tiny_model(), batch()
    mask = {"cross": jnp.zeros((2, 4))}
    other_src = jnp.where(src > 3, (src + 5) % 36 + 4, src)
    a, _ = model(src, tgt, head_mask=mask)
    b, _ = model(other_src, tgt, head_mask=mask)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    c, _ = model(other_src, tgt)
    assert not np.allclose(np.asarray(a), np.asarray(c), atol=1e-3)


@pytest.mark.slow
def test_per_row_masks_equal_one_run_per_mask():
    """[L, B, H] masks: B copies of one sentence, each with its own mask, in one batch."""
    model, (src, tgt) = tiny_model(), batch()
    rng = np.random.default_rng(0)
    masks = [{k: jnp.asarray(rng.integers(0, 2, (2, 4)), jnp.float32) for k in KINDS}
             for _ in range(3)]
    stacked = {k: jnp.stack([m[k] for m in masks], axis=1) for k in KINDS}  # [L, B, H]
    rows = jnp.repeat(src[1:2], 3, axis=0), jnp.repeat(tgt[1:2], 3, axis=0)
    together, _ = model(*rows, head_mask=stacked)
    beams = beam_search(model, rows[0], beam_size=2, max_length=9, head_mask=stacked)
    greedy = greedy_search(model, rows[0], max_length=9, head_mask=stacked)
    for i, mask in enumerate(masks):
        alone, _ = model(src[1:2], tgt[1:2], head_mask=mask)
        np.testing.assert_allclose(np.asarray(together[i]), np.asarray(alone[0]), rtol=1e-5,
                                   atol=1e-5)
        one = beam_search(model, src[1:2], beam_size=2, max_length=9, head_mask=mask)
        np.testing.assert_array_equal(np.asarray(beams.tokens[i]), np.asarray(one.tokens[0]))
        one = greedy_search(model, src[1:2], max_length=9, head_mask=mask)
        np.testing.assert_array_equal(np.asarray(greedy.tokens[i]), np.asarray(one.tokens[0]))
