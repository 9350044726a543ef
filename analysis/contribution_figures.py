"""Figures of `python -m analysis.contribution_study`: the source share against sentence
chrF and BLEU, and the agreement of the attention measures (PNGs through
`attention.heatmaps.save_png`, like every other figure)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attention.heatmaps import agg_figure, save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PAIR_LABELS = {"weights_vs_norm_last": "weights ~ norm\n(last layer)",
               "weights_vs_alti_last": "weights ~ ALTI+\n(last layer)",
               "norm_vs_alti_last": "norm ~ ALTI+\n(last layer)",
               "weights_vs_norm_mean": "weights ~ norm\n(all layers)",
               "weights_vs_alti_mean": "weights ~ ALTI+\n(all layers)",
               "norm_vs_alti_mean": "norm ~ ALTI+\n(all layers)"}


def _figure(width: float, height: float) -> Figure:
    return agg_figure(figsize=(width, height), dpi=90, layout="constrained")


def _values(column: list) -> np.ndarray:
    """A JSON column ([N] floats or None) as float64 [N] with NaN for None."""
    return np.array([np.nan if v is None else v for v in column], np.float64)


def share_scatter(result: dict, path: str | os.PathLike, title: str) -> Path:
    """Two panels: each sentence's mean source share (x) against its sentence chrF and
    sentence BLEU (y), the `lowest` sentences in red, the correlations in the titles.
    result: `analysis.contribution_study.study`'s JSON content."""
    rows = result["per_sentence"]
    share = _values(rows["share"])
    low = [entry["index"] for entry in result["source_share"]["lowest"]]
    fig = _figure(9.0, 3.8)
    axes = fig.subplots(1, 2, squeeze=False)[0]
    for ax, metric, name in ((axes[0], "chrf", "sentence chrF"),
                             (axes[1], "bleu", "sentence BLEU")):
        y = _values(rows[metric])
        ax.scatter(share, y, s=5, alpha=0.35, color="tab:blue", linewidths=0)
        ax.scatter(share[low], y[low], s=14, color="tab:red", label=f"lowest {len(low)}")
        c = result["source_share"]["correlations"][metric]
        stats = ("undefined" if c["spearman"] is None else
                 f"Spearman {c['spearman']:+z.2f}, Pearson {c['pearson']:+z.2f}")
        ax.set_title(f"{name}: {stats}", fontsize=9)
        ax.set_xlabel("mean ALTI+ source share of the hypothesis")
        ax.set_ylabel(name)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{title} ({result['num_sentences']} sentences)", fontsize=10)
    return save_png(fig, path)


def agreement_figure(result: dict, path: str | os.PathLike, title: str) -> Path:
    """Left: the mean over sentences of the weights-vs-norm rank correlation per decoder
    layer and head; right: each measure pair's per-sentence rank correlations as box
    plots (whiskers 5-95%)."""
    per_head = np.array(result["agreement"]["per_head"]["weights_vs_norm"]["mean"], np.float64)
    rows = result["per_sentence"]
    fig = _figure(10.0, 3.9)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2.2]})
    image = left.imshow(per_head, cmap="viridis", vmin=-1, vmax=1, aspect="auto")
    for layer, row in enumerate(per_head):
        for head, value in enumerate(row):
            left.text(head, layer, "-" if np.isnan(value) else f"{value:.3f}", ha="center",
                      va="center", fontsize=8, color="white" if value < 0.5 else "black")
    left.set_title("weights ~ norm per head\n(mean Spearman over sentences)", fontsize=9)
    left.set_xlabel("head")
    left.set_ylabel("decoder layer")
    left.set_xticks(range(per_head.shape[1]))
    left.set_yticks(range(per_head.shape[0]))
    fig.colorbar(image, ax=left, shrink=0.8)
    pairs = [p for p in PAIR_LABELS if p in rows]
    data = [(v := _values(rows[p]))[~np.isnan(v)] for p in pairs]
    right.boxplot(data, whis=(5, 95), showfliers=False)
    right.set_xticks(range(1, len(pairs) + 1), [PAIR_LABELS[p] for p in pairs], fontsize=7)
    right.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
    right.set_ylim(-1.05, 1.05)
    right.set_ylabel("Spearman per sentence")
    right.set_title("rank agreement of the measures over sentences", fontsize=9)
    fig.suptitle(title, fontsize=10)
    return save_png(fig, path)
