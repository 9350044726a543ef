"""PNG plotting, the HTML file and `python -m attention.inspect` (journey 3)."""

from __future__ import annotations

import re
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import run_module
from test_alignment import FIXTURES, gold_peaked_maps
from test_mapfile import make_maps

from attention.alignment import extract_alignment, format_pharaoh
from attention.inspect import run
from attention.mapfile import load_maps, save_maps
from attention.plotting import (
    head_grid_figure,
    heatmap_figure,
    heatmap_image_array,
    plot_heatmap,
    preview_pngs,
)
from attention.viewer import render_html, viewer_data
from configs.errors import UserError


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header; asserts the PNG signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def run_cli(*argvs: list[str]) -> list:
    """`python -m attention.inspect ARGV` for each argv, run side by side (most of each run
    is Python starting up); returns the CompletedProcess of each."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda argv: run_module("attention.inspect", *argv, timeout=120),
                             argvs))


@pytest.fixture
def map_file(tmp_path) -> Path:
    return save_maps(tmp_path / "step_100.npz", make_maps(heads=3))


def test_heatmap_labels_title_and_valid_region_only():
    maps = make_maps(heads=3)
    fig = heatmap_figure(maps, 1, "cross", 2, "mean")  # example 1: T=6, S=3
    ax = fig.axes[0]
    assert ax.get_title() == "cross · layer 2 · head mean\nexample 1 · teacher_forced · step 1200"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["▁Ein", "▁Mann", "</s>"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["<s>", "▁A", "▁man", "▁play", "s",
                                                            "▁soccer"]
    np.testing.assert_allclose(ax.images[0].get_array(), maps.cross[1, 2, :, :6, :3].mean(0),
                               rtol=1e-6)
    assert len(fig.axes) == 2  # the heatmap and its colorbar
    fig = heatmap_figure(maps, 2, "encoder_self", "mean", 1)
    assert fig.axes[0].get_title().startswith("encoder_self · layer mean · head 1\nexample 2")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["▁Ein", "▁Mann", "▁spiel",
                                                                     "</s>"]


def test_head_grid_has_one_panel_per_head():
    maps = make_maps(heads=3)
    fig = head_grid_figure(maps, 0, "decoder_self", 1)
    panels = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("head")]
    assert [ax.get_title() for ax in panels] == ["head 0", "head 1", "head 2"]
    np.testing.assert_array_equal(panels[2].images[0].get_array(), maps.decoder_self[0, 1, 2, :4, :4])
    assert "decoder_self · layer 1 · all 3 heads" in fig.get_suptitle()


def test_png_files_and_image_array(tmp_path):
    maps = make_maps()
    path = plot_heatmap(maps, 0, "cross", "mean", "mean", tmp_path / "sub" / "a.png")
    width, height = png_size(path)
    assert width > 200 and height > 200
    image = heatmap_image_array(maps, 0)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.shape[:2] == (height, width) and image.std() > 10
    paths = preview_pngs(maps, tmp_path / "attention", "step_5")
    assert sorted(p.name for p in paths) == sorted(
        f"step_5.ex{i}.cross.{layer}.mean.png" for i in range(3) for layer in ("mean", "2"))
    assert all(png_size(p)[0] > 0 for p in paths)


def test_html_is_self_contained_and_quantized():
    maps = make_maps()
    maps.target_tokens = maps.target_tokens.astype("<U16")
    maps.target_tokens[0, 1] = "</script><b>"  # must not break out of the data block
    html = render_html(maps, title="t <x>")
    assert "<title>t &lt;x&gt;</title>" in html
    assert html.count("</script>") == 2 and "\\u003c/script>\\u003cb>" in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    data = viewer_data(maps)
    cross = data["examples"][1]["maps"]["cross"]
    assert len(cross) == 3 and len(cross[0]) == 2 and len(cross[0][0]) == 6 * 3
    assert cross[2][1][4] == round(float(maps.cross[1, 2, 1, 1, 1]) * 1000)  # row 1, key 1
    assert data["layers"] == {"cross": 3, "encoder_self": 2, "decoder_self": 3}


def test_default_png_beside_the_file(map_file):
    expected = map_file.with_name("step_100.ex0.cross.mean.mean.png")
    assert run(map_file) == [str(expected)]
    png_size(expected)
    out = run(map_file, example=2, kind="decoder_self", layer="-1", head="1")
    assert len(out) == 1 and out[0].endswith("step_100.ex2.decoder_self.2.1.png")


def test_out_grid_and_html(map_file, tmp_path):
    out, html = tmp_path / "fig.png", tmp_path / "view.html"
    assert run(map_file, out=str(out), html=str(html), grid=True) == [str(html), str(out)]
    assert png_size(out)[0] > 400
    assert html.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_align_prints_pharaoh_for_all_or_one_example(map_file, tmp_path, capsys):
    maps = load_maps(map_file)
    lines = run(map_file, align=True, layers="1,2", heads="0", shift=True)
    assert lines == [format_pharaoh(extract_alignment(maps, i, layers=[1, 2], heads=[0],
                                                      shift=True)) for i in range(3)]
    assert all(re.fullmatch(r"\d+-\d+( \d+-\d+)*", line) for line in lines)
    assert list(map_file.parent.iterdir()) == [map_file]  # --align alone writes nothing
    html = tmp_path / "view.html"
    assert run(map_file, align=True, example=1, words=True, html=str(html)) == [
        format_pharaoh(extract_alignment(maps, 1, words=True))]
    assert capsys.readouterr().err == f"{html}\n"  # written paths leave stdout to alignments


def test_gold_prints_aer(tmp_path):
    maps, chosen = gold_peaked_maps()
    path = save_maps(tmp_path / "gold.npz", maps)
    gold = FIXTURES / "rwth_de_en.head10.talp"
    lines = run(path, align=True, words=True, keep_eos=True, gold=str(gold))
    assert len(lines) == 11 and lines[:10] == [format_pharaoh(c) for c in chosen]
    assert re.fullmatch(r"AER = 0\.\d{4} \(10 sentences\)", lines[10])
    # One example is scored against its own gold line: perfect links on sure words.
    exact = tmp_path / "exact.talp"
    exact.write_text("\n".join(" ".join(f"{i + 1}-{j + 1}" for i, j in sorted(c))
                               for c in chosen) + "\n")
    lines = run(path, align=True, words=True, keep_eos=True, gold=str(exact), example=3)
    assert lines[-1] == "AER = 0.0000 (1 sentences)"


def test_run_raises_user_errors(map_file, tmp_path):
    """The Python entry point reports bad input as UserError, like the command line."""
    (tmp_path / "bad.talp").write_text("1-1 x-y\n")
    with pytest.raises(UserError, match=r"bad.talp:1: not a 1-indexed TALP link: 'x-y'"):
        run(map_file, align=True, gold=str(tmp_path / "bad.talp"))
    with pytest.raises(UserError, match="--kind must be one of"):
        run(map_file, kind="self")
    with pytest.raises(UserError, match="is a file, not a folder"):
        run(map_file, out=str(map_file / "x.png"))


def _bad_inputs(tmp_path: Path, map_file: Path) -> dict[str, list[str]]:
    (tmp_path / "text.npz").write_text("hello\n")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    (tmp_path / "short.talp").write_text("1-1\n")
    (tmp_path / "malformed.talp").write_text("1-1\n2-2 x-y\n3-3\n")
    out = ["--out", str(tmp_path / "o.png"), "--html", str(tmp_path / "o.html")]
    f = str(map_file)
    return {
        "missing file": [str(tmp_path / "absent.npz"), *out],
        "not an npz": [str(tmp_path / "text.npz"), *out],
        "not §4.5": [str(tmp_path / "other.npz"), *out],
        "no FILE": out,
        "two FILEs": [f, f, *out],
        "example": [f, "--example", "3", *out],
        "negative example": [f, "--example", "-1", *out],
        "example word": [f, "--example", "first", *out],
        "layer": [f, "--layer", "3", *out],
        "encoder layer": [f, "--kind", "encoder_self", "--layer", "2", *out],
        "head": [f, "--head", "3", *out],
        "layer word": [f, "--layer", "last", *out],
        "kind": [f, "--kind", "self", *out],
        "unknown flag": [f, "--colour", "red", *out],
        "gold lines": [f, "--align", "--gold", str(tmp_path / "short.talp"), *out],
        "gold missing": [f, "--align", "--gold", str(tmp_path / "absent.talp"), *out],
        "gold malformed": [f, "--align", "--gold", str(tmp_path / "malformed.talp"), *out],
        "words without align": [f, "--words", *out],
        "align layers": [f, "--align", "--layers", "0,7", *out],
    }


def test_bad_inputs_one_line_exit_2_no_files(tmp_path):
    map_file = save_maps(tmp_path / "maps" / "m.npz", make_maps(heads=3))
    cases = _bad_inputs(tmp_path, map_file)
    before = sorted(tmp_path.rglob("*"))
    results = dict(zip(cases, run_cli(*cases.values()), strict=True))
    for name, result in results.items():
        assert result.returncode == 2, (name, result.stderr)
        assert result.stdout == "", name
        assert re.fullmatch(r"error: [^\n]+\n", result.stderr), (name, result.stderr)
    assert sorted(tmp_path.rglob("*")) == before
    assert "malformed.talp:2: not a 1-indexed TALP link: 'x-y'" in results["gold malformed"].stderr


def test_module_entry_point_subprocess(tmp_path, map_file):
    """The real `python -m attention.inspect`: absl flags reach `run`; one error line."""
    maps, chosen = gold_peaked_maps()
    gold_maps = save_maps(tmp_path / "gold.npz", maps)
    out, html = tmp_path / "fig.png", tmp_path / "view.html"
    png, grid, align, gold, bad = run_cli(
        [str(map_file), "--example", "2", "--kind", "decoder_self", "--layer", "-1",
         "--head", "1"],
        [str(map_file), "--out", str(out), "--html", str(html), "--grid"],
        [str(map_file), "--align", "--layers=1,2", "--heads", "0", "--shift", "--html",
         str(tmp_path / "align.html")],
        [str(gold_maps), "--align", "--words", "--keep-eos", "--gold",
         str(FIXTURES / "rwth_de_en.head10.talp")],
        [str(map_file), "--head", "9", "--out", str(tmp_path / "x.png")])
    for result in (png, grid, align, gold):
        assert result.returncode == 0, result.stderr
    assert png.stdout == f"{map_file.with_name('step_100.ex2.decoder_self.2.1.png')}\n"
    assert grid.stdout.split() == [str(html), str(out)] and png_size(out)[0] > 400
    loaded = load_maps(map_file)
    expected = [format_pharaoh(extract_alignment(loaded, i, layers=[1, 2], heads=[0], shift=True))
                for i in range(3)]
    assert align.stdout.splitlines() == expected
    assert align.stderr == f"{tmp_path / 'align.html'}\n"
    assert gold.stdout.splitlines()[:10] == [format_pharaoh(c) for c in chosen]
    assert re.fullmatch(r"AER = 0\.\d{4} \(10 sentences\)", gold.stdout.splitlines()[10])
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "error: --head 9 out of range: the model has 3 heads (0..2) or 'mean'\n"
    assert not (tmp_path / "x.png").exists()
