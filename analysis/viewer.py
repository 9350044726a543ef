"""A self-contained HTML viewer for attention map files.

`write_html(maps, "maps.html")` writes one file with the data embedded as JSON and a
small hand-written script (attention/viewer_page.html and viewer_page.js, inlined): no
network access, no CDN, it works offline from disk. Controls:

  #step     a slider over several map files of one run (one per validation step, in
            step order; hidden for a single file); a new step keeps the example, kind,
            layer and head, and shows that step's own tokens and maps;
  #example, #kind, #layer (each or "mean"), #head (each or "mean");
  #metric   with head figures (`head_stats`, from `python -m attention.heads`'s
            heads.json): the per-head number that colours the model view's borders;
  #measure  when every file holds contributions (models/contributions.py): "weights",
            "norm" (the norm-based maps ||alpha f(x)||, per layer and head like the
            weights, with their own colour scale) or "alti" (ALTI+: the large view is
            one [T, S + T] map, each target step's contributions of the source tokens
            then of the target prefix; kind, layer and head do not apply, and the model
            view gives way to `#share-curve`, an SVG of the source share over the
            target steps, one `circle.share-point` per step with data-t / data-share).

`#model-view` draws every layer x head of the kind as small multiples (rows = layers,
columns = heads; `.mv-cell` with data-layer / data-head, a caption with the head's
importance and role); clicking one shows it in `#heatmap`, the large view: an HTML table
with token labels on both axes, one `td.cell` per query-key pair of the valid region;
hovering a cell shows the query token, key token and weight in `#tooltip`. Weights are
stored in thousandths (3 decimals) to keep files small; the layer / head means are
computed in the page from those.

Alignment overlay (`overlay=AlignmentOverlay(...)`, `inspect --html --gold` / `--align`):
on the cross-attention only, `#show-align` (checked by default) draws each example's
links on `#heatmap` as `span.mark` children of the cells: `.sure` (solid red box) and
`.possible` (dashed orange box) for the gold links (a word pair marks every cell of its
pieces), `.predicted` (white dot) on the argmax cell of each target piece (the links
of `extract_alignment` with the overlay's layers / heads / shift / keep-eos; with
`words` two words are linked where any of their pieces are). A link of target token j
is drawn on the row that alignment reads: the row predicting it (j - 1 in the map's
positions) or, with `shift`, the row where it is the decoder input. `#align-legend`
explains the marks and gives the sentence's AER; the tooltip names a cell's links.

Page data (`page_data`), JSON:
  {"kinds": [...], "layers": {kind: L}, "heads": H, "axes": {kind: [rows, columns]},
   "measures": ["weights"] or ["weights", "norm", "alti"],
   "head_stats": {kind: {metric: [L][H]}} | null, "head_stats_file": str,
   "alignment": null | {"gold_file": str, "layers": str, "heads": str, "shift": bool,
                        "words": bool, "keep_eos": bool},
   "steps": [{"step": int, "decode": str, "file": str, "examples": [
       {"source": [S tokens], "target": [T tokens],
        "maps": {kind: [L][H][Q*K] ints, weights in thousandths, row-major},
        "links": {"predicted": [[q, k], ...], "sure": [[q, k], ...],
                  "possible": [[q, k], ...], "aer": float | null},
        "norm": {kind: [L][H][Q*K] ints, thousandths},
        "alti": {"source": [T*S], "target": [T*T], "share": [T] ints, thousandths}}]}]}
"norm" and "alti" only with "measures" beyond weights (every file holds contributions);
"links" only with an overlay, "sure" / "possible" / "aer" only with gold; [q, k] are the
cell's row (target position, 0 = <s>) and column (source position) in the map.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alignment.figures import token_groups
from alignment.links import aer, extract_alignment
from attention.heatmaps import AXIS_NAMES
from attention.mapfile import DECODE_MODES, KINDS, MEASURES, AttentionMaps
from common.errors import UserError
from common.files import write_atomic

PAGE = Path(__file__).with_name("viewer_page.html")
SCRIPT = Path(__file__).with_name("viewer_page.js")
# The metrics of analysis/heads.py in the order the page offers them; any other
# [layers][heads] grid of a heads file follows, alphabetically.
HEAD_METRICS = ("importance", "importance_bleu", "importance_grad", "confidence", "entropy",
                "norm_share", "previous", "same", "next", "eos", "punctuation", "rare",
                "gold_agreement")


def _milli(a: np.ndarray) -> list:
    """Values in thousandths as ints, the last two axes flattened row-major."""
    a = np.rint(np.asarray(a, np.float64) * 1000).astype(np.int64)
    return a.reshape(*a.shape[:-2], -1).tolist() if a.ndim >= 2 else a.tolist()


def viewer_data(maps: AttentionMaps, contributions: bool = False) -> dict:
    """The JSON-able payload of one map file: tokens and quantized valid regions.

    Each map is stored as examples[i]["maps"][kind][layer][head] = a flat row-major list
    of Q*K integers, the weights in thousandths; with `contributions` (the file must
    hold them) also "norm" and "alti" (module docstring).
    """
    kinds = ["cross", "encoder_self", "decoder_self"]  # cross first: the default view
    examples = []
    for i in range(maps.num_examples):
        entry = {"source": maps.key_tokens(i, "cross"), "target": maps.query_tokens(i, "cross"),
                 "maps": {}}
        for kind in kinds:
            q, k = len(maps.query_tokens(i, kind)), len(maps.key_tokens(i, kind))
            entry["maps"][kind] = _milli(maps.weights(kind)[i, :, :, :q, :k])  # [L, H, Q*K]
        if contributions:
            entry["norm"] = {kind: _milli(maps.weights(kind, "norm")[
                i, :, :, :len(maps.query_tokens(i, kind)), :len(maps.key_tokens(i, kind))])
                for kind in kinds}
            source, target = maps.alti(i)
            entry["alti"] = {"source": _milli(source), "target": _milli(target),
                             "share": _milli(source.sum(-1))}
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


@dataclass(frozen=True)
class AlignmentOverlay:
    """The alignment links the viewer draws on the cross-attention (module docstring).

    gold: (sure, possible) word links per sentence as from `read_talp`, line i for
      example i of every map file, or None (predicted links only); gold_file: its name.
    layers, heads, shift, skip_eos, words: the settings of `extract_alignment` for the
      predicted links (and the AER against gold).
    """

    gold: Sequence[tuple[set, set]] | None = None
    gold_file: str = ""
    layers: int | str | Sequence[int] = "mean"
    heads: int | str | Sequence[int] = "mean"
    shift: bool = False
    skip_eos: bool = True
    words: bool = False

    def settings(self) -> dict:
        """The page's "alignment" entry."""
        def text(v) -> str:
            return str(v) if isinstance(v, str | int) else ",".join(map(str, v))

        return {"gold_file": self.gold_file if self.gold is not None else "",
                "layers": text(self.layers), "heads": text(self.heads), "shift": self.shift,
                "words": self.words, "keep_eos": not self.skip_eos}


