"""models/layers.py: the embedding lookup's hand-written gradient and the weight initialisations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.layers import embedding_lookup


@pytest.mark.parametrize("grad", ["scatter", "one_hot", "auto"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embedding_lookup_matches_take_and_its_gradient(grad, dtype):
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(11, 6)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 11, size=(3, 9)))  # repeats: several adds per row
    cotangent = jnp.asarray(rng.normal(size=(3, 9, 6)), jnp.float32)

    def ours(t):
        return jnp.sum(embedding_lookup(t, ids, dtype, grad).astype(jnp.float32) * cotangent)

    def reference(t):
        return jnp.sum(jnp.take(t, ids, axis=0).astype(dtype).astype(jnp.float32) * cotangent)

    np.testing.assert_array_equal(embedding_lookup(table, ids, dtype, grad),
                                  jnp.take(table, ids, axis=0).astype(dtype))
    got, want = jax.grad(ours)(table), jax.grad(reference)(table)
    assert got.dtype == jnp.float32
    # NumPy reference: every occurrence of a row adds its cotangent there.
    expected = np.zeros((11, 6))
    np.add.at(expected, np.asarray(ids).reshape(-1),
              np.asarray(cotangent.astype(dtype).astype(jnp.float32)).reshape(-1, 6))
    tol = 1e-6 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)
    np.testing.assert_allclose(want, expected, rtol=tol, atol=tol)
    unused = np.setdiff1d(np.arange(11), np.asarray(ids))
    assert np.all(np.asarray(got)[unused] == 0)


def test_embedding_lookup_refuses_an_unknown_gradient():
    table, ids = jnp.ones((4, 2)), jnp.zeros((1, 3), jnp.int32)
    with pytest.raises(ValueError, match="embedding_grad"):
        jax.grad(lambda t: embedding_lookup(t, ids, jnp.float32, "sorted").sum())(table)


def _kernels(kernel_init: str) -> dict[str, np.ndarray]:
    """{dotted path: kernel [fan_in, fan_out]} of every nnx.Linear in a small Transformer."""
    from flax import nnx

    from configs.model import ModelConfig
    from models.transformer import Transformer

    config = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=64, num_heads=4,
                         num_encoder_layers=2, num_decoder_layers=2, d_ff=192,
                         kernel_init=kernel_init)
    params = nnx.state(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param).to_pure_dict()
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    named = {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(v)
             for path, v in flat}
    biases = [v for name, v in named.items() if name.endswith(".bias") and "norm" not in name]
    assert biases and all(np.all(b == 0) for b in biases)  # zero in both schemes
    return {name[:-len(".kernel")]: v for name, v in named.items() if name.endswith(".kernel")}


def test_xavier_uniform_init_draws_fairseqs_bounds_and_variances():
    """fairseq: Xavier-uniform, U(-a, a) with a = g * sqrt(6 / (fan_in + fan_out)), g = 1/sqrt(2)
    for query/key/value and 1 for the attention output and the feed-forward kernels."""
    kernels = _kernels("xavier_uniform")
    roles = {"query": 0.5, "key": 0.5, "value": 0.5, "out": 1.0, "up": 1.0, "down": 1.0}
    seen = set()
    for name, w in kernels.items():
        role = name.rsplit(".", 1)[-1]
        gain_sq = roles[role]
        seen.add(role)
        fan_in, fan_out = w.shape
        bound = np.sqrt(gain_sq * 6.0 / (fan_in + fan_out))
        assert np.abs(w).max() <= bound
        assert np.abs(w).max() > 0.97 * bound  # uniform reaches its bound: not a normal
        want_var = gain_sq * 2.0 / (fan_in + fan_out)
        assert abs(w.var() / want_var - 1) < 0.1, (name, w.var(), want_var)
    assert seen == set(roles)


def test_default_init_is_lecun_normal_and_differs_from_xavier():
    """The default keeps Flax's lecun_normal (variance 1 / fan_in, what every shipped model
    trained from); xavier_uniform halves the query variance of a d -> d projection."""
    lecun, xavier = _kernels("lecun_normal"), _kernels("xavier_uniform")
    assert lecun.keys() == xavier.keys()
    for name, w in lecun.items():
        assert abs(w.var() * w.shape[0] - 1) < 0.1, (name, w.var())
    q = "encoder_layers.0.attention.query"
    assert abs(xavier[q].var() / lecun[q].var() - 0.5) < 0.06


def test_model_config_refuses_an_unknown_kernel_init():
    from common.errors import UserError
    from configs.model import ModelConfig

    with pytest.raises(UserError, match="kernel_init"):
        ModelConfig(src_vocab_size=10, tgt_vocab_size=10, kernel_init="orthogonal")
