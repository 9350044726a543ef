"""Attention rollout (analysis/rollout.py): a case computed by hand, and its invariants."""

from __future__ import annotations

import numpy as np
import pytest
from test_mapfile import make_maps

from analysis.rollout import plot_rollout, rollout


def softmax_maps(layers: int, heads: int, s: int, seed: int = 0) -> np.ndarray:
    """Random row-stochastic attention [L, H, S, S]."""
    logits = 2.0 * np.random.default_rng(seed).normal(size=(layers, heads, s, s))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# Two layers, two heads, two tokens, each head a 0/1 matrix so the sums are easy by hand.
HAND = np.array([
    [[[1, 0], [1, 0]], [[0, 1], [0, 1]]],  # layer 0: head mean [[.5, .5], [.5, .5]]
    [[[0, 1], [0, 1]], [[0, 1], [1, 0]]],  # layer 1: head mean [[0, 1], [.5, .5]]
], dtype=np.float64)
# Â0 = 0.5·mean0 + 0.5·I = [[.75, .25], [.25, .75]];  Â1 = [[.5, .5], [.25, .75]]
# R = Â1 · Â0 = [[.5·.75 + .5·.25, .5·.25 + .5·.75], [.25·.75 + .75·.25, .25·.25 + .75·.75]]
HAND_ROLLOUT = np.array([[0.5, 0.5], [0.375, 0.625]])


def test_hand_computed_two_layers():
    np.testing.assert_allclose(rollout(HAND), HAND_ROLLOUT, atol=1e-12)
    # Without the residual: mean1 · mean0 = [[.5, .5], [.5, .5]].
    np.testing.assert_allclose(rollout(HAND, residual=False), np.full((2, 2), 0.5), atol=1e-12)
    # Head 1 alone: Â0 = [[.5, .5], [0, 1]], Â1 = [[.5, .5], [.5, .5]] -> [[.25, .75]] twice.
    np.testing.assert_allclose(rollout(HAND, head=1), [[0.25, 0.75], [0.25, 0.75]], atol=1e-12)
    np.testing.assert_allclose(rollout(HAND, head=[0, 1]), HAND_ROLLOUT, atol=1e-12)


def test_padding_is_cut_before_the_product():
    padded = np.zeros((2, 2, 4, 4))
    padded[:, :, :2, :2] = HAND
    padded[:, :, 2:, :] = 0.25  # padded query rows: whatever they hold never counts
    out = rollout(padded, valid_length=2)
    assert out.shape == (2, 2)
    np.testing.assert_allclose(out, HAND_ROLLOUT, atol=1e-12)
    # Weight a valid row put on a padded key is dropped and the row renormalised.
    leaky = padded.copy()
    leaky[:, :, :2, :2] *= 0.5
    leaky[:, :, :2, 3] = 0.5
    np.testing.assert_allclose(rollout(leaky, valid_length=2), HAND_ROLLOUT, atol=1e-12)


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("head", ["mean", "max", 2])
def test_rows_are_distributions(residual, head):
    out = rollout(softmax_maps(3, 4, 6), valid_length=5, head=head, residual=residual)
    assert out.shape == (5, 5) and (out >= 0).all()
    np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-12)


def test_one_layer_is_the_rownormalised_residual_mix():
    w = softmax_maps(1, 3, 5, seed=1)
    mixed = 0.5 * w[0].mean(0) + 0.5 * np.eye(5)
    np.testing.assert_allclose(rollout(w), mixed / mixed.sum(-1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(rollout(w, residual=False), w[0].mean(0), atol=1e-12)
    # The cellwise head maximum is no distribution: renormalised before the residual mix.
    top = w[0].max(0) / w[0].max(0).sum(-1, keepdims=True)
    np.testing.assert_allclose(rollout(w, head="max"), 0.5 * top + 0.5 * np.eye(5), atol=1e-12)


def test_layers_compose_in_order():
    """Rolling out L layers = the top layer's mix times the rollout of the L-1 below."""
    w = softmax_maps(3, 2, 4, seed=2)
    top = 0.5 * w[2].mean(0) + 0.5 * np.eye(4)
    np.testing.assert_allclose(rollout(w), top @ rollout(w[:2]), atol=1e-12)
    assert not np.allclose(rollout(w), rollout(w[::-1]))


def test_on_a_map_file_example(tmp_path):
    maps = make_maps(src_lens=(5, 3), tgt_lens=(4, 6), l_enc=3)
    out = rollout(maps.encoder_self[1], int(maps.source_lengths[1]))
    assert out.shape == (3, 3)
    np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-6)
    path = plot_rollout(out, maps.key_tokens(1, "encoder_self"), tmp_path / "r.png", "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="does not match"):
        plot_rollout(out, ["a", "b"], tmp_path / "bad.png", "title")


def test_bad_arguments():
    w = softmax_maps(2, 2, 4)
    with pytest.raises(ValueError, match=r"\[L, H, S, S\]"):
        rollout(w[0])
    with pytest.raises(ValueError, match=r"\[L, H, S, S\]"):
        rollout(np.zeros((2, 2, 3, 4)))
    with pytest.raises(ValueError, match="valid_length"):
        rollout(w, valid_length=5)
    with pytest.raises(ValueError, match="valid_length"):
        rollout(w, valid_length=0)
    with pytest.raises(ValueError, match="out of range"):
        rollout(w, head=2)
    with pytest.raises(ValueError, match="'mean' or 'max'"):
        rollout(w, head="min")
