"""The HTML viewer in a real headless Chromium (Playwright): offline, interactive, correct.

Needs the Debian `chromium` package (/usr/bin/chromium); Playwright's own browser
download is not used. Skipped with a reason when either is missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_mapfile import make_maps
from test_plotting_overlay import OVERLAY_TALP, overlay_maps

from analysis.inspect import run
from analysis.viewer import write_html
from attention.mapfile import save_maps

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    executable = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    if executable is None:
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=ARGS)
        yield browser
        browser.close()


def open_page(browser, path: Path):
    """A page showing `path`, recording console errors and every request it makes."""
    page = browser.new_page()
    errors, requests = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    return page, errors, [r for r in requests if r != path.as_uri()]


def shown(page) -> dict:
    """What the large view shows, from #heatmap's data attributes."""
    return {k: page.locator("#heatmap").get_attribute(f"data-{k}")
            for k in ("step", "example", "kind", "layer", "head", "rows", "cols")}


def weight(page, q: int, k: int) -> float:
    return float(page.locator(f"#heatmap td.cell[data-q='{q}'][data-k='{k}']")
                 .get_attribute("data-w"))


def test_viewer_switches_maps_and_shows_tokens_on_hover(browser, tmp_path):
    maps = make_maps(src_lens=(5, 3, 4), tgt_lens=(4, 6, 2), l_enc=2, l_dec=3, heads=2)
    path = write_html(maps, tmp_path / "maps.html", title="viewer test")
    url = path.as_uri()
    page = browser.new_page()
    errors, requests = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    heatmap = page.locator("#heatmap")

    def shown() -> dict:
        return {k: heatmap.get_attribute(f"data-{k}")
                for k in ("example", "kind", "layer", "head", "rows", "cols")}

    # Default: example 0, cross, layer mean, head mean; T=4 queries x S=5 keys.
    assert shown() == {"example": "0", "kind": "cross", "layer": "mean", "head": "mean",
                       "rows": "4", "cols": "5"}
    assert page.locator("#heatmap td.cell").count() == 4 * 5
    assert page.locator("#heatmap thead th").all_text_contents()[1:] == maps.key_tokens(0, "cross")
    assert page.locator("#heatmap tbody th").all_text_contents() == maps.query_tokens(0, "cross")
    mean = float(page.locator("#heatmap td.cell[data-q='2'][data-k='1']").get_attribute("data-w"))
    assert mean == pytest.approx(float(maps.matrix(0, "cross")[2, 1]), abs=2e-3)

    page.select_option("#example", "1")
    assert page.locator("#heatmap td.cell").count() == 6 * 3
    page.select_option("#kind", "encoder_self")
    assert page.locator("#layer option").all_text_contents() == ["mean", "0", "1"]
    assert shown()["rows"] == "3" and page.locator("#heatmap td.cell").count() == 3 * 3
    page.select_option("#kind", "decoder_self")
    assert page.locator("#layer option").all_text_contents() == ["mean", "0", "1", "2"]
    page.select_option("#layer", "2")
    page.select_option("#head", "1")
    assert shown() == {"example": "1", "kind": "decoder_self", "layer": "2", "head": "1",
                       "rows": "6", "cols": "6"}
    cell = page.locator("#heatmap td.cell[data-q='3'][data-k='1']")
    assert float(cell.get_attribute("data-w")) == pytest.approx(
        float(maps.decoder_self[1, 2, 1, 3, 1]), abs=6e-4)
    # Causal: every cell above the diagonal shows weight 0.
    future = page.locator("#heatmap td.cell").evaluate_all(
        "cells => cells.filter(c => +c.dataset.k > +c.dataset.q).map(c => +c.dataset.w)")
    assert len(future) == 15 and set(future) == {0}

    cell.hover()
    tooltip = page.locator("#tooltip")
    assert tooltip.is_visible()
    text = tooltip.text_content()
    assert "query 3 “▁play”" in text and "key 1 “▁A”" in text and cell.get_attribute("data-w") in text

    page.select_option("#kind", "cross")  # layer 2 is still valid for cross: kept
    assert shown()["layer"] == "2" and page.locator("#heatmap td.cell").count() == 6 * 3
    page.select_option("#example", "2")
    page.locator("#heatmap td.cell[data-q='1'][data-k='0']").hover()
    assert "query 1 “▁A”" in tooltip.text_content() and "key 0 “▁Ein”" in tooltip.text_content()

    assert not page.locator("#step-control").is_visible()  # one file: no step slider
    assert not page.locator("#metric-control").is_visible()  # no head figures given
    assert errors == []
    assert [r for r in requests if r != url] == []  # nothing fetched beyond the file itself
    page.close()