def alignment_cells(maps: AttentionMaps, example: int, overlay: AlignmentOverlay) -> dict:
    """The cross-attention cells [q, k] to mark for one example (module docstring):
    {"predicted": [...]} plus, with gold, "sure", "possible" (those not also sure) and the
    sentence's "aer" of the word links (None without `words` or where undefined). Gold
    links past the sentence are left out."""
    src, tgt = maps.key_tokens(example, "cross"), maps.query_tokens(example, "cross")
    shift = int(overlay.shift)
    options = dict(layers=overlay.layers, heads=overlay.heads, shift=overlay.shift,
                   skip_eos=overlay.skip_eos)
    pieces = extract_alignment(maps, example, words=False, **options)
    src_at, tgt_at = token_groups(src), token_groups(tgt)  # real piece -> [position]
    out: dict = {"predicted": sorted([tgt_at[j][0] - 1 + shift, src_at[i][0]] for i, j in pieces)}
    if overlay.gold is None:
        return out
    sure, possible = (set(links) for links in overlay.gold[example])
    src_words, tgt_words = token_groups(src, words=True), token_groups(tgt, words=True)

    def cells(links: set) -> list[list[int]]:
        return sorted([p - 1 + shift, c] for i, j in links
                      if i < len(src_words) and j < len(tgt_words)
                      for p in tgt_words[j] for c in src_words[i])

    out["sure"], out["possible"] = cells(sure), cells(possible - sure)
    out["aer"] = None  # gold links are words: predicted pieces would not score
    if overlay.words:
        hyp = extract_alignment(maps, example, words=True, **options)
        with contextlib.suppress(ValueError):  # no predicted and no sure link: None
            out["aer"] = round(aer([hyp], [(sure, possible)]), 4)
    return out


