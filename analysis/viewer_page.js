// The script of the attention viewer (attention/viewer.py inlines it into the page).
// DATA (see viewer.page_data): steps[s].examples[i].maps[kind][layer][head] = flat
// row-major Q*K weights in thousandths; head_stats[kind][metric] = [L][H] numbers or null;
// with alignment (settings), examples[i].links = {predicted, sure, possible: [[q, k]], aer};
// with contributions (measures beyond "weights"), examples[i].norm[kind][layer][head] (as
// maps) and examples[i].alti = {source: T*S, target: T*T, share: T}, all in thousandths.
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
// Viridis, 9 stops, for the maps; the head metric uses another ramp (light grey to dark
// red) so that a coloured border never reads as an attention weight.
const VIRIDIS = [[68,1,84],[71,44,122],[59,81,139],[44,113,142],[33,144,141],
                 [39,173,129],[92,200,99],[170,220,50],[253,231,37]];
const REDS = [[235,235,235],[253,208,162],[253,141,60],[217,72,1],[127,39,4]];
// heads.json role metrics (attention/head_stats.py); a head gets the largest above 0.5.
const ROLES = ["previous", "same", "next", "eos", "punctuation", "rare"];
const ROLE_THRESHOLD = 0.5;
const SMALL_SIDE = 104;  // pixels of a small multiple's longer side (at most, 1 px a cell)