def test_step_slider_keeps_the_selection(browser, tmp_path):
    """Three steps given out of order; the middle one has other sentences (its own tokens)."""
    steps = {2000: make_maps(l_enc=2, l_dec=3, heads=2, seed=2, step=2000),
             500: make_maps(l_enc=2, l_dec=3, heads=2, seed=0, step=500),
             1000: make_maps(src_lens=(3, 4), tgt_lens=(5, 6), l_enc=2, l_dec=3, heads=2, seed=1,
                             step=1000)}
    path = write_html(list(steps.values()), tmp_path / "steps.html",
                      names=[f"valid_step{s:07d}_teacher_forced.npz" for s in steps])
    page, errors, requests = open_page(browser, path)
    slider = page.locator("#step")
    assert page.locator("#step-control").is_visible() and slider.get_attribute("max") == "2"
    assert "step 500 (1 of 3)" in page.locator("#step-label").text_content()
    page.select_option("#example", "1")
    page.select_option("#kind", "decoder_self")
    page.select_option("#layer", "2")
    page.select_option("#head", "1")
    before = shown(page)
    assert before == {"step": "500", "example": "1", "kind": "decoder_self", "layer": "2",
                      "head": "1", "rows": "6", "cols": "6"}
    assert weight(page, 3, 1) == pytest.approx(float(steps[500].decoder_self[1, 2, 1, 3, 1]),
                                               abs=6e-4)

    slider.focus()
    page.keyboard.press("ArrowRight")  # a real slider move: step 1000
    assert shown(page) == {**before, "step": "1000"}
    assert "step 1000 (2 of 3) · teacher_forced · valid_step0001000_teacher_forced.npz" in \
        page.locator("#step-label").text_content()
    assert weight(page, 3, 1) == pytest.approx(float(steps[1000].decoder_self[1, 2, 1, 3, 1]),
                                               abs=6e-4)
    assert weight(page, 3, 1) != pytest.approx(float(steps[500].decoder_self[1, 2, 1, 3, 1]),
                                               abs=6e-4)
    assert page.locator("#example option").count() == 2  # this step's own sentences
    page.select_option("#kind", "cross")
    assert page.locator("#heatmap thead th").all_text_contents()[1:] == \
        steps[1000].key_tokens(1, "cross")
    assert page.locator("#heatmap tbody th").all_text_contents() == \
        steps[1000].query_tokens(1, "cross")

    slider.focus()
    page.keyboard.press("End")  # the last step
    assert shown(page)["step"] == "2000" and shown(page)["layer"] == "2"
    assert page.locator("#heatmap td.cell").count() == 6 * 3  # example 1 of step 2000: T=6, S=3
    assert weight(page, 4, 2) == pytest.approx(float(steps[2000].cross[1, 2, 1, 4, 2]), abs=6e-4)
    assert errors == [] and requests == []
    page.close()


