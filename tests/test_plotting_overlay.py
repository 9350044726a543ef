"""The alignment overlay: attention/heatmaps.py draws the cross-attention as the alignment
reads it with gold / predicted links on it (no model needed); `attention.inspect --gold`
/ `--align` puts it in the PNG and the links in the HTML viewer's data (the page itself:
tests/test_viewer_browser.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_module
from test_alignment import hand_maps
from test_inspect_cli import page_payload, png_size

from alignment import figures
from alignment.figures import (
    alignment_figure,
    alignment_matrix,
    alignment_overlay_figure,
    token_groups,
    word_links_to_pieces,
)
from alignment.links import extract_alignment
from analysis.inspect import run
from attention.heatmaps import save_png
from attention.mapfile import AttentionMaps, save_maps
from common.errors import UserError

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


@pytest.fixture
def overlay_files(tmp_path) -> tuple[Path, Path]:
    """The one-sentence OVERLAY map file and its gold line."""
    (tmp_path / "gold.talp").write_text(OVERLAY_TALP)
    return save_maps(tmp_path / "one.npz", overlay_maps()), tmp_path / "gold.talp"


def test_gold_overlay_png_and_html(overlay_files, tmp_path, monkeypatch, capsys):
    map_file, gold = overlay_files
    drawn = []
    original = figures.alignment_overlay_figure
    monkeypatch.setattr(figures, "alignment_overlay_figure",
                        lambda *a, **kw: drawn.append((a, kw)) or original(*a, **kw))
    png, html = tmp_path / "links.png", tmp_path / "links.html"
    assert run(map_file, gold=str(gold), words=True, out=str(png), html=str(html)) == [
        str(html), str(png)]
    assert png_size(png)[0] > 200
    (_, example), options = drawn[-1]
    assert example == 0 and options["words"] and options["note"] == "AER 0.000"
    assert options["predicted"] == [(0, 0), (0, 1), (1, 1)]
    assert options["gold"] == (OVERLAY_SURE, OVERLAY_POSSIBLE)
    data = page_payload(html.read_text(encoding="utf-8"))
    assert data["alignment"] == {"gold_file": "gold.talp", "layers": "mean", "heads": "mean",
                                 "shift": False, "words": True, "keep_eos": False}
    # Cells [row, column]: target piece at position p sits on row p - 1.
    assert data["steps"][0]["examples"][0]["links"] == {
        "predicted": [[0, 0], [1, 2], [2, 0]], "sure": [[0, 0], [1, 1], [1, 2], [2, 1], [2, 2]],
        "possible": [[1, 0], [2, 0]], "aer": 0.0}
    # --gold alone: the default PNG name; --align: predicted links (no gold) with --out.
    assert run(map_file, gold=str(gold), layers="0", shift=True) == [
        str(map_file.with_name("one.ex0.cross.0.mean.links.png"))]
    assert drawn[-1][1]["gold"] is not None and drawn[-1][1]["layers"] == [0]
    assert drawn[-1][1]["note"] == ""  # gold words vs predicted pieces: no AER
    assert run(map_file, align=True, out=str(png), html=str(html)) == ["0-0 0-2 2-1"]
    assert drawn[-1][1]["gold"] is None and drawn[-1][1]["predicted"] == [(0, 0), (0, 2), (2, 1)]
    assert capsys.readouterr().err == f"{html}\n{png}\n"
    data = page_payload(html.read_text(encoding="utf-8"))
    assert data["alignment"]["gold_file"] == "" and list(data["steps"][0]["examples"][0][
        "links"]) == ["predicted"]
    # Other kinds and the head grid draw no links; without flags no alignment in the page.
    count = len(drawn)
    run(map_file, align=True, kind="encoder_self", out=str(png))
    run(map_file, align=True, grid=True, out=str(png))
    assert len(drawn) == count
    run(map_file, html=str(html))
    assert page_payload(html.read_text(encoding="utf-8"))["alignment"] is None


def test_gold_overlay_refuses(overlay_files, tmp_path):
    map_file, gold = overlay_files
    with pytest.raises(UserError, match=r"--gold without --align draws links on the "
                                        r"cross-attention: give --kind cross"):
        run(map_file, gold=str(gold), kind="decoder_self")
    with pytest.raises(UserError, match="--shift only applies with --align or --gold"):
        run(map_file, shift=True)
    (tmp_path / "other.talp").write_text("1-1 3-2\n")
    with pytest.raises(UserError, match=r"other.talp line 1 links words 3-2 but example 0 of "
                                        r"one.npz has 2 source and 2 target words"):
        run(map_file, gold=str(tmp_path / "other.talp"), html=str(tmp_path / "v.html"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gold.talp", "one.npz", "other.talp"]


def test_module_entry_point_draws_links(overlay_files, tmp_path):
    """The real `python -m attention.inspect --gold`: the flags reach the overlay."""
    map_file, gold = overlay_files
    html, png = tmp_path / "links.html", tmp_path / "links.png"
    result = run_module("attention.inspect", str(map_file), "--gold", str(gold), "--words",
                        "--shift", "--layers", "0", "--html", str(html), "--out", str(png),
                        timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(html), str(png)] and png_size(png)[0] > 200
    data = page_payload(html.read_text(encoding="utf-8"))
    assert data["alignment"] == {"gold_file": "gold.talp", "layers": "0", "heads": "mean",
                                 "shift": True, "words": True, "keep_eos": False}
    # Shift: words {bc-x, a-yz, bc-yz} against sure {a-x, bc-yz}, possible a-yz:
    # 1 - (1 + 2) / (3 + 2).
    assert data["steps"][0]["examples"][0]["links"]["aer"] == 0.4
