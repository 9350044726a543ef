"""Attention heatmaps with matplotlib: one map, all heads of a layer, training previews,
and the cross-attention with word alignment links drawn on it.

Figures are built with the object-oriented API on the Agg canvas (no pyplot, no GUI,
no global state), so this is safe to call from training loops and tests. Only the
valid region of a map (the first `lengths` queries and keys) is drawn; x = keys,
y = queries, both labelled with their tokens. Layers and heads are 0-indexed.

Alignment overlay (`alignment_figure`, `alignment_overlay_figure`): the map as the
alignment reads it (`alignment_matrix`: one row per target piece or word, one column
per source piece or word, special tokens left out) with gold sure links as solid red
squares, gold possible links as dashed orange squares and predicted links as white
dots, and a legend with their counts. Links are (source, target) index pairs, the
Pharaoh order of `attention.alignment`: column, row.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from attention.alignment import words_from_pieces
from attention.mapfile import AttentionMaps
from configs.files import atomic_file

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
SURE_COLOR, POSSIBLE_COLOR, PREDICTED_COLOR = "#e3001b", "#ff8c1a", "white"
Link = tuple[int, int]  # (source, target), as in attention.alignment


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


def _side(n: int) -> float:
    """Inches for n token labels: readable for short sentences, bounded for long ones."""
    return min(max(2.5, 0.28 * n), 30.0)


def matrix_figure(matrix: np.ndarray, queries: Sequence[str], keys: Sequence[str], *,
                  xlabel: str, ylabel: str, title: str,
                  colorbar_label: str = "attention weight") -> Figure:
    """Figure of one matrix [Q, K] with token labels on both axes, a colorbar and a title."""
    fig = Figure(figsize=(_side(len(keys)) + 2.0, _side(len(queries)) + 1.8), dpi=100,
                 layout="constrained")
    FigureCanvasAgg(fig)
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


def save_png(fig: Figure, out_path: str | os.PathLike) -> Path:
    """Write `fig` as a PNG atomically (`configs.files.atomic_file`); returns the path."""
    with atomic_file(out_path) as f:
        fig.savefig(f, format="png")  # a file object has no suffix to infer the format from
    return Path(out_path)


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
    fig = Figure(figsize=(cols * panel_w, rows * panel_h + 0.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
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
    fig = heatmap_figure(maps, example, kind, layer, head)
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def preview_skip_reason(maps: AttentionMaps, example: int,
                        max_tokens: int = MAX_PREVIEW_TOKENS) -> str | None:
    """Why the preview of one example is not drawn (its source or target is longer than
    `max_tokens`), as a one-line notice; None when it is drawn."""
    src, tgt = int(maps.source_lengths[example]), int(maps.target_lengths[example])
    if max(src, tgt) <= max_tokens:
        return None
    return (f"preview of example {example} skipped: {src} x {tgt} tokens, over "
            f"{max_tokens} (see the .npz / --html)")


def preview_pngs(maps: AttentionMaps, out_dir: str | os.PathLike, stem: str,
                 max_tokens: int = MAX_PREVIEW_TOKENS) -> list[Path]:
    """Cross-attention previews for every example: mean of all layers and the last layer,
    both head-averaged, named `<stem>.ex<I>.cross.<mean|L>.mean.png`. Returns the paths.

    An example whose source or target exceeds `max_tokens` is skipped with a one-line
    notice on stderr (`preview_skip_reason`), so a preview never takes more than about
    a second; the map file and the HTML viewer still hold it.
    """
    last = maps.num_layers("cross") - 1
    paths = []
    for example in range(maps.num_examples):
        reason = preview_skip_reason(maps, example, max_tokens)
        if reason:
            print(reason, file=sys.stderr, flush=True)
            continue
        for layer in ("mean", last):
            out = Path(out_dir) / png_name(stem, example, "cross", layer, "mean")
            paths.append(plot_heatmap(maps, example, "cross", layer, "mean", out))
    return paths


def token_groups(tokens: Sequence[str], words: bool = False) -> list[list[int]]:
    """Positions in `tokens` of each real piece ([[1], [2], ...]) or, with `words`, of
    each word's pieces ([[1], [2, 3], ...]); special tokens (<s>, </s>, padding) are in
    none. Group g is piece / word g of `attention.alignment`'s links."""
    groups: list[list[int]] = []
    for pos, word in enumerate(words_from_pieces(tokens)):
        if word < 0:
            continue
        if words and word < len(groups):
            groups[word].append(pos)
        else:
            groups.append([pos])
    return groups


