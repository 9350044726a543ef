"""Attention library against NumPy references and invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention import (
    CausalSelfAttention,
    CrossAttention,
    CrossKV,
    MultiHeadAttention,
    SelfAttention,
    causal_mask,
    combine_masks,
    dot_product_attention,
    key_padding_mask,
    padding_mask,
)


def np_attention(q, k, v, mask):
    """NumPy reference. q [B,Tq,H,Dk], k [B,Tk,H,Dk], v [B,Tk,H,Dv], mask bool [B,H,Tq,Tk]."""
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(mask, logits, -np.inf)
    row_max = np.max(np.where(mask, logits, -1e300), axis=-1, keepdims=True)
    e = np.where(mask, np.exp(logits - row_max), 0.0)
    denom = e.sum(-1, keepdims=True)
    w = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    return np.einsum("bhqk,bkhd->bqhd", w, v), w


def np_mha(module, xq, xkv, mask):
    """NumPy reference of a whole MultiHeadAttention module (projections included)."""
    def lin(layer, x):
        return np.asarray(x) @ np.asarray(layer.kernel[...]) + np.asarray(layer.bias[...])

    b, tq, _ = xq.shape
    tk = xkv.shape[1]
    h = module.num_heads
    q = lin(module.query, xq).reshape(b, tq, h, module.key_dim)
    k = lin(module.key, xkv).reshape(b, tk, h, module.key_dim)
    v = lin(module.value, xkv).reshape(b, tk, h, module.value_dim)
    out, w = np_attention(q, k, v, np.broadcast_to(mask, (b, h, tq, tk)))
    return lin(module.out, out.reshape(b, tq, h * module.value_dim)), w


def lengths_to_valid(lengths, total):
    return np.arange(total)[None, :] < np.asarray(lengths)[:, None]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_masks_shapes_and_values():
    valid_q = jnp.array([[1, 1, 0]], bool)
    valid_k = jnp.array([[1, 0, 1, 1]], bool)
    assert key_padding_mask(valid_k).shape == (1, 1, 1, 4)
    pm = padding_mask(valid_q, valid_k)
    assert pm.shape == (1, 1, 3, 4)
    np.testing.assert_array_equal(pm[0, 0], np.outer([1, 1, 0], [1, 0, 1, 1]).astype(bool))
    cm = causal_mask(3)
    np.testing.assert_array_equal(cm[0, 0], np.tril(np.ones((3, 3), bool)))
    np.testing.assert_array_equal(causal_mask(2, 4, offset=2)[0, 0], [[1, 1, 1, 0], [1, 1, 1, 1]])
    both = combine_masks(cm, None, key_padding_mask(jnp.array([[1, 1, 0]], bool)))
    np.testing.assert_array_equal(both[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert combine_masks(None, None) is None


@pytest.mark.parametrize("implementation", ["reference", "xla"])
def test_core_matches_numpy_with_fully_masked_row(rng, implementation):
    b, tq, tk, h, d = 2, 4, 5, 3, 8
    q, k, v = (rng.normal(size=(b, t, h, d)).astype(np.float32) for t in (tq, tk, tk))
    mask = rng.random((b, 1, tq, tk)) > 0.3
    mask[0, 0, 2] = False  # a row with no valid key must give zeros, not NaN
    out, w = dot_product_attention(q, k, v, jnp.asarray(mask), implementation=implementation)
    ref_out, ref_w = np_attention(q, k, v, np.broadcast_to(mask, (b, h, tq, tk)))
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    assert w is None
    if implementation == "reference":
        _, w = dot_product_attention(q, k, v, jnp.asarray(mask), return_weights=True)
        np.testing.assert_allclose(w, ref_w, atol=1e-6)
        assert np.all(np.asarray(w)[np.broadcast_to(~mask, w.shape)] == 0.0)
        assert np.all(np.asarray(w)[0, :, 2] == 0.0)
        assert np.all(np.isfinite(out))


def test_fused_and_reference_paths_agree(rng):
    b, t, h, d = 3, 7, 4, 16
    q, k, v = (jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32) for _ in range(3))
    mask = combine_masks(causal_mask(t), key_padding_mask(jnp.asarray(lengths_to_valid([7, 4, 1], t))))
    fused, _ = dot_product_attention(q, k, v, mask, implementation="xla")
    ref, w = dot_product_attention(q, k, v, mask, return_weights=True)
    np.testing.assert_allclose(fused, ref, atol=1e-5)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-5)


def test_self_attention_matches_numpy_and_invariants(rng):
    m = SelfAttention(12, num_heads=3, qkv_features=12, value_features=6, rngs=nnx.Rngs(1))
    x = rng.normal(size=(2, 5, 12)).astype(np.float32)
    valid = lengths_to_valid([5, 3], 5)
    y, w = m(jnp.asarray(x), jnp.asarray(valid), return_weights=True)
    ref_y, ref_w = np_mha(m, x, x, valid[:, None, None, :])
    np.testing.assert_allclose(y, ref_y, atol=1e-5)
    np.testing.assert_allclose(w, ref_w, atol=1e-6)
    assert w.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)
    assert np.all(np.asarray(w)[1, :, :, 3:] == 0.0)
    # Changing a padded token does not change any valid output.
    x2 = x.copy()
    x2[1, 3:] = rng.normal(size=(2, 12))
    y2, _ = m(jnp.asarray(x2), jnp.asarray(valid))
    np.testing.assert_allclose(np.asarray(y2)[1, :3], np.asarray(y)[1, :3], atol=1e-6)


def test_causal_self_attention_matches_numpy_and_ignores_future(rng):
    m = CausalSelfAttention(8, num_heads=2, rngs=nnx.Rngs(2))
    x = rng.normal(size=(2, 6, 8)).astype(np.float32)
    valid = lengths_to_valid([6, 4], 6)
    y, w = m(jnp.asarray(x), jnp.asarray(valid), return_weights=True)
    mask = np.tril(np.ones((6, 6), bool))[None, None] & valid[:, None, None, :]
    ref_y, ref_w = np_mha(m, x, x, mask)
    np.testing.assert_allclose(y, ref_y, atol=1e-5)
    np.testing.assert_allclose(w, ref_w, atol=1e-6)
    assert np.all(np.triu(np.asarray(w), k=1) == 0.0)
    # A change at position 3 leaves positions 0..2 unchanged.
    x2 = x.copy()
    x2[:, 3] += 1.0
    y2, _ = m(jnp.asarray(x2), jnp.asarray(valid))
    np.testing.assert_allclose(np.asarray(y2)[:, :3], np.asarray(y)[:, :3], atol=1e-6)
    assert not np.allclose(np.asarray(y2)[0, 3:], np.asarray(y)[0, 3:])


def test_cross_attention_matches_numpy_with_padding_on_both_sides(rng):
    m = CrossAttention(8, num_heads=2, kv_in_features=10, value_features=4, rngs=nnx.Rngs(3))
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    memory = rng.normal(size=(2, 7, 10)).astype(np.float32)
    src_valid = lengths_to_valid([7, 2], 7)
    y, w = m(jnp.asarray(x), jnp.asarray(memory), jnp.asarray(src_valid), return_weights=True)
    ref_y, ref_w = np_mha(m, x, memory, src_valid[:, None, None, :])
    np.testing.assert_allclose(y, ref_y, atol=1e-5)
    np.testing.assert_allclose(w, ref_w, atol=1e-6)
    assert w.shape == (2, 2, 3, 7)
    assert np.all(np.asarray(w)[1, :, :, 2:] == 0.0)
    # Padded source positions may hold anything.
    memory2 = memory.copy()
    memory2[1, 2:] = 100.0
    y2, _ = m(jnp.asarray(x), jnp.asarray(memory2), jnp.asarray(src_valid))
    np.testing.assert_allclose(y2, y, atol=1e-5)


def test_general_mha_rejects_bad_head_split():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, num_heads=3, rngs=nnx.Rngs(0))


def test_capture_off_gives_no_weights_and_same_outputs(rng):
    m = CausalSelfAttention(16, num_heads=4, rngs=nnx.Rngs(4))  # Dk == Dv: fused path when off
    x = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
    valid = jnp.asarray(lengths_to_valid([5, 2], 5))
    y_off, w_off = m(x, valid)
    y_on, w_on = m(x, valid, return_weights=True)
    assert w_off is None and w_on is not None
    np.testing.assert_allclose(y_off, y_on, atol=1e-5)


def test_cached_decoding_equals_full_causal_pass(rng):
    m = CausalSelfAttention(8, num_heads=2, value_features=6, rngs=nnx.Rngs(5))
    x = jnp.asarray(rng.normal(size=(2, 6, 8)), jnp.float32)
    full, full_w = m(x, jnp.ones((2, 6), bool), return_weights=True)
    cache = m.init_cache(batch=2, max_length=6)
    step_fn = jax.jit(lambda xt, c: m.step(xt, c, return_weights=True))
    for t in range(6):
        out, cache, w = step_fn(x[:, t:t + 1], cache)
        np.testing.assert_allclose(out[:, 0], full[:, t], atol=1e-5)
        np.testing.assert_allclose(w[:, :, 0, : t + 1], full_w[:, :, t, : t + 1], atol=1e-6)
        assert np.all(np.asarray(w)[:, :, 0, t + 1:] == 0.0)
    assert int(cache.index) == 6


def test_cross_attention_projects_memory_once(rng):
    m = CrossAttention(8, num_heads=2, rngs=nnx.Rngs(6))
    memory = jnp.asarray(rng.normal(size=(1, 4, 8)), jnp.float32)
    valid = jnp.ones((1, 4), bool)
    calls = {"kv": 0}
    original = m.project_kv

    def counting_project_kv(x):
        calls["kv"] += 1
        return original(x)

    m.project_kv = counting_project_kv
    kv = m.precompute(memory, valid)
    assert isinstance(kv, CrossKV)
    steps = [m(jnp.asarray(rng.normal(size=(1, 1, 8)), jnp.float32), kv)[0] for _ in range(5)]
    assert calls["kv"] == 1 and len(steps) == 5
    # Same result as projecting on the fly.
    x = jnp.ones((1, 1, 8))
    np.testing.assert_allclose(m(x, kv)[0], m(x, memory, valid)[0], atol=1e-6)


def test_gradients_finite_and_match_finite_differences(rng):
    # Logits are float32 by design, so use float32 inputs and a step large enough for float32.
    q, k = (rng.normal(size=(1, 3, 2, 4)).astype(np.float32) for _ in range(2))
    v = rng.normal(size=(1, 3, 2, 3)).astype(np.float32)
    mask = jnp.asarray(np.tril(np.ones((3, 3), bool))[None, None])

    def loss(q, k, v):
        out, _ = dot_product_attention(q, k, v, mask, implementation="reference")
        return jnp.sum(out**2)

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    eps = 1e-2  # float32: rounding (~1e-6 / eps) and truncation (~eps**2) both well under the tolerance
    for arg, grad in enumerate(grads):
        assert np.all(np.isfinite(grad))
        for idx in [(0, 0, 0, 0), (0, 2, 1, 2), (0, 1, 1, 1), (0, 2, 0, 1)]:
            plus = [q.copy(), k.copy(), v.copy()]
            minus = [q.copy(), k.copy(), v.copy()]
            plus[arg][idx] += eps
            minus[arg][idx] -= eps
            numeric = (float(loss(*plus)) - float(loss(*minus))) / (2 * eps)
            np.testing.assert_allclose(grad[idx], numeric, rtol=2e-3, atol=2e-4)


def test_attention_dropout_only_with_rng_and_keeps_weights_clean(rng):
    q, k, v = (jnp.asarray(rng.normal(size=(1, 4, 2, 8)), jnp.float32) for _ in range(3))
    a, _ = dot_product_attention(q, k, v, dropout_rate=0.5)
    b, _ = dot_product_attention(q, k, v, dropout_rate=0.5, implementation="reference")
    np.testing.assert_allclose(a, b, atol=1e-5)
    c, w = dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(0),
                                 return_weights=True)
    assert not np.allclose(c, b)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)  # weights are pre-dropout


def test_bf16_compute_keeps_float32_softmax(rng):
    m = SelfAttention(16, num_heads=2, dtype=jnp.bfloat16, rngs=nnx.Rngs(7))
    x = jnp.asarray(rng.normal(size=(1, 4, 16)), jnp.float32)
    y, w = m(x, jnp.ones((1, 4), bool), return_weights=True)
    assert y.dtype == jnp.bfloat16
    assert w.dtype == jnp.float32
    assert m.query.kernel[...].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-5)
