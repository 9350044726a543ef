"""The HTML viewer in a real headless Chromium (Playwright): offline, interactive, correct.

Needs the Debian `chromium` package (/usr/bin/chromium); Playwright's own browser
download is not used. Skipped with a reason when either is missing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_mapfile import make_maps

from attention.viewer import write_html

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

    assert errors == []
    assert [r for r in requests if r != url] == []  # nothing fetched beyond the file itself
    page.close()