def _label(tokens: Sequence[str], group: Sequence[int], words: bool) -> str:
    """A piece as it is ("▁Ein"), a word as its pieces joined without the "▁" ("Ein")."""
    text = "".join(tokens[p] for p in group)
    if not words:
        return text
    return text.replace("\u2581", "") or text


def alignment_matrix(maps: AttentionMaps, example: int, layers: int | str | Sequence[int] = "mean",
                     heads: int | str | Sequence[int] = "mean", shift: bool = False,
                     words: bool = False) -> tuple[np.ndarray, list[str], list[str]]:
    """The cross-attention of one example as `extract_alignment` reads it.

    Row g is the attention row that aligns target piece g: the row where it is predicted
    (its position - 1) or, with `shift`, the row where it is the decoder input (its
    position). With `words`, a word's rows are averaged (so a row still sums to at most
    1) and a source word's columns summed (the attention mass on the word). `<s>` and
    `</s>` are left out, so a row sums to 1 minus the weight on `</s>`.

    Returns:
      (matrix float32 [target pieces or words, source pieces or words], target labels,
      source labels); links (i, j) of `extract_alignment(..., words=words)` index column
      i and row j.
    """
    src, tgt = maps.key_tokens(example, "cross"), maps.query_tokens(example, "cross")
    att = maps.matrix(example, "cross", layers, heads)  # [T, S]
    src_groups, tgt_groups = token_groups(src, words), token_groups(tgt, words)
    merge = np.zeros((len(src), len(src_groups)), np.float32)  # [S, source groups]: 0 / 1
    for g, positions in enumerate(src_groups):
        merge[positions, g] = 1.0
    rows = np.stack([att[[p - 1 + int(shift) for p in positions]].mean(0)
                     for positions in tgt_groups]) if tgt_groups else np.zeros((0, len(src)))
    return ((rows @ merge).astype(np.float32), [_label(tgt, g, words) for g in tgt_groups],
            [_label(src, g, words) for g in src_groups])


def word_links_to_pieces(links: Iterable[Link], source: Sequence[str],
                         target: Sequence[str]) -> set[Link]:
    """Word links (i, j) -> the links of every piece of source word i to every piece of
    target word j (real-piece indices). Links past the sentence's words are dropped."""
    def pieces_of(tokens: Sequence[str]) -> list[list[int]]:
        index = {pos: k for k, (pos,) in enumerate(token_groups(tokens))}
        return [[index[p] for p in group] for group in token_groups(tokens, words=True)]

    src, tgt = pieces_of(source), pieces_of(target)
    return {(a, b) for i, j in links if i < len(src) and j < len(tgt)
            for a in src[i] for b in tgt[j]}


