"""Attention heatmaps with matplotlib: one map, all heads of a layer, and the PNG
previews training writes beside each map file.

Figures are built with the object-oriented API on the Agg canvas (no pyplot, no GUI,
no global state), so this is safe to call from training loops and tests. Only the
valid region of a map (the first `lengths` queries and keys) is drawn; x = keys,
y = queries, both labelled with their tokens. Layers and heads are 0-indexed.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from attention.mapfile import AttentionMaps
from common.files import atomic_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CMAP = "viridis"
# Previews skip maps longer than this on either axis: drawing one token label per row
# and column, a 150 x 150 map already takes about a second, a 600 x 900 one a minute.
MAX_PREVIEW_TOKENS = 150
AXIS_NAMES = {
    "encoder_self": ("source (query)", "source (key)"),
    "decoder_self": ("target, decoder input (query)", "target, decoder input (key)"),
    "cross": ("target, decoder input (query)", "source (key)"),
}
# Alignment overlay: on viridis (dark purple .. yellow) red / orange squares and white
# dots with a black edge stay visible at both ends of the scale.


def png_name(stem: str, example: int, kind: str, layer: int | str, head: int | str) -> str:
    """The file name convention of previews and the CLI: `<stem>.ex<I>.<kind>.<layer>.<head>.png`."""
    return f"{stem}.ex{example}.{kind}.{layer}.{head}.png"


def heatmap_title(maps: AttentionMaps, example: int, kind: str, layer: int | str,
                  head: int | str) -> str:
    """E.g. "cross · layer mean · head 3\\nexample 0 · greedy · step 1000"."""
    layer_txt = "layer mean" if layer == "mean" else f"layer {layer}"
    head_txt = "head mean" if head == "mean" else f"head {head}"
    return (f"{kind} · {layer_txt} · {head_txt}\n"
            f"example {example} · {maps.decode} · step {maps.step}")


def _draw(ax, matrix: np.ndarray, queries: Sequence[str], keys: Sequence[str], fontsize: float):
    """One heatmap on `ax` with token tick labels; returns the image for a colorbar."""
    image = ax.imshow(matrix, cmap=CMAP, vmin=0.0, vmax=max(float(matrix.max()), 1e-6),
                      aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(keys)), labels=list(keys), rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(queries)), labels=list(queries), fontsize=fontsize)
    ax.tick_params(length=0)
    return image


def agg_figure(**kwargs) -> Figure:
    """A matplotlib `Figure(**kwargs)` on its own Agg canvas.

    matplotlib is imported here, at the first figure, not with this module: train.py
    imports the module but draws in its preview worker, and evaluate.py draws only when
    asked for previews, so neither pays matplotlib's import on starting."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _side(n: int) -> float:
    """Inches for n token labels: readable for short sentences, bounded for long ones."""
    return min(max(2.5, 0.28 * n), 30.0)


def matrix_figure(matrix: np.ndarray, queries: Sequence[str], keys: Sequence[str], *,
                  xlabel: str, ylabel: str, title: str,
                  colorbar_label: str = "attention weight") -> Figure:
    """Figure of one matrix [Q, K] with token labels on both axes, a colorbar and a title."""
    fig = agg_figure(figsize=(_side(len(keys)) + 2.0, _side(len(queries)) + 1.8), dpi=100,
                     layout="constrained")
    ax = fig.add_subplot()
    image = _draw(ax, matrix, queries, keys, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label=colorbar_label)
    return fig


def heatmap_figure(maps: AttentionMaps, example: int, kind: str, layer: int | str = "mean",
                   head: int | str = "mean") -> Figure:
    """Figure of one map (valid region [Q, K]) with token labels, colorbar and title.

    `layer` / `head`: an index or "mean". Raises IndexError / ValueError on a bad choice.
    """
    ylabel, xlabel = AXIS_NAMES[kind]
    return matrix_figure(maps.matrix(example, kind, layer, head),  # [Q, K]
                         maps.query_tokens(example, kind), maps.key_tokens(example, kind),
                         xlabel=xlabel, ylabel=ylabel,
                         title=heatmap_title(maps, example, kind, layer, head))


def render(fig: Figure) -> np.ndarray:
    """`fig` drawn once on its Agg canvas: uint8 pixels [height, width, 3].

    One draw serves both a PNG and a TensorBoard image. `Figure.savefig` would lay a
    constrained figure out and draw it again (the cost: bench/previews.py).
    """
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def save_pixels(pixels: np.ndarray, out_path: str | os.PathLike) -> Path:
    """Write uint8 pixels [height, width, 3] as a PNG atomically
    (`common.files.atomic_file`); returns the path."""
    with atomic_file(out_path) as f:
        Image.fromarray(pixels).save(f, format="png")  # a file object has no suffix
    return Path(out_path)