def _number(value) -> float | None:
    """A JSON number as a finite float, else None (JSON.parse refuses NaN and Infinity)."""
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _is_grid(value) -> bool:
    """A non-empty list of non-empty lists of numbers or nulls: per-head figures."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(row, list) and row for row in value)
            and all(v is None or (isinstance(v, int | float) and not isinstance(v, bool))
                    for row in value for v in row))


def head_stats_from(tree: Mapping, layers: Mapping[str, int], heads: int,
                    name: str = "heads file") -> dict[str, dict[str, list]]:
    """The per-head figures of a heads.json object, for the page.

    Args:
      tree: the parsed heads.json: {kind: {metric: [L][H] numbers or null}, ...}; other
        top-level keys (pruning_curve, ...) and values that are no [L][H] grid (null,
        scalars, summaries) are skipped, so are kinds it lacks.
      layers: {kind: L} of the maps; heads: H.
    Returns:
      {kind: {metric: [L][H] float or None}}, metrics in HEAD_METRICS order.
    Raises:
      UserError: a grid whose shape is not the maps' [L][H] (another model's figures),
        or no grid at all.
    """
    out = {}
    for kind in KINDS:
        metrics = tree.get(kind)
        if not isinstance(metrics, Mapping):
            continue
        grids = {}
        for metric, grid in metrics.items():
            if not _is_grid(grid):
                continue
            if len(grid) != layers[kind] or any(len(row) != heads for row in grid):
                raise UserError(f"{name}: {kind} {metric} is {len(grid)} x {len(grid[0])} "
                                f"(layers x heads) but the maps have {layers[kind]} x {heads}: "
                                "figures of another model?")
            grids[str(metric)] = [[_number(v) for v in row] for row in grid]
        rank = {m: i for i, m in enumerate(HEAD_METRICS)}
        out[kind] = dict(sorted(grids.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))
    if not any(out.values()):
        raise UserError(f"{name}: no per-head figures ([layers][heads] numbers under "
                        f"{', '.join(KINDS)}); expected the heads.json of python -m attention.heads")
    return out


def load_head_stats(path: str | os.PathLike, maps: AttentionMaps) -> dict[str, dict[str, list]]:
    """Read a heads.json for `maps` (see `head_stats_from`); UserError if it is unreadable,
    not JSON, not an object or of another model."""
    try:
        tree = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e})") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    if not isinstance(tree, dict):
        raise UserError(f"{path}: a JSON {type(tree).__name__}, expected the object of "
                        "python -m attention.heads")
    layers = {kind: maps.num_layers(kind) for kind in KINDS}
    return head_stats_from(tree, layers, maps.num_heads, name=str(path))


def check_same_model(maps: Sequence[AttentionMaps], names: Sequence[str]) -> None:
    """UserError unless all maps have the first one's layers and heads of every kind (one
    slider over steps of one run; examples and tokens may differ)."""
    def dims(m: AttentionMaps) -> str:
        return ", ".join(f"{k} {m.num_layers(k)}" for k in KINDS) + f" layers, {m.num_heads} heads"

    for m, name in zip(maps[1:], names[1:], strict=True):
        if dims(m) != dims(maps[0]):
            raise UserError(f"{name} has {dims(m)} but {names[0]} has {dims(maps[0])}: "
                            "the files of one viewer must come from one model")


def page_data(maps: Sequence[AttentionMaps], names: Sequence[str],
              head_stats: Mapping | None = None, head_stats_name: str = "",
              overlay: AlignmentOverlay | None = None) -> dict:
    """The JSON-able payload of the page (module docstring): one entry of `steps` per map
    file, in order of (step, decode mode, given order), each {"step", "decode", "file",
    "examples"} with the examples of `viewer_data`, plus their "links"
    (`alignment_cells`) with an `overlay`; `head_stats` as returned by `head_stats_from`
    (or None)."""
    if not maps or len(maps) != len(names):
        raise ValueError(f"{len(maps)} maps but {len(names)} names")
    check_same_model(maps, names)
    order = sorted(range(len(maps)),
                   key=lambda i: (maps[i].step, DECODE_MODES.index(maps[i].decode), i))
    contributions = all(m.has_contributions for m in maps)
    steps = []
    for i in order:
        data = viewer_data(maps[i], contributions)
        if overlay is not None:
            for example, entry in enumerate(data["examples"]):
                entry["links"] = alignment_cells(maps[i], example, overlay)
        steps.append({"step": data.pop("step"), "decode": data.pop("decode"),
                      "file": str(names[i]), "examples": data.pop("examples")})
    # What is left of viewer_data (kinds, layers, heads, axes) is the same for every file.
    return {**data, "steps": steps,
            "measures": list(MEASURES) if contributions else ["weights"],
            "head_stats": None if head_stats is None else dict(head_stats),
            "head_stats_file": head_stats_name,
            "alignment": None if overlay is None else overlay.settings()}


def render_html(maps: AttentionMaps | Sequence[AttentionMaps], title: str = "Attention maps", *,
                names: Sequence[str] | None = None, head_stats: Mapping | None = None,
                head_stats_name: str = "", overlay: AlignmentOverlay | None = None) -> str:
    """The complete HTML document as a string.

    Args:
      maps: one file's maps, or several (a step slider; the same model, see page_data).
      names: a label per maps (the file names); default "step N".
      head_stats: per-head figures from `load_head_stats` / `head_stats_from`, or None;
        head_stats_name: where they came from, shown in the page.
      overlay: alignment links to draw on the cross-attention, or None.
    """
    many = [maps] if isinstance(maps, AttentionMaps) else list(maps)
    names = list(names) if names is not None else [f"step {m.step}" for m in many]
    payload = json.dumps(page_data(many, names, head_stats, head_stats_name, overlay),
                         ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # Inside <script> only "</" could end the element early; \u003c keeps JSON valid.
    payload = payload.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace(
        "\u2029", "\\u2029")
    script = SCRIPT.read_text(encoding="utf-8")
    if "</script" in script.lower():  # would end the inline script element early
        raise ValueError(f"{SCRIPT} must not contain '</script'")
    parts = {"TITLE": html.escape(title), "DATA": payload, "SCRIPT": script}
    # One pass: text put in (a title, a token) is never scanned for placeholders again.
    return re.sub(r"__(TITLE|DATA|SCRIPT)__", lambda m: parts[m.group(1)],
                  PAGE.read_text(encoding="utf-8"))


def write_html(maps: AttentionMaps | Sequence[AttentionMaps], out_path: str | os.PathLike,
               title: str = "Attention maps", **options) -> Path:
    """Write the viewer for `maps` (one or several, see render_html, which takes the
    keyword `options`) to `out_path` atomically (UTF-8); returns the path."""
    return write_atomic(out_path, render_html(maps, title, **options))