def test_model_view_small_multiples_enlarge_on_click(browser, tmp_path):
    maps = make_maps(src_lens=(5, 3, 4), tgt_lens=(4, 6, 2), l_enc=2, l_dec=3, heads=4)
    page, errors, requests = open_page(browser, write_html(maps, tmp_path / "m.html"))
    cells = page.locator("#model-view .mv-cell")
    assert cells.count() == 3 * 4  # cross: 3 decoder layers x 4 heads
    assert page.locator("#model-view").get_attribute("data-layers") == "3"
    assert page.locator("#model-view thead th").all_text_contents()[1:] == [
        "head 0", "head 1", "head 2", "head 3"]
    assert page.locator("#model-view tbody th").all_text_contents() == [
        "layer 0", "layer 1", "layer 2"]
    # Each small multiple is drawn: a canvas with one square per query-key pair (T=4, S=5).
    size = page.locator("#model-view canvas").first.evaluate("c => [c.width, c.height]")
    assert size[0] % 5 == 0 and size[1] % 4 == 0 and size[0] // 5 == size[1] // 4 >= 4
    assert page.locator("#model-view .mv-cell.chosen").count() == 0  # layer and head mean

    page.locator("#model-view .mv-cell[data-layer='1'][data-head='3']").click()
    assert shown(page) == {"step": "1200", "example": "0", "kind": "cross", "layer": "1",
                           "head": "3", "rows": "4", "cols": "5"}
    assert page.locator("#layer").input_value() == "1" and page.locator("#head").input_value() == "3"
    assert weight(page, 2, 4) == pytest.approx(float(maps.cross[0, 1, 3, 2, 4]), abs=6e-4)
    chosen = page.locator("#model-view .mv-cell.chosen")
    assert chosen.count() == 1 and chosen.get_attribute("data-layer") == "1"
    page.select_option("#head", "mean")  # a layer's heads averaged: its row is outlined
    assert page.locator("#model-view .mv-cell.chosen").count() == 4

    page.select_option("#kind", "encoder_self")
    assert cells.count() == 2 * 4
    page.select_option("#example", "2")
    page.locator("#model-view .mv-cell[data-layer='0'][data-head='2']").click()
    assert shown(page)["rows"] == "4" and shown(page)["head"] == "2"
    assert weight(page, 3, 0) == pytest.approx(float(maps.encoder_self[2, 0, 2, 3, 0]), abs=6e-4)
    assert errors == [] and requests == []
    page.close()


def test_head_figures_from_heads_json(browser, tmp_path):
    maps = make_maps(l_enc=2, l_dec=3, heads=2)
    map_file = save_maps(tmp_path / "maps.npz", maps)
    cross = {"importance": [[0.5, 0.25], [0.125, 1.5], [0.0, 0.75]],
             "entropy": [[1.0, 2.0], [3.0, None], [0.5, 0.25]],
             "eos": [[0.9, 0.1], [0.2, 0.3], [0.6, 0.4]],
             "rare": [[0.1, 0.7], [0.2, 0.3], [0.55, 0.4]],
             "previous": None, "made_up": "not a grid"}
    heads = {"cross": cross, "decoder_self": {"importance": [[1.0, 2.0]] * 3},
             "pruning_curve": [{"heads_removed": 0, "bleu": 30.0}], "prunable_heads": 2}
    (tmp_path / "heads.json").write_text(json.dumps(heads))
    html = tmp_path / "view.html"
    run(map_file, html=str(html), heads_json=str(tmp_path / "heads.json"))
    page, errors, requests = open_page(browser, html)
    assert page.locator("#metric-control").is_visible()
    assert page.locator("#metric option").all_text_contents() == ["importance", "entropy", "eos",
                                                                  "rare"]
    assert "head figures: heads.json" in page.locator("#meta").text_content()

    def cell(layer: int, head: int):
        return page.locator(f"#model-view .mv-cell[data-layer='{layer}'][data-head='{head}']")

    # Captions: importance and the role, the largest role metric above 0.5.
    assert cell(0, 0).locator(".mv-caption").text_content() == "imp 0.50eos"
    assert cell(0, 0).get_attribute("data-role") == "eos"
    assert cell(0, 1).get_attribute("data-role") == "rare"
    assert cell(2, 0).get_attribute("data-role") == "eos"  # eos 0.6 beats rare 0.55
    assert cell(1, 0).get_attribute("data-role") is None
    assert cell(1, 0).locator(".mv-role").text_content() == "\u2013"
    # Borders coloured by the chosen metric: the lowest light, the highest dark.
    assert page.locator("#legend").get_attribute("data-metric") == "importance"
    light, dark = (cell(2, 0).evaluate("c => getComputedStyle(c).borderTopColor"),
                   cell(1, 1).evaluate("c => getComputedStyle(c).borderTopColor"))
    assert light == "rgb(235, 235, 235)" and dark == "rgb(127, 39, 4)"
    page.select_option("#metric", "entropy")
    assert page.locator("#legend").get_attribute("data-metric") == "entropy"
    assert cell(1, 0).get_attribute("data-value") == "3"
    assert "entropy 3.00" in cell(1, 0).locator(".mv-caption").text_content()
    assert "no-value" in cell(1, 1).get_attribute("class")  # null: a dashed border
    # A kind with importance only: no role; a kind without figures: said so.
    page.select_option("#kind", "decoder_self")
    assert page.locator("#metric option").all_text_contents() == ["importance"]
    assert cell(2, 1).locator(".mv-caption").text_content() == "imp 2.00\u2013"
    page.select_option("#kind", "encoder_self")
    assert page.locator("#metric").is_disabled()
    assert page.locator("#legend").text_content() == "no head figures for encoder_self in the heads file"
    assert page.locator("#model-view .mv-caption").all_text_contents() == [""] * 4
    assert errors == [] and requests == []
    page.close()


