"""A self-contained HTML viewer for an attention map file.

`write_html(maps, "maps.html")` writes one file with the data embedded as JSON and a
small hand-written script: no network access, no CDN, it works offline from disk.
Select controls switch the example (`#example`), kind (`#kind`), layer (`#layer`,
each or "mean") and head (`#head`, each or "mean"); the heatmap (`#heatmap`, an HTML
table with token labels on both axes, one `td.cell` per query-key pair) shows the
valid region only, and hovering a cell shows the query token, key token and weight
in `#tooltip`. Weights are stored in thousandths (3 decimals) to keep files small;
the layer / head means are computed in the page from those.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import numpy as np

from attention.mapfile import AttentionMaps
from attention.plotting import AXIS_NAMES
from configs.files import write_atomic

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<link rel="icon" href="data:,">
<title>__TITLE__</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.2em; color: #222; }
#controls label { margin-right: 1em; }
#meta { color: #555; margin: .5em 0 1em; }
#heatmap { border-collapse: collapse; }
#heatmap td.cell { width: 18px; height: 18px; padding: 0; border: 1px solid #fff; }
#heatmap td.cell:hover { outline: 2px solid #e33; }
#heatmap th { font-weight: normal; font-size: 12px; white-space: nowrap; padding: 0 4px; }
#heatmap thead th { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left;
  padding: 4px 0; }
#heatmap tbody th { text-align: right; }
#heatmap th.hot { background: #fde2e2; }
#tooltip { position: fixed; display: none; background: #222; color: #fff; padding: 4px 8px;
  border-radius: 4px; font-size: 13px; pointer-events: none; white-space: nowrap; }
#axes { color: #555; font-size: 13px; margin: .5em 0; }
</style></head>
<body>
<h2>__TITLE__</h2>
<div id="controls">
<label>example <select id="example"></select></label>
<label>kind <select id="kind"></select></label>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
</div>
<div id="meta"></div>
<div id="axes"></div>
<table id="heatmap"></table>
<div id="tooltip"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
// Viridis, 9 stops, linearly interpolated.
const STOPS = [[68,1,84],[71,44,122],[59,81,139],[44,113,142],[33,144,141],
               [39,173,129],[92,200,99],[170,220,50],[253,231,37]];
function color(x) {
  const t = Math.min(Math.max(x, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(t), STOPS.length - 2), f = t - i;
  const c = STOPS[i].map((v, k) => Math.round(v + f * (STOPS[i + 1][k] - v)));
  return "rgb(" + c.join(",") + ")";
}
function fill(select, values, labels, keep) {
  const old = select.value;
  select.textContent = "";
  values.forEach((v, i) => {
    const o = document.createElement("option");
    o.value = v; o.textContent = labels[i]; select.appendChild(o);
  });
  if (keep && values.map(String).includes(old)) select.value = old;
}
function range(n) { return Array.from({length: n}, (_, i) => i); }
function tokens(ex, kind) {
  const q = kind === "encoder_self" ? ex.source : ex.target;
  const k = kind === "decoder_self" ? ex.target : ex.source;
  return [q, k];
}
// Mean over the selected layers and heads of the quantized maps, as floats.
function matrix(ex, kind, layer, head) {
  const maps = ex.maps[kind];
  const layers = layer === "mean" ? range(maps.length) : [Number(layer)];
  const heads = head === "mean" ? range(DATA.heads) : [Number(head)];
  const out = new Float64Array(maps[0][0].length);
  for (const l of layers) for (const h of heads) {
    const m = maps[l][h];
    for (let i = 0; i < m.length; i++) out[i] += m[i];
  }
  const scale = 1000 * layers.length * heads.length;
  return out.map((v) => v / scale);
}
function render() {
  const ex = DATA.examples[Number($("example").value)];
  const kind = $("kind").value, layer = $("layer").value, head = $("head").value;
  const [qs, ks] = tokens(ex, kind);
  const m = matrix(ex, kind, layer, head);
  const vmax = Math.max(1e-6, ...m);
  const table = $("heatmap");
  table.textContent = "";
  const head_row = table.createTHead().insertRow();
  head_row.appendChild(document.createElement("th"));
  ks.forEach((k, j) => {
    const th = document.createElement("th");
    th.textContent = k; th.dataset.k = j; head_row.appendChild(th);
  });
  const body = table.createTBody();
  qs.forEach((q, i) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = q; th.dataset.q = i; tr.appendChild(th);
    ks.forEach((k, j) => {
      const td = tr.insertCell();
      const w = m[i * ks.length + j];
      td.className = "cell"; td.dataset.q = i; td.dataset.k = j;
      td.dataset.w = w.toFixed(3);
      td.style.background = color(w / vmax);
    });
  });
  Object.assign(table.dataset, {example: $("example").value, kind: kind, layer: layer,
                                head: head, rows: qs.length, cols: ks.length});
  const names = DATA.axes[kind];
  $("axes").textContent = "rows: " + names[0] + " \\u00b7 columns: " + names[1] +
    " \\u00b7 colour scale 0 .. " + vmax.toFixed(3);
}
function onKind() {
  const n = DATA.layers[$("kind").value];
  fill($("layer"), ["mean", ...range(n)], ["mean", ...range(n).map(String)], true);
  render();
}
function hover(ev) {
  const td = ev.target.closest("td.cell");
  const tip = $("tooltip");
  document.querySelectorAll("#heatmap th.hot").forEach((th) => th.classList.remove("hot"));
  if (!td) { tip.style.display = "none"; return; }
  const ex = DATA.examples[Number($("example").value)];
  const [qs, ks] = tokens(ex, $("kind").value);
  const q = Number(td.dataset.q), k = Number(td.dataset.k);
  tip.textContent = "query " + q + " \\u201c" + qs[q] + "\\u201d \\u2192 key " + k +
    " \\u201c" + ks[k] + "\\u201d: " + td.dataset.w;
  tip.style.left = (ev.clientX + 14) + "px";
  tip.style.top = (ev.clientY + 14) + "px";
  tip.style.display = "block";
  document.querySelectorAll('#heatmap th[data-q="' + q + '"], #heatmap th[data-k="' + k + '"]')
    .forEach((th) => th.classList.add("hot"));
}
fill($("example"), range(DATA.examples.length),
     DATA.examples.map((ex, i) => i + ": " + ex.source.join(" ").slice(0, 60)), false);
fill($("kind"), DATA.kinds, DATA.kinds, false);
fill($("head"), ["mean", ...range(DATA.heads)], ["mean", ...range(DATA.heads).map(String)], false);
$("meta").textContent = DATA.examples.length + " examples \\u00b7 decode: " + DATA.decode +
  " \\u00b7 step " + DATA.step + " \\u00b7 layers and heads are 0-indexed; the target axis " +
  "is the decoder input (<s> first): row t predicts token t+1";
$("example").addEventListener("change", render);
$("kind").addEventListener("change", onKind);
$("layer").addEventListener("change", render);
$("head").addEventListener("change", render);
$("heatmap").addEventListener("mousemove", hover);
$("heatmap").addEventListener("mouseleave", () => { $("tooltip").style.display = "none"; });
onKind();
</script>
</body></html>
"""

