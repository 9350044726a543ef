"""PNG plotting, the HTML file and `python -m attention.inspect` (journey 3)."""

from __future__ import annotations

import json
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import run_module
from test_alignment import FIXTURES, gold_peaked_maps
from test_mapfile import make_maps

from alignment.links import extract_alignment, format_pharaoh
from analysis.inspect import run
from analysis.viewer import page_data, render_html, viewer_data
from attention.heatmaps import (
    head_grid_figure,
    heatmap_figure,
    heatmap_image_array,
    plot_heatmap,
    preview_pngs,
)
from attention.mapfile import load_maps, save_maps
from common.errors import UserError


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header; asserts the PNG signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def page_payload(html: str) -> dict:
    """The JSON payload embedded in a viewer page."""
    match = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def heads_json(path: Path, maps, **extra) -> Path:
    """A small heads.json of `python -m attention.heads`'s shape for `maps`."""
    def grid(kind: str, base: float) -> list:
        return [[base + layer / 10 + head / 100 for head in range(maps.num_heads)]
                for layer in range(maps.num_layers(kind))]

    tree = {kind: {"importance": grid(kind, 0.1), "entropy": grid(kind, 1.0),
                   "previous": None if kind == "cross" else grid(kind, 0.3)}
            for kind in ("encoder_self", "decoder_self", "cross")}
    tree["pruning_curve"] = [{"heads_removed": 0, "bleu": 30.0}]
    tree.update(extra)
    path.write_text(json.dumps(tree))
    return path


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


def test_several_files_one_viewer_in_step_order(tmp_path):
    steps = {2000: make_maps(heads=3, seed=2, step=2000), 500: make_maps(heads=3, seed=0, step=500),
             1000: make_maps(src_lens=(2, 6), tgt_lens=(3, 3), heads=3, seed=1, step=1000)}
    files = [save_maps(tmp_path / f"valid_step{s:07d}_teacher_forced.npz", m)
             for s, m in steps.items()]
    html = tmp_path / "view.html"
    assert run(files, html=str(html)) == [str(html)]
    page = html.read_text(encoding="utf-8")
    assert "<title>Attention maps: 3 files, steps 500..2000</title>" in page
    data = page_payload(page)
    assert [s["step"] for s in data["steps"]] == [500, 1000, 2000]
    assert [s["file"] for s in data["steps"]] == [f.name for f in sorted(files)]
    assert data["head_stats"] is None and data["heads"] == 3
    # Each step keeps its own examples and tokens (step 1000 has 2 other sentences).
    assert [len(s["examples"]) for s in data["steps"]] == [3, 2, 3]
    assert data["steps"][1]["examples"][0]["source"] == ["▁Ein", "</s>"]
    cross = data["steps"][2]["examples"][1]["maps"]["cross"]
    assert cross[2][1][4] == round(float(steps[2000].cross[1, 2, 1, 1, 1]) * 1000)
    # One file keeps today's single-step page.
    one = page_data([steps[500]], ["a.npz"])
    assert len(one["steps"]) == 1 and one["steps"][0]["file"] == "a.npz"


def test_several_files_must_share_the_model(tmp_path):
    a = save_maps(tmp_path / "a.npz", make_maps(heads=3))
    b = save_maps(tmp_path / "b.npz", make_maps(heads=2, step=5))
    with pytest.raises(UserError, match=r"b.npz has .* 2 heads but a.npz has .* 3 heads"):
        run([a, b], html=str(tmp_path / "v.html"))
    with pytest.raises(UserError, match="several files only make sense with --html"):
        run([a, a])
    with pytest.raises(UserError, match="--rollout reads one FILE, got 2"):
        run([a, a], html=str(tmp_path / "v.html"), rollout=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "b.npz"]


def test_heads_json_is_embedded_per_kind(map_file, tmp_path):
    maps = load_maps(map_file)
    stats = heads_json(tmp_path / "heads.json", maps, seconds=3.5)
    tree = json.loads(stats.read_text())
    tree["cross"]["zeta"] = [[float("nan"), None, 1], [1, 2, 3], [4, 5, 6]]  # NaN -> null
    tree["cross"]["summary"] = {"mean": 1.0}  # not a per-head grid: skipped
    tree["decoder_self"]["entropy_mean"] = 0.5
    stats.write_text(json.dumps(tree))
    html = tmp_path / "view.html"
    run(map_file, html=str(html), heads_json=str(stats))
    data = page_payload(html.read_text(encoding="utf-8"))
    assert data["head_stats_file"] == "heads.json"
    hs = data["head_stats"]
    assert list(hs["encoder_self"]) == ["importance", "entropy", "previous"]
    assert list(hs["cross"]) == ["importance", "entropy", "zeta"]  # previous is null there
    assert hs["cross"]["zeta"][0] == [None, None, 1.0]
    assert hs["decoder_self"]["importance"][2][1] == pytest.approx(0.1 + 0.2 + 0.01)
    wrong = heads_json(tmp_path / "other.json", make_maps(heads=2))
    with pytest.raises(UserError, match=r"other.json: encoder_self importance is 2 x 2 .* "
                                        r"2 x 3: figures of another model"):
        run(map_file, html=str(html), heads_json=str(wrong))
    (tmp_path / "empty.json").write_text('{"cross": {"importance": null}}')
    with pytest.raises(UserError, match="no per-head figures"):
        run(map_file, html=str(html), heads_json=str(tmp_path / "empty.json"))