function ramp(stops, x) {
  const t = Math.min(Math.max(x, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(t), stops.length - 2), f = t - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
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
function fmt(v) {
  if (v === null || v === undefined) return "n/a";
  const a = Math.abs(v);
  return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toPrecision(3) : v.toPrecision(2);
}
function tokens(ex, kind) {
  const q = kind === "encoder_self" ? ex.source : ex.target;
  const k = kind === "decoder_self" ? ex.target : ex.source;
  return [q, k];
}
function measure() { return $("measure").value || "weights"; }
// Rows and columns of the large view: ALTI+ has the source then the target prefix as keys.
function shownTokens(ex, kind) {
  return measure() === "alti" ? [ex.target, ex.source.concat(ex.target)] : tokens(ex, kind);
}
// ALTI+ of one example as one [T, S + T] row-major matrix of floats.
function altiMatrix(ex) {
  const t = ex.target.length, s = ex.source.length, a = ex.alti;
  const out = new Float64Array(t * (s + t));
  for (let i = 0; i < t; i++) {
    for (let j = 0; j < s; j++) out[i * (s + t) + j] = a.source[i * s + j] / 1000;
    for (let j = 0; j < t; j++) out[i * (s + t) + s + j] = a.target[i * t + j] / 1000;
  }
  return out;
}
// Mean over the selected layers and heads of the quantized maps (the weights, or the
// norm-based maps with the "norm" measure), as floats.
function matrix(ex, kind, layer, head) {
  const maps = measure() === "norm" ? ex.norm[kind] : ex.maps[kind];
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
// What the controls select: the step's record, its example and the kind.
function current() {
  const step = DATA.steps[Number($("step").value)];
  return {step: step, ex: step.examples[Number($("example").value)], kind: $("kind").value};
}

function renderHeatmap() {
  const {step, ex, kind} = current();
  const layer = $("layer").value, head = $("head").value, which = measure();
  const [qs, ks] = shownTokens(ex, kind);
  const m = which === "alti" ? altiMatrix(ex) : matrix(ex, kind, layer, head);
  const vmax = Math.max(1e-6, ...m);
  const table = $("heatmap");
  table.textContent = "";
  const headRow = table.createTHead().insertRow();
  headRow.appendChild(document.createElement("th"));
  ks.forEach((k, j) => {
    const th = document.createElement("th");
    th.textContent = k; th.dataset.k = j; headRow.appendChild(th);
  });
  const body = table.createTBody();
  const cells = [];
  qs.forEach((q, i) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = q; th.dataset.q = i; tr.appendChild(th);
    ks.forEach((k, j) => {
      const td = tr.insertCell();
      const w = m[i * ks.length + j];
      td.className = "cell"; td.dataset.q = i; td.dataset.k = j;
      td.dataset.w = w.toFixed(3);
      td.style.background = ramp(VIRIDIS, w / vmax);
      if (which === "alti" && j === ex.source.length) td.classList.add("split");
      cells.push(td);
    });
  });
  drawLinks(ex, kind, cells, qs.length, ks.length);
  Object.assign(table.dataset, {example: $("example").value, kind: kind, layer: layer,
                                head: head, rows: qs.length, cols: ks.length, step: step.step,
                                measure: which});
  const names = which === "alti" ?
    ["target step, decoder input (query)", "the source tokens, then the target prefix"] :
    DATA.axes[kind];
  $("main-title").textContent = (which === "alti" ?
    "ALTI+ contributions (Ferrando et al. 2022): source | target prefix" :
    (which === "norm" ? "norm-based ||\u03b1f(x)|| \u00b7 " : "") + kind + " \u00b7 layer " +
    layer + " \u00b7 head " + head) + " \u00b7 step " + step.step;
  $("axes").textContent = "rows: " + names[0] + " \u00b7 columns: " + names[1] +
    " \u00b7 colour scale 0 .. " + vmax.toFixed(3);
}

// Alignment links on the cross-attention (viewer.alignment_cells): gold boxes and predicted
// dots as span.mark children of the cells [q, k], and the legend that explains them.
const LINKS = [["sure", "gold sure"], ["possible", "gold possible"], ["predicted", "predicted"]];
function legendKey(name, text) {
  const key = document.createElement("span"), mark = document.createElement("span");
  key.className = "key"; mark.className = "mark " + name;
  key.appendChild(mark);
  return [key, text];
}
function drawLinks(ex, kind, cells, rows, cols) {
  const al = DATA.alignment, legend = $("align-legend");
  const on = Boolean(al) && kind === "cross" && Boolean(ex.links) && measure() === "weights";
  $("show-align").disabled = !on;
  legend.textContent = "";
  legend.hidden = !(on && $("show-align").checked);
  if (legend.hidden) return;
  for (const [name, text] of LINKS) for (const [q, k] of ex.links[name] || []) {
    if (q >= rows || k >= cols) continue;
    const td = cells[q * cols + k], mark = document.createElement("span");
    mark.className = "mark " + name;
    td.appendChild(mark);
    td.dataset.links = (td.dataset.links ? td.dataset.links + ", " : "") + text;
  }
  const gold = al.gold_file !== "";
  for (const [name, text] of LINKS.slice(gold ? 0 : 2)) legend.append(...legendKey(name, text));
  const example = Number($("example").value);
  legend.append(document.createElement("br"),
    "predicted: the argmax source piece of each target piece (layers " + al.layers +
    " \u00b7 heads " + al.heads + (al.keep_eos ? " \u00b7 </s> may win" : "") + ")" +
    (gold ? " \u00b7 gold: " + al.gold_file + " line " + (example + 1) +
     (al.words ? "" : " (each word pair marks all its pieces)") +
     " \u00b7 AER of this sentence " + (!al.words ? "with --words" :
                                         ex.links.aer === null ? "n/a" : ex.links.aer.toFixed(3))
     : ""),
    document.createElement("br"),
    "a target token's links sit on the row " + (al.shift ?
      "where it is the decoder input (shift)" : "that predicts it (one row above its label)"));
}

// One small multiple: a canvas with one px-sized square per query-key pair.
function drawSmall(canvas, m, rows, cols) {
  const px = Math.max(1, Math.floor(SMALL_SIDE / Math.max(rows, cols)));
  canvas.width = cols * px; canvas.height = rows * px;
  const ctx = canvas.getContext("2d");
  const vmax = Math.max(1e-6, ...m);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) {
    ctx.fillStyle = ramp(VIRIDIS, m[i * cols + j] / vmax);
    ctx.fillRect(j * px, i * px, px, px);
  }
}
// ALTI+: the source share of each target step as an SVG line (instead of the model view).
const SVG = "http://www.w3.org/2000/svg";
function svg(name, attrs, parent) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}
function renderShareCurve() {
  const {ex} = current();
  const share = ex.alti.share.map((v) => v / 1000), n = share.length;
  const step = Math.max(12, Math.min(40, 480 / Math.max(n, 1)));
  const left = 40, top = 10, height = 160, width = left + 20 + step * Math.max(n - 1, 1);
  const x = (t) => left + 10 + t * step, y = (v) => top + height * (1 - v);
  const root = svg("svg", {id: "share-curve", width: width, height: top + height + 90});
  for (const v of [0, 0.5, 1]) {
    svg("line", {x1: left, x2: width, y1: y(v), y2: y(v), stroke: "#ddd"}, root);
    svg("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11},
        root).textContent = v.toFixed(1);
  }
  svg("polyline", {points: share.map((v, t) => x(t) + "," + y(v)).join(" "), fill: "none",
                   stroke: "#d9480f", "stroke-width": 2}, root);
  share.forEach((v, t) => {
    const dot = svg("circle", {cx: x(t), cy: y(v), r: 4, fill: "#d9480f", class: "share-point",
                               "data-t": t, "data-share": v.toFixed(3)}, root);
    svg("title", {}, dot).textContent = "step " + t + " \u201c" + ex.target[t] +
      "\u201d: source share " + v.toFixed(3);
    svg("text", {x: x(t), y: top + height + 12, "font-size": 11, "text-anchor": "end",
                 transform: "rotate(-60 " + x(t) + " " + (top + height + 12) + ")"},
        root).textContent = ex.target[t];
  });
  const view = $("model-view");
  view.textContent = "";
  view.appendChild(root);
  Object.assign(view.dataset, {kind: "alti", layers: 0, heads: 0});
  const mean = share.reduce((a, b) => a + b, 0) / Math.max(n, 1);
  $("model-title").textContent = "Source share per target step (ALTI+): mean " +
    mean.toFixed(3);
  $("legend").textContent = "the share of the source in each prediction; the rest comes " +
    "from the target prefix";
}
function renderModelView() {
  if (measure() === "alti") { renderShareCurve(); return; }
  $("model-title").textContent = "Model view: all layers \u00d7 heads" +
    (measure() === "norm" ? " (norm-based)" : "") + " (click one to enlarge it)";
  const {ex, kind} = current();
  const layers = DATA.layers[kind], heads = DATA.heads;
  const [qs, ks] = tokens(ex, kind);
  const view = $("model-view");
  view.textContent = "";
  const table = document.createElement("table");
  const headRow = table.createTHead().insertRow();
  headRow.appendChild(document.createElement("th"));
  for (const h of range(heads)) {
    const th = document.createElement("th");
    th.textContent = "head " + h; headRow.appendChild(th);
  }
  const body = table.createTBody();
  for (const l of range(layers)) {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = "layer " + l; tr.appendChild(th);
    for (const h of range(heads)) {
      const cell = document.createElement("div");
      cell.className = "mv-cell"; cell.dataset.layer = l; cell.dataset.head = h;
      const canvas = document.createElement("canvas");
      drawSmall(canvas, matrix(ex, kind, l, h), qs.length, ks.length);
      const caption = document.createElement("div");
      caption.className = "mv-caption";
      cell.append(canvas, caption);
      tr.insertCell().appendChild(cell);
    }
  }
  view.appendChild(table);
  Object.assign(view.dataset, {kind: kind, layers: layers, heads: heads});
  decorate();
}