def alignment_figure(matrix: np.ndarray, targets: Sequence[str], sources: Sequence[str], *,
                     sure: Iterable[Link] | None = None, possible: Iterable[Link] | None = None,
                     predicted: Iterable[Link] | None = None, title: str = "",
                     xlabel: str = "source", ylabel: str = "target") -> Figure:
    """`matrix_figure` of `matrix` [targets, sources] with alignment links drawn on it.

    Links are (source, target) = (column, row) pairs. `sure`: solid red open squares
    (Rectangle patches, gid "gold_sure"); `possible`: dashed orange squares for the
    links not also sure (gid "gold_possible"); `predicted`: white dots centred on their
    cells (one Line2D, gid "predicted"). A legend below the map counts each set given
    (None: not given, left out of the legend) and the predicted links on gold links.
    """
    fig = matrix_figure(matrix, targets, sources, xlabel=xlabel, ylabel=ylabel, title=title)
    ax = fig.axes[0]
    limits = ax.get_xlim(), ax.get_ylim()
    sure_set, possible_set = set(sure or ()), set(possible or ())
    maybe = possible_set - sure_set
    for links, color, style, gid in ((sure_set, SURE_COLOR, "solid", "gold_sure"),
                                     (maybe, POSSIBLE_COLOR, "dashed", "gold_possible")):
        for i, j in sorted(links):
            ax.add_patch(Rectangle((i - 0.42, j - 0.42), 0.84, 0.84, fill=False, edgecolor=color,
                                   linewidth=2.0, linestyle=style, gid=gid))
    handles = []
    if sure is not None:
        handles.append(Line2D([], [], color=SURE_COLOR, marker="s", markersize=10, linestyle="none",
                              markerfacecolor="none", markeredgewidth=2,
                              label=f"gold sure ({len(sure_set)})"))
    if possible is not None:
        handles.append(Line2D([], [], color=POSSIBLE_COLOR, marker="s", markersize=10,
                              linestyle="none", markerfacecolor="none", markeredgewidth=1.5,
                              label=f"gold possible ({len(maybe)})"))
    if predicted is not None:
        pred = sorted(set(predicted))
        xs, ys = [i for i, _ in pred], [j for _, j in pred]
        style = dict(linestyle="none", marker="o", markersize=6, markerfacecolor=PREDICTED_COLOR,
                     markeredgecolor="black", markeredgewidth=1.0)
        ax.plot(xs, ys, gid="predicted", **style)
        hits = ""
        if sure is not None or possible is not None:
            on_sure = len(set(pred) & sure_set)
            hits = f": {on_sure} on sure, {len(set(pred) & maybe)} on possible"
        handles.append(Line2D([], [], label=f"predicted ({len(pred)}{hits})", **style))
    ax.set_xlim(*limits[0])
    ax.set_ylim(*limits[1])
    if handles:
        # About 0.07 inch a character at 9 points, plus the marker: widen the figure so the
        # legend's one row fits.
        width = sum(0.07 * len(h.get_label()) + 0.6 for h in handles) + 0.4
        fig.set_figwidth(max(fig.get_figwidth(), width))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
                   frameon=False, fontsize=9)
    return fig


def _selection(value: int | str | Sequence[int]) -> str:
    """"mean", 2 or [1, 2] -> "mean", "2" or "1,2"."""
    if isinstance(value, str | int):
        return str(value)
    return ",".join(str(v) for v in value)


def alignment_overlay_figure(maps: AttentionMaps, example: int, *,
                             layers: int | str | Sequence[int] = "mean",
                             heads: int | str | Sequence[int] = "mean", shift: bool = False,
                             words: bool = False, predicted: Iterable[Link] | None = None,
                             gold: tuple[Iterable[Link], Iterable[Link]] | None = None,
                             note: str = "") -> Figure:
    """The cross-attention of one example (`alignment_matrix`) with links on it.

    `predicted`: links of `extract_alignment` with the same layers / heads / shift /
    words; `gold`: (sure, possible) word links of that sentence (`read_talp`), drawn on
    words with `words`, else on every piece pair of each linked word pair. `note` ends
    the title (e.g. the sentence's AER). Row j shows the attention that aligns target
    piece / word j (where it is predicted; with `shift` where it is the decoder input),
    labelled with that piece / word, so a predicted dot sits on its row's argmax cell.
    """
    matrix, targets, sources = alignment_matrix(maps, example, layers, heads, shift, words)
    sure = possible = None
    if gold is not None:
        sure, possible = (set(links) for links in gold)
        if not words:
            src, tgt = maps.key_tokens(example, "cross"), maps.query_tokens(example, "cross")
            sure, possible = (word_links_to_pieces(x, src, tgt) for x in (sure, possible))
    unit = "words" if words else "pieces"
    title = (f"cross · layers {_selection(layers)} · heads {_selection(heads)}"
             f"{' · shift' if shift else ''}\nexample {example} · {maps.decode} · "
             f"step {maps.step}{' · ' + note if note else ''}")
    return alignment_figure(matrix, targets, sources, sure=sure, possible=possible,
                            predicted=predicted, title=title,
                            xlabel=f"source {unit} (</s> left out)",
                            ylabel=f"target {unit}")
