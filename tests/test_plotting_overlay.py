"""The alignment overlay of attention/plotting.py: the cross-attention as the alignment
reads it, and gold / predicted links drawn on it (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest
from test_alignment import hand_maps

from attention.alignment import extract_alignment
from attention.mapfile import AttentionMaps
from attention.plotting import (
    alignment_figure,
    alignment_matrix,
    alignment_overlay_figure,
    save_png,
    token_groups,
    word_links_to_pieces,
)

# One sentence: source words "a", "bc" (pieces ▁b + c), target words "x", "yz" (▁y + z).
OVERLAY_SOURCE = ["▁a", "▁b", "c", "</s>"]
OVERLAY_TARGET = ["<s>", "▁x", "▁y", "z"]
# Cross-attention [T, S]: row r is fed OVERLAY_TARGET[r]. Argmax over the real source
# pieces: row 0 -> ▁a, row 1 -> c, row 2 -> ▁a, row 3 -> ▁b (</s> itself is larger there).
OVERLAY_CROSS = np.array([[0.7, 0.1, 0.1, 0.1],
                          [0.1, 0.2, 0.6, 0.1],
                          [0.5, 0.3, 0.1, 0.1],
                          [0.05, 0.1, 0.05, 0.8]])
# 1-indexed TALP: a-x sure, bc-yz sure, a-yz possible.
OVERLAY_TALP = "1-1 2-2 1p2\n"
OVERLAY_SURE, OVERLAY_POSSIBLE = {(0, 0), (1, 1)}, {(0, 0), (1, 1), (0, 1)}


def overlay_maps() -> AttentionMaps:
    """Maps of the one OVERLAY sentence (1 layer, 1 head)."""
    return hand_maps([(OVERLAY_SOURCE, OVERLAY_TARGET, OVERLAY_CROSS[None, None])])


def artists(fig, gid: str) -> list:
    return [a for a in fig.axes[0].get_children() if a.get_gid() == gid]


def corners(fig, gid: str) -> list[tuple[float, float]]:
    """Cell (column, row) of each square of `gid`."""
    return sorted((round(p.get_x() + p.get_width() / 2), round(p.get_y() + p.get_height() / 2))
                  for p in artists(fig, gid))


def legend_texts(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_alignment_figure_draws_each_link_set_on_its_cells(tmp_path):
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4) / 12  # 3 targets x 4 sources
    fig = alignment_figure(matrix, ["x", "y", "z"], ["a", "b", "c", "d"],
                           sure={(0, 0), (2, 1)}, possible={(0, 0), (3, 2)},
                           predicted=[(0, 0), (1, 2), (1, 2)], title="t")
    ax = fig.axes[0]
    assert corners(fig, "gold_sure") == [(0, 0), (2, 1)]
    assert corners(fig, "gold_possible") == [(3, 2)]  # (0, 0) is sure: drawn once, as sure
    sure_box = artists(fig, "gold_sure")[0]
    assert not sure_box.get_fill() and sure_box.get_width() < 1
    assert artists(fig, "gold_possible")[0].get_linestyle() == "dashed"
    (dots,) = artists(fig, "predicted")
    assert list(dots.get_xdata()) == [0, 1] and list(dots.get_ydata()) == [0, 2]
    assert dots.get_marker() == "o" and dots.get_linestyle() == "None"
    assert legend_texts(fig) == ["gold sure (2)", "gold possible (1)",
                                 "predicted (2: 1 on sure, 0 on possible)"]
    # The map keeps its extent: links never widen the axes.
    assert ax.get_xlim() == (-0.5, 3.5) and ax.get_ylim() == (2.5, -0.5)
    np.testing.assert_array_equal(ax.images[0].get_array(), matrix)
    assert save_png(fig, tmp_path / "o.png").stat().st_size > 1000
    # Predicted links only: no gold in the legend.
    fig = alignment_figure(matrix, ["x", "y", "z"], ["a", "b", "c", "d"], predicted=[(3, 0)])
    assert artists(fig, "gold_sure") == [] and legend_texts(fig) == ["predicted (1)"]


def test_token_groups_and_word_links_to_pieces():
    assert token_groups(OVERLAY_SOURCE) == [[0], [1], [2]]
    assert token_groups(OVERLAY_SOURCE, words=True) == [[0], [1, 2]]
    assert token_groups(OVERLAY_TARGET, words=True) == [[1], [2, 3]]
    assert word_links_to_pieces({(1, 1), (0, 1), (5, 0)}, OVERLAY_SOURCE, OVERLAY_TARGET) == {
        (1, 1), (1, 2), (2, 1), (2, 2), (0, 1), (0, 2)}  # (5, 0): past the sentence


def test_alignment_matrix_reads_the_rows_the_alignment_reads():
    maps = overlay_maps()
    matrix, targets, sources = alignment_matrix(maps, 0)
    # Pieces: target piece j on row j (where it is predicted), </s> left out.
    np.testing.assert_allclose(matrix, OVERLAY_CROSS[:3, :3], rtol=1e-6)
    assert targets == ["▁x", "▁y", "z"] and sources == ["▁a", "▁b", "c"]
    matrix, targets, sources = alignment_matrix(maps, 0, shift=True, words=True)
    # Words, shift: "x" reads row 1, "yz" the mean of rows 2 and 3; "bc" sums its pieces.
    np.testing.assert_allclose(matrix, [[0.1, 0.8], [0.275, 0.275]], rtol=1e-6)
    assert targets == ["x", "yz"] and sources == ["a", "bc"]
    np.testing.assert_allclose(alignment_matrix(maps, 0, words=True)[0], [[0.7, 0.2], [0.3, 0.6]],
                               rtol=1e-6)


@pytest.mark.parametrize("shift", [False, True])
def test_predicted_dots_sit_on_each_rows_argmax(shift):
    maps = overlay_maps()
    predicted = extract_alignment(maps, 0, shift=shift)
    fig = alignment_overlay_figure(maps, 0, shift=shift, predicted=predicted)
    matrix = fig.axes[0].images[0].get_array()
    (dots,) = artists(fig, "predicted")
    assert list(dots.get_xdata()) == [int(matrix[j].argmax()) for j in dots.get_ydata()]
    assert sorted(dots.get_ydata()) == [0, 1, 2]


def test_overlay_figure_of_maps_words_and_pieces():
    maps = overlay_maps()
    gold = (OVERLAY_SURE, OVERLAY_POSSIBLE)
    fig = alignment_overlay_figure(maps, 0, words=True, gold=gold, note="AER 0.000",
                                   predicted=extract_alignment(maps, 0, words=True))
    ax = fig.axes[0]
    assert ax.get_title() == "cross · layers mean · heads mean\nexample 0 · greedy · step 0 · AER 0.000"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "yz"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "bc"]
    assert ax.get_xlabel() == "source words (</s> left out)" and ax.get_ylabel() == "target words"
    assert corners(fig, "gold_sure") == [(0, 0), (1, 1)]
    assert corners(fig, "gold_possible") == [(0, 1)]
    (dots,) = artists(fig, "predicted")
    assert sorted(zip(dots.get_xdata(), dots.get_ydata(), strict=True)) == [(0, 0), (0, 1), (1, 1)]
    assert legend_texts(fig)[2] == "predicted (3: 2 on sure, 1 on possible)"
    # Pieces: each gold word pair marks every piece pair.
    fig = alignment_overlay_figure(maps, 0, layers=[0], heads=0, gold=gold)
    assert fig.axes[0].get_title().startswith("cross · layers 0 · heads 0\n")
    assert corners(fig, "gold_sure") == [(0, 0), (1, 1), (1, 2), (2, 1), (2, 2)]
    assert corners(fig, "gold_possible") == [(0, 1), (0, 2)]
    assert artists(fig, "predicted") == [] and len(legend_texts(fig)) == 2
