"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Raw attention of a deep layer says where that layer looks among its *inputs*, which are
already mixtures of all tokens. Rollout follows the mixing down to the input tokens by
multiplying the layers' attention, with the residual connection modelled as an identity:

    Â_l = rownorm(0.5 · A_l + 0.5 · I)          (A_l: layer l's attention, head mean,
                                                 rows renormalised over the valid keys)
    R   = Â_L · Â_{L-1} · ... · Â_1              (L layers, bottom layer rightmost)

Row i of R is how much the top layer's position i draws on input token j; as a product
of row-stochastic matrices every row sums to 1. Only the valid region (the first
`valid_length` positions) takes part: padding is cut before the product, so no mass
flows through it.

`rollout` is NumPy only. `plot_rollout` draws the matrix with token labels (matplotlib
is imported inside it, so importing this module stays cheap).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def rollout(weights: np.ndarray, valid_length: int | None = None,
            head: int | str | Sequence[int] = "mean", residual: bool = True) -> np.ndarray:
    """Attention rollout of one example's self-attention.

    Args:
      weights: float [L, H, S, S] (query axis before key axis), layer 0 the bottom one;
        e.g. `maps.encoder_self[i]` of an AttentionMaps.
      valid_length: n, the valid positions (default S); rows and keys from n on are padding.
      head: "mean" (Abnar & Zuidema: the mean over heads), "max" (the largest weight of
        any head per cell), a head index, or a sequence of head indices to average.
      residual: add the identity for the residual connection (0.5 A + 0.5 I); False
        multiplies the raw (row-renormalised) attention.
    Returns:
      float64 [n, n]: R = Â_L ··· Â_1, each row summing to 1 (without `residual`, a row
      whose attention is all zero stays zero).
    Raises:
      ValueError: weights not [L, H, S, S], valid_length outside 1..S, or a bad `head`.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[0] < 1:
        raise ValueError(f"weights must be [L, H, S, S] with L >= 1, got {w.shape}")
    s = w.shape[2]
    n = s if valid_length is None else int(valid_length)
    if not 1 <= n <= s:
        raise ValueError(f"valid_length must lie in 1..{s}, got {valid_length}")
    w = w[:, :, :n, :n]  # [L, H, n, n]: padding never enters the product
    if isinstance(head, str):
        if head not in ("mean", "max"):
            raise ValueError(f"head must be an index, a list of indices, 'mean' or 'max', "
                             f"got {head!r}")
        layers = w.mean(axis=1) if head == "mean" else w.max(axis=1)  # [L, n, n]
    else:
        index = [head] if isinstance(head, int | np.integer) else list(head)
        if not index or any(not -w.shape[1] <= int(h) < w.shape[1] for h in index):
            raise ValueError(f"head {head!r} out of range for {w.shape[1]} heads")
        layers = w[:, index].mean(axis=1)
    def rownorm(m: np.ndarray) -> np.ndarray:
        sums = m.sum(axis=-1, keepdims=True)
        return m / np.where(sums > 0, sums, 1.0)

    eye = np.eye(n)
    result = eye
    for a in layers:  # bottom layer first: R_l = Â_l · R_{l-1}
        # A distribution over the valid keys first, so that weight a row put on padding
        # (none, in a valid map file) cannot shift the attention / residual balance.
        a = rownorm(a)
        if residual:
            a = rownorm(0.5 * a + 0.5 * eye)
        result = a @ result
    return result


def plot_rollout(matrix: np.ndarray, tokens: Sequence[str], out_path: str | os.PathLike,
                 title: str) -> Path:
    """Write `matrix` [n, n] (queries = rows, input tokens = columns) as a labelled PNG."""
    from attention.heatmaps import matrix_figure, save_png

    if matrix.shape != (len(tokens), len(tokens)):
        raise ValueError(f"matrix {matrix.shape} does not match {len(tokens)} tokens")
    return save_png(matrix_figure(matrix, tokens, tokens, xlabel="source, input token",
                                  ylabel="source, top-layer position", title=title,
                                  colorbar_label="rolled-out attention"), out_path)
