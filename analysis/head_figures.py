"""Figures of `python -m attention.heads`: per-kind layers x heads heatmaps of a metric,
the pruning curve, and head statistics over training steps (PNGs through
`attention.heatmaps.save_png`, like every other figure)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from attention.heatmaps import agg_figure, save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KINDS = ("encoder_self", "decoder_self", "cross")


def _figure(width: float, height: float) -> Figure:
    return agg_figure(figsize=(width, height), dpi=110, layout="constrained")


def metric_heatmaps(heads: dict, metric: str, path: str | os.PathLike) -> Path:
    """One panel per attention kind: `heads[kind][metric]` [L][H] as a layers x heads grid,
    each cell labelled with its value."""
    fig = _figure(4.2 * len(KINDS), 3.4)
    axes = fig.subplots(1, len(KINDS), squeeze=False)
    for ax, kind in zip(axes[0], KINDS, strict=True):
        values = heads[kind][metric]
        image = ax.imshow(values, cmap="viridis", aspect="auto")
        for layer, row in enumerate(values):
            for head, value in enumerate(row):
                ax.text(head, layer, f"{value:.2g}", ha="center", va="center", fontsize=7,
                        color="white")
        ax.set_title(kind)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(len(values[0])))
        ax.set_yticks(range(len(values)))
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(metric)
    return save_png(fig, path)


def pruning_curve(curve: list[dict], base_bleu: float, path: str | os.PathLike) -> Path:
    """BLEU against the number of heads removed, with the 0.5-BLEU tolerance drawn."""
    fig = _figure(5.5, 3.6)
    ax = fig.add_subplot()
    ax.plot([p["heads_removed"] for p in curve], [p["bleu"] for p in curve], "o-")
    ax.axhline(base_bleu - 0.5, color="grey", linestyle="--", label="-0.5 BLEU")
    ax.set_xlabel("heads removed (global order of importance)")
    ax.set_ylabel("BLEU")
    ax.legend()
    return save_png(fig, path)


def over_training(steps: list[dict], path: str | os.PathLike) -> Path:
    """Mean entropy and confidence of each kind's heads at every saved validation step."""
    fig = _figure(9, 3.6)
    axes = fig.subplots(1, 2)
    for kind in KINDS:
        xs = [s["step"] for s in steps]
        axes[0].plot(xs, [s[kind]["entropy_mean"] for s in steps], "o-", label=kind)
        axes[1].plot(xs, [s[kind]["confidence_mean"] for s in steps], "o-", label=kind)
    for ax, name in zip(axes, ("mean entropy (nats)", "mean confidence"), strict=True):
        ax.set_xlabel("training step")
        ax.set_ylabel(name)
        ax.legend()
    return save_png(fig, path)
