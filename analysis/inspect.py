"""Inspect saved attention map files (README, journey 3).

    python -m attention.inspect FILE.npz [--example I] [--kind cross|encoder_self|decoder_self]
        [--layer L|mean] [--head H|mean] [--out fig.png] [--grid | --rollout]
        [--html out.html [--heads_json heads.json]]
        [--align] [--gold gold.talp] [--words] [--shift] [--layers 2,3] [--heads mean]
        [--keep-eos] [--measure weights|norm|alti]
    python -m attention.inspect --html out.html [--heads_json heads.json] FILE.npz FILE.npz ...

Without --out / --html / --align it writes `<stem>.ex<I>.<kind>.<layer>.<head>.png`
beside FILE and prints its path. --grid draws all heads of --layer in one PNG.
--rollout draws the attention rollout (analysis/rollout.py) of the encoder
self-attention instead, from the input up to --layer (default: all layers), heads
averaged or --head alone; default name `<stem>.ex<I>.encoder_self.rollout.png`.
--html writes the self-contained viewer of the whole file: every example / kind /
layer / head, and a model view of all layers x heads; --heads_json adds the per-head
figures of `python -m attention.heads` (importance, roles, a metric colouring the model
view). Several FILEs (e.g. a run's `attention/valid_step*_teacher_forced.npz`) go to one
--html viewer with a step slider, in step order; they need the same layers and heads.
--align prints one Pharaoh line (`i-j`, 0-indexed source-target) per example (or just
--example); --gold scores them against the first N lines of a TALP file and prints
`AER = x.xxxx (N sentences)`. Layers and heads are 0-indexed (negative counts from the
end). With --align the paths of written files go to stderr so stdout holds only
alignments.

Alignment overlay: with --align or --gold, the cross-attention PNG (--kind cross, not
--grid / --rollout; with --align only when --out is given) shows the map the links are
read from (--layers / --heads, --shift; `plotting.alignment_matrix`: one row per target
piece, or word with --words: a word's source pieces summed, its target pieces averaged)
with gold sure / possible links as squares and the predicted links as dots, and the
sentence's AER in the title; --html draws the same links on every example's
cross-attention (toggle "show alignments"). --gold alone (no --align) draws, prints no
alignments; gold line i + 1 goes with example i.

--measure picks what is drawn and aligned (models/contributions.py; the file must hold
the contribution arrays: `evaluate.py --save_attention N --contributions` or
`attention_maps.contributions=True`): `weights` (default) the attention weights; `norm`
the norm-based map ||alpha f(x)|| (Kobayashi et al. 2020) of --kind / --layer / --head,
default name `<stem>.ex<I>.<kind>.<layer>.<head>.norm.png`; `alti` the ALTI+
contributions (Ferrando et al. 2022) of every source and target-prefix token to each
target step, with the source share per step in the title and side panel, default name
`<stem>.ex<I>.alti.png` (no layer, head or kind: it spans the whole model). --align reads
its links from the chosen measure (`alti`: the source contributions).

Flags follow the absl convention of `common/cli.py` (`--flag value` or `--flag=value`,
`--noflag` for booleans, `--debug` for tracebacks). Bad input gives one `error: ...` line
on stderr, exit status 2, and no file written. `run(...)` is the same tool as a Python
function: it returns the stdout lines and raises UserError.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from absl import flags

from alignment.links import aer, extract_alignment, format_pharaoh, read_talp
from attention.mapfile import (
    KINDS,
    MEASURES,
    AttentionMaps,
    MapFormatError,
    load_maps,
    validate_maps,
)
from common.errors import UserError

FLAGS = flags.FLAGS
USAGE = "usage: python -m attention.inspect FILE.npz [FILE.npz ...] [flags], see --help"
# The flags of `define_flags`; each is the keyword argument of `run` with "-" as "_"
# ("keep-eos" keeps the dash it always had: absl accepts it).
RUN_FLAGS = ("example", "kind", "layer", "head", "out", "grid", "rollout", "html", "heads_json",
             "align", "gold", "words", "shift", "layers", "heads", "keep-eos", "measure")


def define_flags() -> None:
    """Defines the command-line flags (only when run as a script, so that importing this
    module from tests or other tools never adds global flags)."""
    flags.DEFINE_integer("example", None, "Example index (default 0; with --align: all "
                         "examples).")
    flags.DEFINE_enum("kind", "cross", KINDS, "Attention kind.")
    flags.DEFINE_string("layer", "mean", "Layer index or 'mean'.")
    flags.DEFINE_string("head", "mean", "Head index or 'mean'.")
    flags.DEFINE_string("out", None, "PNG path for the heatmap (or the head grid with --grid).")
    flags.DEFINE_bool("grid", False, "Plot all heads of --layer in a grid.")
    flags.DEFINE_bool("rollout", False, "Plot the attention rollout of the encoder "
                      "self-attention up to --layer (default: all layers), heads averaged or "
                      "--head alone.")
    flags.DEFINE_string("html", None, "Write the self-contained HTML viewer here (of several "
                        "FILEs: one viewer with a step slider).")
    # Not --heads: that flag already picks the heads to average for --align.
    flags.DEFINE_string("heads_json", None, "heads.json of python -m attention.heads: per-head "
                        "importance, roles and metrics in the --html model view.")
    flags.DEFINE_bool("align", False, "Print Pharaoh alignments.")
    flags.DEFINE_string("gold", None, "TALP gold file (1-indexed i-j sure, ipj possible): "
                        "print AER.")
    flags.DEFINE_bool("words", False, "Merge pieces into words.")
    flags.DEFINE_bool("shift", False, "Read the row where the target word is the decoder "
                      "input (Chen et al. 2020).")
    flags.DEFINE_string("layers", None, "Layers to average for --align / --gold: '2,3', '-2' "
                        "or 'mean' (default: --layer).")
    flags.DEFINE_string("heads", None, "Heads to average for --align / --gold (default: "
                        "--head).")
    flags.DEFINE_bool("keep-eos", False, "Let </s> win the argmax (such target tokens stay "
                      "unaligned).")
    flags.DEFINE_enum("measure", "weights", MEASURES, "What to draw and align: attention "
                      "weights, norm-based maps or ALTI+ contributions.")


def _one(value: str, size: int, flag: str, what: str) -> int | str:
    """'mean' or an index in [-size, size) -> 'mean' or a non-negative index."""
    if value == "mean":
        return "mean"
    try:
        index = int(value)
    except ValueError:
        raise UserError(f"{flag} must be an integer or 'mean', got {value!r}") from None
    if not -size <= index < size:
        raise UserError(f"{flag} {index} out of range: {what} (0..{size - 1}) or 'mean'")
    return index % size


def _many(value: str, size: int, flag: str, what: str) -> list[int] | str:
    """'mean' or a comma list of indices -> 'mean' or non-negative indices."""
    if value == "mean":
        return "mean"
    return [int(_one(v.strip(), size, flag, what)) for v in value.split(",")]


def _check_example(maps: AttentionMaps, example: int, name: str) -> None:
    n = maps.num_examples
    if not 0 <= example < n:
        raise UserError(f"--example {example} out of range: {name} has {n} examples (0..{n - 1})")


def _load(path: Path) -> AttentionMaps:
    """load_maps + validate_maps, the invariant's message prefixed with the file."""
    maps = load_maps(path)
    try:
        validate_maps(maps)
    except MapFormatError as e:  # its message names the array, not the file
        raise MapFormatError(f"{path}: {e}") from None
    return maps