function headStats(kind) { return (DATA.head_stats || {})[kind] || {}; }
function statAt(stats, metric, l, h) {
  const grid = stats[metric];
  return grid ? grid[l][h] : null;
}
function roleOf(stats, l, h) {
  let best = null, top = ROLE_THRESHOLD;
  for (const r of ROLES) {
    const v = statAt(stats, r, l, h);
    if (v !== null && v > top) { best = r; top = v; }
  }
  return best;
}
// Selection outline, head-metric borders, captions and the legend of the model view.
function decorate() {
  const kind = $("kind").value, layer = $("layer").value, head = $("head").value;
  const stats = headStats(kind), metric = $("metric").value;
  const values = metric && stats[metric] ? stats[metric].flat().filter((v) => v !== null) : [];
  const lo = Math.min(...values), hi = Math.max(...values);
  document.querySelectorAll("#model-view .mv-cell").forEach((cell) => {
    const l = Number(cell.dataset.layer), h = Number(cell.dataset.head);
    // The heads averaged into the large view: one cell, a row or a column (not all of
    // them: outlining every cell would mark nothing).
    cell.classList.toggle("chosen", (layer !== "mean" || head !== "mean") &&
                                    (layer === "mean" || Number(layer) === l) &&
                                    (head === "mean" || Number(head) === h));
    const caption = cell.querySelector(".mv-caption");
    caption.textContent = "";
    delete cell.dataset.value; delete cell.dataset.role;
    cell.classList.remove("no-value");
    cell.style.borderColor = "";
    if (!Object.keys(stats).length) return;
    const lines = [];
    if (stats.importance) lines.push("imp " + fmt(statAt(stats, "importance", l, h)));
    if (metric && metric !== "importance") lines.push(metric + " " + fmt(statAt(stats, metric, l, h)));
    caption.append(lines.join(" \u00b7 "), document.createElement("br"));
    const role = roleOf(stats, l, h);
    const roleSpan = document.createElement("span");
    roleSpan.className = "mv-role";
    roleSpan.textContent = role ? role : "\u2013";
    caption.appendChild(roleSpan);
    if (role) cell.dataset.role = role;
    const v = statAt(stats, metric, l, h);
    if (v === null || !values.length) { cell.classList.add("no-value"); }
    else {
      cell.dataset.value = v;
      cell.style.borderColor = ramp(REDS, hi > lo ? (v - lo) / (hi - lo) : 1);
    }
    cell.title = Object.keys(stats).map((k) => k + ": " + fmt(statAt(stats, k, l, h)))
      .join("\n");
  });
  const legend = $("legend");
  legend.textContent = "";
  if (!DATA.head_stats) return;
  if (!values.length) {
    legend.textContent = "no head figures for " + kind + " in the heads file";
    return;
  }
  const swatch = document.createElement("span");
  swatch.className = "swatch";
  swatch.style.background = "linear-gradient(to right, " +
    [0, 0.25, 0.5, 0.75, 1].map((x) => ramp(REDS, x)).join(", ") + ")";
  legend.append("border: " + metric + " " + fmt(lo), swatch, fmt(hi),
                document.createElement("br"),
                "role: the largest of " + ROLES.join("/") + " above " + ROLE_THRESHOLD);
  legend.dataset.metric = metric;
}

