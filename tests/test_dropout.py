"""Hash-based dropout masks (attention/dropout.py): the statistics of Bernoulli masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention.dropout import drop_threshold, dropout, keep_mask

SHAPE = (64, 128, 128)  # 1M elements


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_keep_fraction_and_unbiased_scaling(rate):
    keep = np.asarray(keep_mask(jax.random.key(0), rate, SHAPE))
    p_keep = 1 - drop_threshold(rate) / 65536
    assert abs(p_keep - (1 - rate)) < 1e-4
    sd = np.sqrt(p_keep * (1 - p_keep) / keep.size)
    assert abs(keep.mean() - p_keep) < 5 * sd
    x = jnp.ones(SHAPE)
    y = np.asarray(dropout(x, rate, jax.random.key(1)))
    assert set(np.unique(y)) <= {0.0, np.float32(1 / p_keep)}
    assert abs(y.mean() - 1.0) < 5 * sd / p_keep  # E[dropout(x)] = x


def test_same_key_same_mask_other_keys_independent():
    a = np.asarray(keep_mask(jax.random.key(7), 0.3, SHAPE))
    np.testing.assert_array_equal(a, np.asarray(keep_mask(jax.random.key(7), 0.3, SHAPE)))
    p = a.mean()
    for other in (jax.random.key(8), jax.random.fold_in(jax.random.key(7), 1),
                  jax.random.split(jax.random.key(7))[0]):
        b = np.asarray(keep_mask(other, 0.3, SHAPE))
        both = (a & b).mean()
        sd = np.sqrt(p * p * (1 - p * p) / a.size)
        assert abs(both - p * b.mean()) < 5 * sd  # P(keep in both) = P(a) P(b)


def test_no_structure_along_the_tensor():
    keep = np.asarray(keep_mask(jax.random.key(3), 0.5, SHAPE)).astype(np.float64).reshape(-1)
    centred = keep - keep.mean()
    for lag in (1, 2, 128, 65536):  # neighbours, the two lanes of one hash, rows, slices
        corr = np.mean(centred[:-lag] * centred[lag:]) / centred.var()
        assert abs(corr) < 5 / np.sqrt(keep.size), lag
    # The 16-bit lanes behind the mask are uniform: keep fractions over a grid of rates.
    for rate in np.linspace(0.05, 0.95, 10):
        frac = np.asarray(keep_mask(jax.random.key(4), float(rate), (1 << 18,))).mean()
        p = 1 - drop_threshold(float(rate)) / 65536
        assert abs(frac - p) < 5 * np.sqrt(p * (1 - p) / (1 << 18))


def test_identity_without_key_or_rate_and_rejects_rate_one():
    x = jnp.arange(10.0)
    assert dropout(x, 0.5, None) is x and dropout(x, 0.0, jax.random.key(0)) is x
    with pytest.raises(ValueError):
        dropout(x, 1.0, jax.random.key(0))
    odd = keep_mask(jax.random.key(0), 0.5, (3, 5, 7))  # an odd number of elements
    assert odd.shape == (3, 5, 7) and odd.dtype == jnp.bool_