def viewer_data(maps: AttentionMaps) -> dict:
    """The JSON-able payload of the page: tokens and quantized valid regions.

    Each map is stored as examples[i]["maps"][kind][layer][head] = a flat row-major list
    of Q*K integers, the weights in thousandths.
    """
    kinds = ["cross", "encoder_self", "decoder_self"]  # cross first: the default view
    examples = []
    for i in range(maps.num_examples):
        entry = {"source": maps.key_tokens(i, "cross"), "target": maps.query_tokens(i, "cross"),
                 "maps": {}}
        for kind in kinds:
            q, k = len(maps.query_tokens(i, kind)), len(maps.key_tokens(i, kind))
            w = maps.weights(kind)[i, :, :, :q, :k]  # [L, H, Q, K]
            milli = np.rint(w * 1000).astype(np.int32).reshape(w.shape[0], w.shape[1], q * k)
            entry["maps"][kind] = milli.tolist()
        examples.append(entry)
    return {
        "step": maps.step,
        "decode": maps.decode,
        "kinds": kinds,
        "layers": {kind: maps.num_layers(kind) for kind in kinds},
        "heads": maps.num_heads,
        "axes": {kind: list(AXIS_NAMES[kind]) for kind in kinds},
        "examples": examples,
    }


def render_html(maps: AttentionMaps, title: str = "Attention maps") -> str:
    """The complete HTML document as a string."""
    payload = json.dumps(viewer_data(maps), ensure_ascii=False, separators=(",", ":"))
    # Inside <script> only "</" could end the element early; \u003c keeps JSON valid.
    payload = payload.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace(
        "\u2029", "\\u2029")
    before, after = _PAGE.split("__DATA__")
    title = html.escape(title)
    return before.replace("__TITLE__", title) + payload + after


def write_html(maps: AttentionMaps, out_path: str | os.PathLike,
               title: str = "Attention maps") -> Path:
    """Write the viewer for `maps` to `out_path` atomically (UTF-8); returns the path."""
    return write_atomic(out_path, render_html(maps, title))