def test_rollout_png(map_file, tmp_path):
    expected = map_file.with_name("step_100.ex0.encoder_self.rollout.png")
    assert run(map_file, rollout=True) == [str(expected)]
    assert png_size(expected)[0] > 200
    out = tmp_path / "r.png"
    assert run(map_file, rollout=True, example=2, layer="0", head="1", out=str(out)) == [str(out)]
    png_size(out)
    with pytest.raises(UserError, match=r"--layer 2 out of range: encoder_self has 2 layers"):
        run(map_file, rollout=True, layer="2")


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
    (tmp_path / "far.talp").write_text("1-1\n1-1 9-9\n1-1\n")
    out = ["--out", str(tmp_path / "o.png"), "--html", str(tmp_path / "o.html")]
    f = str(map_file)
    stats = str(heads_json(tmp_path / "heads.json", make_maps(heads=2)))  # another model's
    (tmp_path / "list.json").write_text("[1, 2]\n")
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
        "several without --html": [f, f],
        "several with --out": [f, f, *out],
        "several, another model": [f, str(tmp_path / "maps" / "two_heads.npz"), "--html",
                                   str(tmp_path / "o.html")],
        "heads_json without --html": [f, "--heads_json", stats, "--out", str(tmp_path / "o.png")],
        "heads_json other model": [f, "--heads_json", stats, *out],
        "heads_json missing": [f, "--heads_json", str(tmp_path / "absent.json"), *out],
        "heads_json not json": [f, "--heads_json", str(tmp_path / "short.talp"), *out],
        "heads_json a list": [f, "--heads_json", str(tmp_path / "list.json"), *out],
        "rollout and grid": [f, "--rollout", "--grid", *out],
        "rollout decoder": [f, "--rollout", "--kind", "decoder_self", *out],
        "rollout layer": [f, "--rollout", "--layer", "2", *out],
        "gold on self-attention": [f, "--gold", str(tmp_path / "short.talp"), "--kind",
                                   "encoder_self", "--out", str(tmp_path / "o.png")],
        "gold of other sentences": [f, "--gold", str(tmp_path / "far.talp"), *out],
    }


def test_bad_inputs_one_line_exit_2_no_files(tmp_path):
    map_file = save_maps(tmp_path / "maps" / "m.npz", make_maps(heads=3))
    save_maps(tmp_path / "maps" / "two_heads.npz", make_maps(heads=2))
    cases = _bad_inputs(tmp_path, map_file)
    before = sorted(tmp_path.rglob("*"))
    results = dict(zip(cases, run_cli(*cases.values()), strict=True))
    for name, result in results.items():
        assert result.returncode == 2, (name, result.stderr)
        assert result.stdout == "", name
        assert re.fullmatch(r"error: [^\n]+\n", result.stderr), (name, result.stderr)
    assert sorted(tmp_path.rglob("*")) == before
    assert "malformed.talp:2: not a 1-indexed TALP link: 'x-y'" in results["gold malformed"].stderr
    assert results["several without --html"].stderr == (
        "error: 2 map files given: several files only make sense with --html (one viewer with "
        "a step slider over them)\n")


def test_module_entry_point_subprocess(tmp_path, map_file):
    """The real `python -m attention.inspect`: absl flags reach `run`; one error line."""
    maps, chosen = gold_peaked_maps()
    gold_maps = save_maps(tmp_path / "gold.npz", maps)
    out, html = tmp_path / "fig.png", tmp_path / "view.html"
    later = save_maps(tmp_path / "step_2000.npz", make_maps(heads=3, seed=5, step=2000))
    steps_html = tmp_path / "steps.html"
    png, grid, align, gold, bad, slider, rolled = run_cli(
        [str(map_file), "--example", "2", "--kind", "decoder_self", "--layer", "-1",
         "--head", "1"],
        [str(map_file), "--out", str(out), "--html", str(html), "--grid"],
        [str(map_file), "--align", "--layers=1,2", "--heads", "0", "--shift", "--html",
         str(tmp_path / "align.html")],
        [str(gold_maps), "--align", "--words", "--keep-eos", "--gold",
         str(FIXTURES / "rwth_de_en.head10.talp")],
        [str(map_file), "--head", "9", "--out", str(tmp_path / "x.png")],
        [str(later), str(map_file), "--html", str(steps_html)],
        [str(map_file), "--rollout", "--example", "1", "--out", str(tmp_path / "roll.png")])
    for result in (png, grid, align, gold, slider, rolled):
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
    assert slider.stdout == f"{steps_html}\n"
    data = page_payload(steps_html.read_text(encoding="utf-8"))
    # The given order does not count: map_file (named step_100) holds step 1200.
    assert [(s["step"], s["file"]) for s in data["steps"]] == [(1200, "step_100.npz"),
                                                               (2000, "step_2000.npz")]
    assert rolled.stdout == f"{tmp_path / 'roll.png'}\n" and png_size(tmp_path / "roll.png")[0] > 200
