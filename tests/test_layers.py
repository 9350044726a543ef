"""models/layers.py: the embedding lookup's hand-written gradient."""

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
