"""Figures of word alignment: cross-attention merged into words, with gold or predicted
links drawn over it (`python -m attention.inspect --align`, `python -m attention.align
--plot`).

Alignment overlay (`alignment_figure`, `alignment_overlay_figure`): the map as the
alignment reads it (`alignment_matrix`: one row per target piece or word, one column
per source piece or word, special tokens left out) with gold sure links as solid red
squares, gold possible links as dashed orange squares and predicted links as white
dots, and a legend with their counts. Links are (source, target) index pairs, the
Pharaoh order of `alignment.links`: column, row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from alignment.links import Link, words_from_pieces
from attention.heatmaps import matrix_figure
from attention.mapfile import AttentionMaps

SURE_COLOR, POSSIBLE_COLOR, PREDICTED_COLOR = "#e3001b", "#ff8c1a", "white"


def token_groups(tokens: Sequence[str], words: bool = False) -> list[list[int]]:
    """Positions in `tokens` of each real piece ([[1], [2], ...]) or, with `words`, of
    each word's pieces ([[1], [2, 3], ...]); special tokens (<s>, </s>, padding) are in
    none. Group g is piece / word g of `alignment.links`'s links."""
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