def _names(paths: list[Path]) -> list[str]:
    """Labels of the files in the viewer: the file names, or the paths where names repeat."""
    names = [p.name for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def _plot_rollout(maps: AttentionMaps, example: int, layer: int | str, head: int | str,
                  out: str | os.PathLike) -> Path:
    """Rollout of the encoder self-attention from the input up to `layer` ("mean": all)."""
    from analysis.rollout import plot_rollout, rollout

    top = maps.num_layers("encoder_self") - 1 if layer == "mean" else int(layer)
    matrix = rollout(maps.encoder_self[example, : top + 1], int(maps.source_lengths[example]),
                     head=head)  # [S, S], the valid region
    title = (f"attention rollout · encoder_self · layers 0..{top} · head {head}\n"
             f"example {example} · {maps.decode} · step {maps.step}")
    return plot_rollout(matrix, maps.key_tokens(example, "encoder_self"), out, title)


def _norm_figure(maps: AttentionMaps, example: int, kind: str, layer: int | str,
                 head: int | str):
    """The norm-based map ||alpha f(x)|| of one example / kind / layer / head."""
    from attention.heatmaps import AXIS_NAMES, heatmap_title, matrix_figure

    ylabel, xlabel = AXIS_NAMES[kind]
    title = ("norm-based attention ||αf(x)|| (Kobayashi et al. 2020) · "
             + heatmap_title(maps, example, kind, layer, head))
    return matrix_figure(maps.matrix(example, kind, layer, head, measure="norm"),
                         maps.query_tokens(example, kind), maps.key_tokens(example, kind),
                         xlabel=xlabel, ylabel=ylabel, title=title,
                         colorbar_label="||α f(x)||")


def _alti_figure(maps: AttentionMaps, example: int):
    """ALTI+ of one example: a [T, S + T] heatmap, the source then the target prefix,
    and the source share of each step beside it."""
    from attention.heatmaps import matrix_figure

    source, target = maps.alti(example)  # [T, S], [T, T]
    share = source.sum(-1)
    keys = maps.key_tokens(example, "cross") + maps.query_tokens(example, "cross")
    title = (f"ALTI+ contributions (Ferrando et al. 2022) · source | target prefix\n"
             f"example {example} · {maps.decode} · step {maps.step} · "
             f"mean source share {share.mean():.3f}")
    fig = matrix_figure(np.concatenate([source, target], axis=1),
                        maps.query_tokens(example, "cross"), keys,
                        xlabel="source (left) | target prefix, decoder input (right)",
                        ylabel="target step, decoder input (query)", title=title,
                        colorbar_label="contribution")
    ax = fig.axes[0]
    ax.axvline(source.shape[1] - 0.5, color="white", linewidth=2)
    side = ax.inset_axes([1.02, 0.0, 0.12, 1.0], sharey=ax)
    side.barh(range(len(share)), share, color="tab:orange")
    side.set_xlim(0, 1)
    side.set_xlabel("source\nshare", fontsize=8)
    side.tick_params(labelleft=False, labelsize=7)
    return fig


def _read_gold(gold: str, needed: int) -> list:
    """The first `needed` sentences of a TALP file; UserError if unreadable or too short."""
    try:
        links = read_talp(gold)  # UserError for a malformed link, naming the file and line
    except OSError as e:
        raise UserError(f"cannot read --gold {gold}: {e.strerror or e}") from None
    if len(links) < needed:
        raise UserError(f"--gold {gold} has {len(links)} lines but the maps need {needed} "
                        "(example i is scored against line i + 1)")
    return links


def _check_gold_fits(gold: str, links: list, maps: AttentionMaps, name: str,
                     examples: Sequence[int]) -> None:
    """UserError when a gold line links a word past its example's sentence (gold of
    other sentences): the overlay could not draw it."""
    from alignment.figures import token_groups

    for i in examples:
        n_src = len(token_groups(maps.key_tokens(i, "cross"), words=True))
        n_tgt = len(token_groups(maps.query_tokens(i, "cross"), words=True))
        sure, possible = links[i]
        for s, t in sorted(set(sure) | set(possible)):
            if s >= n_src or t >= n_tgt:
                raise UserError(f"--gold {gold} line {i + 1} links words {s + 1}-{t + 1} but "
                                f"example {i} of {name} has {n_src} source and {n_tgt} target "
                                "words: is the gold file for these sentences?")


def _overlay_figure(maps: AttentionMaps, example: int, settings: dict, words: bool,
                    gold: tuple[set, set] | None):
    """The cross-attention PNG figure of one example with its predicted links (the
    `extract_alignment` `settings` and `words`) and gold links; with --words the
    sentence's AER in the title (gold links are words: pieces would not score)."""
    from alignment.figures import alignment_overlay_figure

    predicted = extract_alignment(maps, example, words=words, **settings)
    note = ""
    if gold is not None and words:
        try:
            note = f"AER {aer([predicted], [gold]):.3f}"
        except ValueError:  # no predicted and no sure link
            note = "AER n/a"
    return alignment_overlay_figure(maps, example, layers=settings["layers"],
                                    heads=settings["heads"], shift=settings["shift"],
                                    words=words, predicted=predicted, gold=gold, note=note)


def run(file: str | os.PathLike | Sequence[str | os.PathLike], *, example: int | None = None,
        kind: str = "cross", layer: str = "mean", head: str = "mean", out: str | None = None,
        grid: bool = False, rollout: bool = False, html: str | None = None,
        heads_json: str | None = None, align: bool = False, gold: str | None = None,
        words: bool = False, shift: bool = False, layers: str | None = None,
        heads: str | None = None, keep_eos: bool = False,
        measure: str = "weights") -> list[str]:
    """The whole tool: validate everything, then write files; returns the stdout lines.

    `file` is one map file, or a list of them (several only with `html`: one viewer
    with a step slider). The keyword arguments are the flags (`keep_eos` is
    --keep-eos), with the same defaults. The stdout lines are the written file paths,
    or with `align` one Pharaoh line per example (plus the AER line with `gold`); with
    `align` the written paths go to stderr instead.

    Raises:
      UserError: bad input (MapFormatError included), found before any file is
        written, or an output that cannot be written.
      FileNotFoundError: `file` does not exist.
    """
    align_only = [f for f, on in (("--words", words), ("--shift", shift),
                                  ("--layers", layers), ("--heads", heads),
                                  ("--keep-eos", keep_eos)) if on]
    if align_only and not (align or gold):
        raise UserError(f"{align_only[0]} only applies with --align or --gold")
    if heads_json and not html:
        raise UserError("--heads_json only applies with --html")
    if measure not in MEASURES:  # absl checks the flag; this is for Python callers
        raise UserError(f"--measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    if measure != "weights":
        if html:
            raise UserError(f"--html shows every measure the file holds (the viewer's measure "
                            f"control): drop --measure {measure}")
        other = [f for f, on in (("--grid", grid), ("--rollout", rollout)) if on]
        if other:
            raise UserError(f"{other[0]} draws attention weights only, not --measure {measure}")
    if measure == "alti" and (kind != "cross" or layer != "mean" or head != "mean"):
        raise UserError("--measure alti spans the whole model: no --kind, --layer or --head "
                        "(use --layers / --heads only with weights or norm)")
    if rollout and grid:
        raise UserError("--rollout and --grid draw different figures: choose one")
    if kind not in KINDS:  # absl checks the flag; this is for Python callers
        raise UserError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if rollout and kind == "decoder_self":
        raise UserError("--rollout is for the encoder self-attention, not --kind decoder_self")
    paths = [Path(file)] if isinstance(file, str | os.PathLike) else [Path(f) for f in file]
    if not paths:
        raise UserError(f"missing FILE ({USAGE})")
    if len(paths) > 1:
        if not html:
            raise UserError(f"{len(paths)} map files given: several files only make sense with "
                            "--html (one viewer with a step slider over them)")
        single = [f for f, on in (("--out", out), ("--grid", grid), ("--rollout", rollout),
                                  ("--align", align)) if on]
        if single:
            raise UserError(f"{single[0]} reads one FILE, got {len(paths)} (several files only "
                            "go to --html)")
    every = [_load(p) for p in paths]
    path, maps, name = paths[0], every[0], paths[0].name
    if measure != "weights" and not maps.has_contributions:
        raise UserError(f"{path} has no contribution arrays for --measure {measure}: record "
                        "them with evaluate.py --save_attention N --contributions or "
                        "attention_maps.contributions=True")
    if rollout:  # --layer then counts encoder layers
        kind = "encoder_self"
    n_layers, n_heads = maps.num_layers(kind), maps.num_heads
    layer_i = _one(layer, n_layers, "--layer", f"{kind} has {n_layers} layers")
    head_i = _one(head, n_heads, "--head", f"the model has {n_heads} heads")
    chosen = 0 if example is None else example
    _check_example(maps, chosen, name)
    # The PNG heatmap gets the links (with --align only when asked for by --out).
    png_links = bool((align or gold) and kind == "cross" and not (grid or rollout) and (
        out or not (html or align)))
    if gold and not (align or html or png_links):
        raise UserError("--gold without --align draws links on the cross-attention: give "
                        "--kind cross (a PNG, not --grid / --rollout) or --html")

    lines: list[str] = []
    overlay = None
    if align or gold:
        n_cross = maps.num_layers("cross")
        layer_sel = _many(layers or layer, n_cross, "--layers", f"cross has {n_cross} layers")
        head_sel = _many(heads or head, n_heads, "--heads", f"the model has {n_heads} heads")
        settings = dict(layers=layer_sel, heads=head_sel, shift=shift, skip_eos=not keep_eos)
        examples = list(range(maps.num_examples)) if example is None else [chosen]
        aligned = maps.as_measure(measure)  # links read from the measure's cross map
        links = None
        if gold:
            links = _read_gold(gold, max(examples[-1] + 1 if align else 0,
                                         chosen + 1 if png_links else 0,
                                         *(m.num_examples for m in every if html)))
            if png_links:
                _check_gold_fits(gold, links, maps, name, [chosen])
            for m, label in zip(every, _names(paths), strict=True) if html else ():
                _check_gold_fits(gold, links, m, label, range(m.num_examples))
        if align:
            hyps = [extract_alignment(aligned, i, words=words, **settings) for i in examples]
            lines += [format_pharaoh(h) for h in hyps]
            if gold:
                lines.append(f"AER = {aer(hyps, [links[i] for i in examples]):.4f} "
                             f"({len(examples)} sentences)")
        if html:
            from analysis.viewer import AlignmentOverlay

            overlay = AlignmentOverlay(gold=links, gold_file=Path(gold).name if gold else "",
                                       words=words, **settings)

    # Imported only now: matplotlib is most of the start-up time, and bad input (the
    # common short run) is reported before it is needed.
    from analysis.viewer import check_same_model, load_head_stats, write_html
    from attention.heatmaps import plot_head_grid, plot_heatmap, png_name, save_png

    writers = []  # (flag, path, write): all input is checked before the first write
    if html:
        names = _names(paths)
        check_same_model(every, names)
        stats = load_head_stats(heads_json, maps) if heads_json else None
        steps = sorted(m.step for m in every)
        title = (f"Attention maps: {name}" if len(every) == 1 else
                 f"Attention maps: {len(every)} files, steps {steps[0]}..{steps[-1]}")
        writers.append(("--html", html, lambda p: write_html(
            every, p, title=title, names=names, head_stats=stats,
            head_stats_name=Path(heads_json).name if heads_json else "", overlay=overlay)))
    if rollout:
        target = out or path.with_name(f"{path.stem}.ex{chosen}.encoder_self.rollout.png")
        writers.append(("--out", target, lambda p: _plot_rollout(maps, chosen, layer_i, head_i, p)))
    elif measure == "alti" and (out or not align):
        target = out or path.with_name(f"{path.stem}.ex{chosen}.alti.png")
        writers.append(("--out", target, lambda p: save_png(_alti_figure(maps, chosen), p)))
    elif measure == "norm" and (out or not align):
        target = out or path.with_name(png_name(path.stem, chosen, kind, layer_i, head_i)
                                       .removesuffix(".png") + ".norm.png")
        writers.append(("--out", target, lambda p: save_png(
            _norm_figure(maps, chosen, kind, layer_i, head_i), p)))
    elif out or grid or not (html or align):
        if grid:
            target = out or path.with_name(f"{path.stem}.ex{chosen}.{kind}.{layer_i}.heads.png")
            writers.append(("--out", target,
                            lambda p: plot_head_grid(maps, chosen, kind, layer_i, p)))
        elif png_links:
            sel = [v if isinstance(v, str) else "-".join(map(str, v)) for v in (layer_sel, head_sel)]
            target = out or path.with_name(f"{path.stem}.ex{chosen}.cross.{sel[0]}.{sel[1]}"
                                           ".links.png")
            writers.append(("--out", target, lambda p: save_png(_overlay_figure(
                maps, chosen, settings, words, links[chosen] if gold else None), p)))
        else:
            target = out or path.with_name(png_name(path.stem, chosen, kind, layer_i, head_i))
            writers.append(("--out", target,
                            lambda p: plot_heatmap(maps, chosen, kind, layer_i, head_i, p)))
    for flag, target, write in writers:
        try:
            written = write(target)
        except FileExistsError as e:  # raised by creating the parent folders
            raise UserError(f"cannot write {flag} {target}: {e.filename} is a file, "
                            "not a folder") from None
        except OSError as e:  # e.g. a full disk
            raise UserError(f"cannot write {flag} {target}: {e.strerror or e}") from None
        if align:  # stdout holds only alignments
            print(written, file=sys.stderr)
        else:
            lines.append(str(written))
    return lines


def main(argv: list[str]) -> None:
    """absl main: argv = [program, FILE, ...]; prints `run`'s lines. Raises UserError."""
    if len(argv) < 2:
        raise UserError(f"missing FILE ({USAGE})")
    for line in run(argv[1:], **{f.replace("-", "_"): FLAGS[f].value for f in RUN_FLAGS}):
        print(line)