def save_png(fig: Figure, out_path: str | os.PathLike) -> Path:
    """Write `fig` as a PNG atomically; returns the path."""
    return save_pixels(render(fig), out_path)


def plot_heatmap(maps: AttentionMaps, example: int, kind: str, layer: int | str,
                 head: int | str, out_path: str | os.PathLike) -> Path:
    """Write the heatmap of one example / kind / layer / head as a PNG; returns the path."""
    return save_png(heatmap_figure(maps, example, kind, layer, head), out_path)


def head_grid_figure(maps: AttentionMaps, example: int, kind: str,
                     layer: int | str = "mean") -> Figure:
    """Figure with one panel per head of `layer` (an index or "mean"), shared colour scale."""
    heads = maps.num_heads
    mats = [maps.matrix(example, kind, layer, h) for h in range(heads)]  # H x [Q, K]
    queries, keys = maps.query_tokens(example, kind), maps.key_tokens(example, kind)
    cols = math.ceil(math.sqrt(heads))
    rows = math.ceil(heads / cols)
    panel_w, panel_h = _side(len(keys)) + 1.0, _side(len(queries)) + 1.0
    fig = agg_figure(figsize=(cols * panel_w, rows * panel_h + 0.8), dpi=100, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    vmax = max(max(float(m.max()) for m in mats), 1e-6)
    for h, ax in enumerate(axes.flat):
        if h >= heads:
            ax.axis("off")
            continue
        image = _draw(ax, mats[h], queries, keys, fontsize=7)
        image.set_clim(0.0, vmax)
        ax.set_title(f"head {h}", fontsize=9)
    layer_txt = "layer mean" if layer == "mean" else f"layer {layer}"
    fig.suptitle(f"{kind} · {layer_txt} · all {heads} heads · example {example} · "
                 f"{maps.decode} · step {maps.step}", fontsize=11)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    return fig


def plot_head_grid(maps: AttentionMaps, example: int, kind: str, layer: int | str,
                   out_path: str | os.PathLike) -> Path:
    """Write the grid of all heads of one layer as a PNG; returns the path."""
    return save_png(head_grid_figure(maps, example, kind, layer), out_path)


def heatmap_image_array(maps: AttentionMaps, example: int, kind: str = "cross",
                        layer: int | str = "mean", head: int | str = "mean") -> np.ndarray:
    """The heatmap rendered to pixels: uint8 [height, width, 3] (e.g. for TensorBoard)."""
    return render(heatmap_figure(maps, example, kind, layer, head))


def preview_skip_reason(maps: AttentionMaps, example: int,
                        max_tokens: int = MAX_PREVIEW_TOKENS) -> str | None:
    """Why the preview of one example is not drawn (its source or target is longer than
    `max_tokens`), as a one-line notice; None when it is drawn."""
    src, tgt = int(maps.source_lengths[example]), int(maps.target_lengths[example])
    if max(src, tgt) <= max_tokens:
        return None
    return (f"preview of example {example} skipped: {src} x {tgt} tokens, over "
            f"{max_tokens} (see the .npz / --html)")


def preview_images(maps: AttentionMaps, max_tokens: int = MAX_PREVIEW_TOKENS
                   ) -> dict[tuple[int, int | str], np.ndarray]:
    """The cross-attention previews of every example, drawn once each: {(example, layer):
    uint8 pixels [height, width, 3]} for layer "mean" (all layers) and the last layer,
    both head-averaged.

    An example whose source or target exceeds `max_tokens` is skipped with a one-line
    notice on stderr (`preview_skip_reason`), so a preview never takes more than about
    a second; the map file and the HTML viewer still hold it.
    """
    last = maps.num_layers("cross") - 1
    images = {}
    for example in range(maps.num_examples):
        reason = preview_skip_reason(maps, example, max_tokens)
        if reason:
            print(reason, file=sys.stderr, flush=True)
            continue
        for layer in ("mean", last):
            images[example, layer] = heatmap_image_array(maps, example, "cross", layer, "mean")
    return images


def write_previews(images: dict[tuple[int, int | str], np.ndarray], out_dir: str | os.PathLike,
                   stem: str) -> list[Path]:
    """Write `preview_images`' pixels as `<stem>.ex<I>.cross.<mean|L>.mean.png`; returns
    the paths."""
    return [save_pixels(pixels, Path(out_dir) / png_name(stem, example, "cross", layer, "mean"))
            for (example, layer), pixels in images.items()]


def preview_pngs(maps: AttentionMaps, out_dir: str | os.PathLike, stem: str,
                 max_tokens: int = MAX_PREVIEW_TOKENS) -> list[Path]:
    """Cross-attention previews for every example (`preview_images`), written as
    `<stem>.ex<I>.cross.<mean|L>.mean.png`. Returns the paths."""
    return write_previews(preview_images(maps, max_tokens), out_dir, stem)