def marks(page, name: str) -> list[list[int]]:
    """[q, k] of every cell of #heatmap holding a `span.mark.<name>`, sorted."""
    return sorted(page.locator(f"#heatmap td.cell:has(> .mark.{name})").evaluate_all(
        "cells => cells.map(c => [+c.dataset.q, +c.dataset.k])"))


@pytest.mark.parametrize("shift", [False, True])
def test_alignment_overlay_on_the_cross_attention(browser, tmp_path, shift):
    """Gold sure / possible boxes and predicted dots on the expected cells, toggled by
    #show-align, never on the self-attention."""
    map_file = save_maps(tmp_path / "one.npz", overlay_maps())
    (tmp_path / "gold.talp").write_text(OVERLAY_TALP)
    html = tmp_path / "overlay.html"
    run(map_file, html=str(html), gold=str(tmp_path / "gold.talp"), words=True, shift=shift)
    page, errors, requests = open_page(browser, html)
    toggle = page.locator("#show-align")
    assert page.locator("#align-control").is_visible() and toggle.is_checked()
    # Target word "x" (position 1) and "yz" (positions 2, 3), source "a" (0) and "bc"
    # (1, 2); a link sits on the row that predicts its target piece (position - 1), with
    # shift on the row where the piece is the decoder input (its position).
    r = int(shift)
    assert marks(page, "sure") == sorted([[r, 0], [r + 1, 1], [r + 1, 2], [r + 2, 1],
                                          [r + 2, 2]])
    assert marks(page, "possible") == [[r + 1, 0], [r + 2, 0]]
    # Predicted: the argmax real source piece of each target piece's row (OVERLAY_CROSS).
    assert marks(page, "predicted") == ([[0, 0], [1, 2], [2, 0]] if not shift else
                                        [[1, 2], [2, 0], [3, 1]])
    dot = page.locator("#heatmap .mark.predicted").first
    box = dot.bounding_box()
    cell = page.locator("#heatmap td.cell:has(> .mark.predicted)").first.bounding_box()
    assert cell["x"] < box["x"] < box["x"] + box["width"] < cell["x"] + cell["width"]
    assert cell["y"] < box["y"] < box["y"] + box["height"] < cell["y"] + cell["height"]
    legend = page.locator("#align-legend")
    assert legend.is_visible()
    assert "gold.talp line 1" in legend.text_content()
    # Words linked: no shift {a-x, a-yz, bc-yz}: AER 0; shift {bc-x, a-yz, bc-yz}:
    # 1 - (1 + 2) / (3 + 2).
    aer = "0.400" if shift else "0.000"
    assert f"AER of this sentence {aer}" in legend.text_content()
    page.locator(f"#heatmap td.cell[data-q='{r + 1}'][data-k='1']").hover()
    assert page.locator("#tooltip").text_content().endswith("· gold sure")

    toggle.uncheck()
    assert page.locator("#heatmap .mark").count() == 0 and not legend.is_visible()
    assert page.locator("#heatmap td.cell").count() == 4 * 4  # the map itself stays
    toggle.check()
    assert len(marks(page, "sure")) == 5 and legend.is_visible()
    for kind, cells in (("encoder_self", 4 * 4), ("decoder_self", 4 * 4)):
        page.select_option("#kind", kind)
        assert page.locator("#heatmap td.cell").count() == cells
        assert page.locator("#heatmap .mark").count() == 0
        assert toggle.is_disabled() and not legend.is_visible()
    page.select_option("#kind", "cross")
    assert toggle.is_enabled() and len(marks(page, "predicted")) == 3
    assert errors == [] and requests == []
    page.close()