function render() {
  const alti = measure() === "alti";
  for (const id of ["kind", "layer", "head"]) $(id).disabled = alti;
  renderModelView(); renderHeatmap();
}
// The layer and head-metric choices of the kind (kept where they still exist).
function fillKind() {
  const kind = $("kind").value;
  const n = DATA.layers[kind];
  fill($("layer"), ["mean", ...range(n)], ["mean", ...range(n).map(String)], true);
  const metrics = Object.keys(headStats(kind));
  fill($("metric"), metrics, metrics, true);
  $("metric").disabled = !metrics.length;
}
// A new step keeps example, kind, layer and head; only its own tokens and maps change.
function fillStep() {
  const i = Number($("step").value), step = DATA.steps[i];
  fill($("example"), range(step.examples.length),
       step.examples.map((ex, j) => j + ": " + ex.source.join(" ").slice(0, 60)), true);
  $("step-label").textContent = "step " + step.step + " (" + (i + 1) + " of " +
    DATA.steps.length + ") \u00b7 " + step.decode + " \u00b7 " + step.file;
  $("meta").textContent = step.examples.length + " examples \u00b7 decode: " + step.decode +
    " \u00b7 step " + step.step + " \u00b7 layers and heads are 0-indexed; the target axis " +
    "is the decoder input (<s> first): row t predicts token t+1" +
    (DATA.head_stats ? " \u00b7 head figures: " + DATA.head_stats_file +
     " (one set for the model, the same at every step)" : "");
}
function onPick(ev) {
  const cell = ev.target.closest(".mv-cell");
  if (!cell) return;
  $("layer").value = cell.dataset.layer;
  $("head").value = cell.dataset.head;
  renderHeatmap(); decorate();
  $("main").scrollIntoView({block: "nearest"});
}
function hover(ev) {
  const td = ev.target.closest("td.cell");
  const tip = $("tooltip");
  document.querySelectorAll("#heatmap th.hot").forEach((th) => th.classList.remove("hot"));
  if (!td) { tip.style.display = "none"; return; }
  const {ex, kind} = current();
  const [qs, ks] = shownTokens(ex, kind);
  const q = Number(td.dataset.q), k = Number(td.dataset.k);
  tip.textContent = "query " + q + " \u201c" + qs[q] + "\u201d \u2192 key " + k +
    " \u201c" + ks[k] + "\u201d: " + td.dataset.w +
    (td.dataset.links ? " \u00b7 " + td.dataset.links : "");
  tip.style.left = (ev.clientX + 14) + "px";
  tip.style.top = (ev.clientY + 14) + "px";
  tip.style.display = "block";
  document.querySelectorAll('#heatmap th[data-q="' + q + '"], #heatmap th[data-k="' + k + '"]')
    .forEach((th) => th.classList.add("hot"));
}

$("step").max = DATA.steps.length - 1;
$("step-control").hidden = DATA.steps.length < 2;
$("metric-control").hidden = !DATA.head_stats;
$("align-control").hidden = !DATA.alignment;
const MEASURE_NAMES = {weights: "attention weights", norm: "norm-based ||\u03b1f(x)||",
                       alti: "ALTI+ contributions"};
fill($("measure"), DATA.measures, DATA.measures.map((m) => MEASURE_NAMES[m] || m), false);
$("measure-control").hidden = DATA.measures.length < 2;
$("measure").addEventListener("change", render);
fill($("kind"), DATA.kinds, DATA.kinds, false);
fill($("head"), ["mean", ...range(DATA.heads)], ["mean", ...range(DATA.heads).map(String)], false);
$("step").addEventListener("input", () => { fillStep(); render(); });
$("example").addEventListener("change", render);
$("kind").addEventListener("change", () => { fillKind(); render(); });
$("layer").addEventListener("change", () => { renderHeatmap(); decorate(); });
$("head").addEventListener("change", () => { renderHeatmap(); decorate(); });
$("metric").addEventListener("change", decorate);
$("show-align").addEventListener("change", renderHeatmap);
$("model-view").addEventListener("click", onPick);
$("heatmap").addEventListener("mousemove", hover);
$("heatmap").addEventListener("mouseleave", () => { $("tooltip").style.display = "none"; });
fillStep();
fillKind();
render();