def test_no_overlay_without_alignment_flags(browser, tmp_path):
    page, errors, _ = open_page(browser, write_html(overlay_maps(), tmp_path / "plain.html"))
    assert not page.locator("#align-control").is_visible()
    assert page.locator("#heatmap .mark").count() == 0
    assert not page.locator("#align-legend").is_visible()
    assert errors == []
    page.close()


def test_measure_toggle_norm_and_alti_with_the_source_share(browser, tmp_path):
    from test_contributions import model_maps

    maps = model_maps()  # 2 examples: S 5 and 3, T 4 and 2, with contributions
    page, errors, requests = open_page(browser, write_html(maps, tmp_path / "c.html"))
    assert page.locator("#measure-control").is_visible()
    assert page.locator("#measure option").evaluate_all("o => o.map(x => x.value)") == [
        "weights", "norm", "alti"]
    assert page.locator("#heatmap").get_attribute("data-measure") == "weights"

    page.select_option("#measure", "norm")
    page.select_option("#layer", "1")
    page.select_option("#head", "0")
    assert page.locator("#heatmap").get_attribute("data-measure") == "norm"
    assert weight(page, 2, 1) == pytest.approx(float(maps.norm_cross[0, 1, 0, 2, 1]), abs=1e-3)
    assert weight(page, 2, 1) != pytest.approx(float(maps.cross[0, 1, 0, 2, 1]), abs=1e-2)
    assert page.locator("#model-view .mv-cell").count() == 2 * 2  # layers x heads, norm-based

    page.select_option("#measure", "alti")
    assert shown(page)["rows"] == "4" and shown(page)["cols"] == str(5 + 4)
    assert page.locator("#heatmap thead th").all_text_contents()[1:] == (
        maps.key_tokens(0, "cross") + maps.query_tokens(0, "cross"))
    assert weight(page, 2, 1) == pytest.approx(float(maps.alti_source[0, 2, 1]), abs=1e-3)
    assert weight(page, 2, 5 + 1) == pytest.approx(float(maps.alti_target[0, 2, 1]), abs=1e-3)
    assert weight(page, 1, 5 + 2) == 0  # causal: step 1 draws on no later target token
    assert page.locator("#kind").is_disabled() and page.locator("#layer").is_disabled()
    points = page.locator("#share-curve circle.share-point")
    assert points.count() == 4
    assert [float(v) for v in points.evaluate_all("c => c.map(x => x.dataset.share)")] == (
        pytest.approx(maps.source_share[0, :4].tolist(), abs=1e-3))
    page.locator("#heatmap td.cell[data-q='3'][data-k='6']").hover()
    assert "query 3 “t2”" in page.locator("#tooltip").text_content()
    assert "key 6 “t0”" in page.locator("#tooltip").text_content()
    page.select_option("#example", "1")
    assert shown(page)["cols"] == str(3 + 2) and points.count() == 2

    page.select_option("#measure", "weights")
    assert not page.locator("#layer").is_disabled()
    assert page.locator("#model-view .mv-cell").count() == 2 * 2
    assert shown(page)["layer"] == "1"  # kept through the ALTI+ view
    assert errors == [] and requests == []
    page.close()

    plain, errors, _ = open_page(browser, write_html(make_maps(), tmp_path / "w.html"))
    assert not plain.locator("#measure-control").is_visible() and errors == []
    plain.close()
