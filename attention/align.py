"""Word alignment of any bitext with a trained model's cross-attention (issue 16).

    python -m attention.align --workdir W (--pairs FILE | --source F --target F)
        [--gold gold.talp] [--reverse_workdir W2]
        [--symmetrize grow-diag-final-and|intersect|union|none]
        [--layer L|mean|alignment|alignment_reverse|alignment_joint] [--heads mean|0,2]
        [--[no]shift] [--[no]words] [--threshold argmax|X] [--prior_weight W]
        [--checkpoint best|last|STEP] [--select] [--plot PNG [--plot_pair K]]

stdout: one Pharaoh line per input pair, in order, nothing dropped: 0-indexed `i-j`
links between the i-th source and j-th target word of the given whitespace words
(`src ||| tgt`; the source side is the model's source language). Each pair is
teacher-forced through the model; each word is encoded on its own (SentencePiece
splits at whitespace anyway), so its pieces are known and always merged back into it.
A pair longer than `max_tokens` pieces on a side (1024, or the learned positions) is
cut into proportional consecutive chunks, aligned chunk by chunk: still one line.

How links are read (`attention.alignment.links_from_rows`): the cross-attention of
decoder layer `--layer` (or the mean of all), averaged over `--heads`; the row where a
target piece is predicted, or with `--shift` where it is the decoder input (Chen et al.
2020); argmax, or every source piece with a weight >= `--threshold`. A model trained
with `model.alignment_head` (models/alignment_head.py) also offers `--layer alignment`:
its posterior p(source piece | x, y), which sees the target piece itself (no shift
applies): the mixture's, or with `model.alignment_jumps` the HMM's forward-backward
marginals, which see the whole target; it is the default for such a model.
`--prior_weight W` (0 to 1, default 1) raises the head's prior attention (its
transitions) to W in that posterior: 0 reads the lexical table alone (IBM model 1's
reading), for a prior that has not learned where to look yet
(`models.forced_alignment.head_posterior`).
A run with the reverse twin (`model.alignment_reverse`) also offers `--layer
alignment_reverse` and `--layer alignment_joint`: the geometric mean of the two heads'
posteriors, a link where both directions agree (Liang et al. 2006's posterior decoding;
`models.forced_alignment.joint_posterior`).
`--words` merges the map into words first (a target word's piece rows averaged, a
source word's piece columns summed) and reads that, instead of merging the pieces' links.
`--reverse_workdir` adds a model of the opposite direction (its links are transposed)
and `--symmetrize` combines both (`attention.alignment_scoring.symmetrize`, atools' order);
without a reverse model, `--symmetrize` combines one map's argmax rows with its columns
(each source word's most likely target word: the map read the other way).

`--gold F` (TALP, 1-indexed, sure `i-j` / possible `ipj`) only scores: stderr gets
`AER: x precision: p recall: r` (percent, all pairs), then the same for the first
`--dev_sentences` (100) pairs and the others, and the settings. `--select` (needs
--gold) tries every saved checkpoint x layer (each, mean, the head with each of
PRIOR_WEIGHTS) x shift x piece or word map x threshold (argmax and THRESHOLDS) and the
argmax rows with the columns (each symmetrisation) on the first 100 pairs alone, with a
reverse model also the symmetrisations of each direction's best 5, keeps
the lowest dev AER and stores it in
`<workdir>/eval/alignment.json`. A flag not given takes that stored value, else the
built-in default (best checkpoint, the head or else the penultimate layer, heads mean,
no shift, argmax;
grow-diag-final-and with a reverse model): the bare command reproduces the figures.
`--plot PNG` also draws one pair (`--plot_pair`, default 0) as a word-level map of what
the links were read from, with its links and, with `--gold`, its gold links on it.
From Python: `align(workdir, sources, targets, golds=...) -> dict` and `select(...)`.
"""

from __future__ import annotations

import datetime
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from absl import flags
from absl import logging as absl_logging

from attention.align_settings import (
    RESULT_FILE,
    SETTING_KEYS,
    describe,
    parse_heads,
    parse_layer,
    parse_threshold,
    stored_settings,
)
from attention.alignment import (
    HEAD_LAYER,
    HEAD_LAYERS,
    JOINT_HEADS_LAYER,
    REVERSE_HEAD_LAYER,
    format_pharaoh,
    read_gold,
    read_pairs,
    read_sides,
)
from attention.alignment_scoring import SYMMETRIZE, alignment_scores, symmetrize
from configs import cli
from configs.errors import UserError
from configs.files import prepare_output_folder, write_atomic
from models.forced_alignment import Recorded

FLAGS = flags.FLAGS
DEV_SENTENCES = 100  # the protocol: every setting is chosen on the first 100 gold pairs
THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
PRIOR_WEIGHTS = (1.0, 0.5, 0.25, 0.0)  # the head's posterior: prior^w x lexical
TOP_PER_DIRECTION = 5  # each direction's best settings combined by --select


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    flags.DEFINE_string("workdir", None, "Trained run (config.json, tokenizer/, checkpoints/).")
    flags.DEFINE_string("pairs", None, "'src ||| tgt' lines of whitespace-tokenized words.")
    flags.DEFINE_string("source", None, "Source sentences, one per line (with --target).")
    flags.DEFINE_string("target", None, "Target sentences, one per line (with --source).")
    flags.DEFINE_string("gold", None, "Gold links (.talp) to score against; links unchanged.")
    flags.DEFINE_string("reverse_workdir", None, "A run of the opposite direction.")
    flags.DEFINE_enum("symmetrize", None, [*SYMMETRIZE, "none"], "How to combine directions "
                      "(without --reverse_workdir: the map's rows with its columns).")
    flags.DEFINE_string("layer", None, "Decoder layer (negative from the end), mean, or "
                        f"{HEAD_LAYER} (the model's alignment head), {REVERSE_HEAD_LAYER} "
                        f"(its reverse twin) or {JOINT_HEADS_LAYER} (the two heads' agreement).")
    flags.DEFINE_string("heads", None, "mean, or comma-separated head indices to average.")
    flags.DEFINE_bool("shift", None, "Read the row where the target word is the input.")
    flags.DEFINE_bool("words", None, "Merge the map into words before reading it (else "
                      "each piece's links are merged).")
    flags.DEFINE_string("threshold", None, "argmax, or link every weight >= this number.")
    flags.DEFINE_float("prior_weight", None, "--layer alignment: the head's prior raised to "
                       "this (0 to 1) in its posterior; 0 = lexical table alone.")
    flags.DEFINE_string("checkpoint", None, "best | last | STEP (default: stored, else best).")
    flags.DEFINE_bool("select", False, "Choose the settings on the dev pairs and store them.")
    flags.DEFINE_integer("dev_sentences", DEV_SENTENCES, "Gold pairs that choose settings.")
    flags.DEFINE_integer("batch_size", 32, "Pairs per forced-decoding batch.")
    flags.DEFINE_string("plot", None, "Also draw pair --plot_pair's map with its links (and "
                        "the gold ones) into this PNG.")
    flags.DEFINE_integer("plot_pair", 0, "The pair --plot draws (0-indexed).")


# ----------------------------------------------------------------------- the two functions


def _direction(workdir, stored: dict, given: dict, sources, targets, batch_size, max_tokens):
    """(settings, Recorded) of one direction: given > stored > built-in default."""
    s = {k: given[k] if given.get(k) is not None else stored.get(k) for k in SETTING_KEYS}
    s["checkpoint"] = s["checkpoint"] or "best"
    s["heads"] = "mean" if s["heads"] in (None, "mean") else tuple(s["heads"])
    s["shift"], s["words"] = bool(s["shift"]), bool(s["words"])
    s["threshold"] = None if given.get("threshold") == "argmax" else s["threshold"]
    rec = Recorded(workdir, s["checkpoint"], sources, targets, s["heads"], batch_size, max_tokens)
    s["checkpoint"] = str(rec.step)
    if s["layer"] is None:  # the head when there is one, else the penultimate layer
        s["layer"] = HEAD_LAYER if rec.has_head else max(rec.num_layers - 2, 0)
    s["layer"] = rec.layer_index(s["layer"])
    if s["layer"] not in HEAD_LAYERS:
        if given.get("prior_weight") is not None:
            raise UserError("--prior_weight applies to the heads' layers "
                            f"({', '.join(HEAD_LAYERS)}) only")
        s["prior_weight"] = None
    elif s["prior_weight"] is None:
        s["prior_weight"] = 1.0
    return s, rec


def _own_reverse(fwd: dict, stored: dict, given: dict) -> dict:
    """The settings of a run's own reverse head (REVERSE_HEAD_LAYER) as the reverse
    direction: the forward's checkpoint; words, threshold and prior weight given >
    stored > default."""
    s = {k: given[k] if given.get(k) is not None else stored.get(k)
         for k in ("words", "threshold", "prior_weight")}
    threshold = None if given.get("threshold") == "argmax" else s["threshold"]
    return {"checkpoint": fwd["checkpoint"], "layer": REVERSE_HEAD_LAYER, "heads": fwd["heads"],
            "shift": False, "words": bool(s["words"]), "threshold": threshold,
            "prior_weight": 1.0 if s["prior_weight"] is None else s["prior_weight"]}


def align(workdir: str | Path, sources: Sequence[str], targets: Sequence[str], *,
          golds: Sequence | None = None, reverse_workdir: str | Path | None = None,
          symmetrize_with: str | None = None, batch_size: int = 32,
          dev_sentences: int = DEV_SENTENCES, max_tokens: int | None = None,
          keep_recorded: bool = False, **given) -> dict:
    """Word links of N pairs (and their scores against `golds`).

    Args:
      workdir: a trained run whose source language is the sources'.
      sources, targets: N whitespace-tokenized sentences each.
      golds: optional N (sure, possible) link sets (`read_talp`); they only score.
      reverse_workdir: a run target->source; symmetrize_with: SYMMETRIZE or "none"
        (without a reverse run, stored or given: the forward map's row links combined
        with its column links, `attention.alignment.column_links`).
      given: checkpoint, layer, heads, shift, words, threshold (a float, or "argmax") of the
        forward model; None or absent = the stored `--select` choice, else the default.
        The reverse model takes the same given values, else its stored ones (when it
        is the stored reverse run), else the defaults.
    Returns:
      {"links": N sorted (i, j) lists, "settings": {... , "symmetrize", "reverse"},
       "scores": {"all", "dev", "test"} (alignment_scores dicts; with golds only),
       "recorded": the forward run's `Recorded` (with keep_recorded only)}.
    """
    stored = stored_settings(workdir)
    stored_rev, explicit_rev = stored.get("reverse") or {}, reverse_workdir is not None
    reverse_workdir = reverse_workdir or stored_rev.get("workdir")
    stored_method = stored.get("symmetrize") if stored.get("symmetrize") != "none" else None
    method = symmetrize_with or stored_method or (SYMMETRIZE[0] if explicit_rev else "none")
    own_reverse = bool(reverse_workdir) and (Path(reverse_workdir).resolve()
                                             == Path(workdir).resolve())
    if own_reverse and not cli.load_config_json(workdir).model.get("alignment_reverse"):
        raise UserError(f"--reverse_workdir {reverse_workdir} is the run itself, which has no "
                        "reverse head (model.alignment_reverse): give a run of the other "
                        "direction")
    if method != "none" and reverse_workdir and not own_reverse:  # before any forced decoding
        langs = cli.load_config_json(workdir).data
        rev_langs = cli.load_config_json(reverse_workdir).data
        if (rev_langs.source_lang, rev_langs.target_lang) != (langs.target_lang, langs.source_lang):
            raise UserError(f"{reverse_workdir} translates {rev_langs.source_lang}->"
                            f"{rev_langs.target_lang}, not {langs.target_lang}->{langs.source_lang}")
    fwd, rec = _direction(workdir, stored, given, sources, targets, batch_size, max_tokens)
    one_map = method != "none" and not reverse_workdir  # its rows with its columns
    links = rec.links(fwd["layer"], fwd["shift"], fwd["threshold"],
                      prior_weight=fwd["prior_weight"], words=fwd["words"],
                      both_ways=method if one_map else None)
    settings = {**fwd, "symmetrize": method, "reverse": None}
    if method != "none" and not one_map:
        same = bool(stored_rev) and (Path(stored_rev["workdir"]).resolve()
                                     == Path(reverse_workdir).resolve())
        if own_reverse:  # the run's own reverse head, read from the same forced decoding
            rev = _own_reverse(fwd, stored_rev if same else {}, given)
            back = rec.links(REVERSE_HEAD_LAYER, False, rev["threshold"],
                             prior_weight=rev["prior_weight"], words=rev["words"])
        else:
            rev, rec_rev = _direction(reverse_workdir, stored_rev if same else {}, given,
                                      targets, sources, batch_size, max_tokens)
            back = rec_rev.links(rev["layer"], rev["shift"], rev["threshold"], transpose=True,
                                 prior_weight=rev["prior_weight"], words=rev["words"])
        links = [symmetrize(f, b, method) for f, b in zip(links, back, strict=True)]
        settings["reverse"] = {"workdir": str(Path(reverse_workdir).resolve()), **rev}
    result = {"links": links, "settings": settings, **({"recorded": rec} if keep_recorded else {})}
    if golds is not None:
        result["scores"] = split_scores(links, golds, dev_sentences)
    return result


def split_scores(links: Sequence, golds: Sequence, dev: int) -> dict:
    """alignment_scores on all pairs, the first `dev` and the others (when there are)."""
    parts = {"all": slice(None)}
    if 0 < dev < len(golds):
        parts.update(dev=slice(dev), test=slice(dev, None))
    try:
        return {name: alignment_scores(links[part], golds[part]) for name, part in parts.items()}
    except ValueError as e:  # no link at all on either side
        raise UserError(f"cannot score: {e}") from None


def _candidates(workdir, sources, targets, golds, given, batch_size, max_tokens, transpose):
    """Every setting of one direction on the dev pairs: [(dev AER, settings, links,
    symmetrisation of the map's rows with its columns or "none")], best first. The
    forward direction (not `transpose`) also reads each map both ways (argmax rows with
    the columns, each SYMMETRIZE method)."""
    from models.checkpoint import make_manager
    from models.loading import checkpoint_dir

    cfg = cli.load_config_json(workdir)
    if given.get("checkpoint"):
        steps = [given["checkpoint"]]
    else:
        manager = make_manager(checkpoint_dir(Path(workdir)), cfg.checkpoint.keep, read_only=True)
        steps = [str(s) for s in sorted(manager.all_steps())]
    heads = "mean" if given.get("heads") in (None, "mean") else tuple(given["heads"])
    word_maps = (False, True) if given.get("words") is None else (bool(given["words"]),)
    readings = [(t, "none") for t in (None, *THRESHOLDS)]
    if not transpose:
        readings += [(None, method) for method in SYMMETRIZE]
    out = []
    for step in steps:
        src, tgt = (targets, sources) if transpose else (sources, targets)
        rec = Recorded(workdir, step, src, tgt, heads, batch_size, max_tokens)
        for layer in rec.layers:
            head = layer in HEAD_LAYERS
            if not head:
                weights = (None,)  # only the head has a prior to weigh
            elif given.get("prior_weight") is not None:
                weights = (given["prior_weight"],)
            else:
                weights = PRIOR_WEIGHTS
            shifts = (False,) if head else (False, True)
            for shift, weight, words in itertools.product(shifts, weights, word_maps):
                for threshold, both_ways in readings:
                    links = rec.links(layer, shift, threshold, transpose, prior_weight=weight,
                                      words=words, both_ways=both_ways)
                    settings = {"checkpoint": str(rec.step), "layer": layer, "heads": heads,
                                "shift": shift, "words": words, "threshold": threshold,
                                "prior_weight": weight}
                    out.append((alignment_scores(links, golds)["aer"], settings, links,
                                both_ways))
    return sorted(out, key=lambda c: c[0])  # stable: ties keep the grid order


def select(workdir: str | Path, sources: Sequence[str], targets: Sequence[str], golds: Sequence,
           *, reverse_workdir: str | Path | None = None, dev_sentences: int = DEV_SENTENCES,
           batch_size: int = 32, max_tokens: int | None = None, inputs: dict | None = None,
           keep_recorded: bool = False, **given) -> dict:
    """Chooses the settings with the lowest AER on the first `dev_sentences` pairs, writes
    them to `<workdir>/eval/alignment.json` and returns `align(...)` with them on all pairs
    (plus "grid": the dev AER of every setting tried, best first).

    The grid: every saved checkpoint (or `given["checkpoint"]`) x decoder layer and mean
    (and the head x PRIOR_WEIGHTS) x shift x piece or word map x argmax and THRESHOLDS,
    and the argmax rows with the columns of the same map by each SYMMETRIZE, heads
    averaged (or `given["heads"]`); with `reverse_workdir` the same for it (rows only),
    and every SYMMETRIZE of the two directions' best TOP_PER_DIRECTION row readings.
    `inputs` (file names, say) is stored as provenance.
    """
    prepare_output_folder(Path(workdir) / RESULT_FILE.parent)  # fail before the work
    dev = min(dev_sentences, len(sources)) if dev_sentences > 0 else len(sources)
    args = (sources[:dev], targets[:dev], golds[:dev])
    fwd = _candidates(workdir, *args, given, batch_size, max_tokens, transpose=False)
    best = (fwd[0][0], fwd[0][1], fwd[0][3], None)
    grid = [{"direction": "forward", "dev_aer": a, **s, "symmetrize": m} for a, s, _, m in fwd]
    rows_only = [c for c in fwd if c[3] == "none"]
    if reverse_workdir:
        rev = _candidates(reverse_workdir, *args, given, batch_size, max_tokens, transpose=True)
        grid += [{"direction": "reverse", "dev_aer": a, **s} for a, s, _, _ in rev]
    else:  # the run's own reverse head, if it has one, is the other direction
        reverse_workdir = workdir
        rev = [c for c in rows_only if c[1]["layer"] == REVERSE_HEAD_LAYER]
        rows_only = [c for c in rows_only if c[1]["layer"] != REVERSE_HEAD_LAYER]
    for _, f_set, f_links, _ in rows_only[:TOP_PER_DIRECTION]:
        for _, r_set, r_links, _ in rev[:TOP_PER_DIRECTION]:
            if r_set["layer"] == REVERSE_HEAD_LAYER and r_set["checkpoint"] != f_set["checkpoint"]:
                continue  # the own reverse head is read at the forward's checkpoint
            for method in SYMMETRIZE:
                links = [symmetrize(f, r, method) for f, r in zip(f_links, r_links, strict=True)]
                score = alignment_scores(links, golds[:dev])["aer"]
                if score < best[0]:
                    best = (score, f_set, method, r_set)
    _, f_set, method, r_set = best
    settings = {**f_set, "symmetrize": method, "reverse": None if r_set is None else
                {"workdir": str(Path(reverse_workdir).resolve()), **r_set}}
    stored = {"settings": settings, "selected_on": {**(inputs or {}), "dev_sentences": dev,
                                                    "sentences": len(golds), "grid": len(grid)},
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    write_atomic(Path(workdir) / RESULT_FILE, json.dumps(stored, indent=2) + "\n")
    result = align(workdir, sources, targets, golds=golds, batch_size=batch_size,
                   dev_sentences=dev, max_tokens=max_tokens, keep_recorded=keep_recorded)
    write_atomic(Path(workdir) / RESULT_FILE, json.dumps(
        {**stored, "scores": result["scores"], "grid": grid}, indent=2) + "\n")
    return {**result, "grid": grid}


# ----------------------------------------------------------------------- command line


def plot_pair(result: dict, sources: Sequence[str], targets: Sequence[str],
              golds: Sequence | None, pair: int, out: str) -> None:
    """PNG of pair `pair`: the forward reading's word matrix (the head's posterior or the
    layer's attention, `Recorded.word_matrix`) with the pair's final links (symmetrised,
    if so) as dots and its gold sure / possible links as squares."""
    from attention.plotting import alignment_figure, save_png

    settings = result["settings"]
    matrix = result["recorded"].word_matrix(pair, settings["layer"], settings["shift"],
                                            prior_weight=settings["prior_weight"])
    sure, possible = golds[pair] if golds is not None else (None, None)
    fig = alignment_figure(matrix, targets[pair].split(), sources[pair].split(), sure=sure,
                           possible=possible, predicted=result["links"][pair],
                           title=f"pair {pair} · {describe(settings)}\n"  # two lines fit
                                 f"symmetrize {settings['symmetrize']}",
                           xlabel="source words (</s> left out)", ylabel="target words")
    save_png(fig, out)


def score_lines(result: dict, dev: int) -> list[str]:
    """stderr lines: AER / precision / recall in percent, all pairs first."""
    def line(name: str, s: dict) -> str:
        return (f"AER{name}: {100 * s['aer']:.2f} precision: {100 * s['precision']:.2f} "
                f"recall: {100 * s['recall']:.2f}")

    scores, settings = result["scores"], result["settings"]
    lines = [line("", scores["all"])]
    if "dev" in scores:
        lines += [line(f" first {dev}", scores["dev"]),
                  line(f" other {scores['test']['sentences']}", scores["test"])]
    one_map = settings["symmetrize"] != "none" and not settings["reverse"]
    lines.append(f"settings: {describe(settings)}; symmetrize {settings['symmetrize']}"
                 + (" (the map's argmax rows with its columns)" if one_map else "")
                 + (f"; reverse {settings['reverse']['workdir']}: {describe(settings['reverse'])}"
                    if settings["reverse"] else ""))
    if "grid" in result:
        lines.append(f"selected on the first {dev} pairs among {len(result['grid'])} settings, "
                     f"stored in <workdir>/{RESULT_FILE}")
    return lines


def main(argv: list[str]) -> None:
    """absl main: checks the flags and files, aligns, prints links (and scores)."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = FLAGS
    if not f.workdir:
        raise UserError("--workdir is required")
    if bool(f.pairs) == bool(f.source or f.target) or bool(f.source) != bool(f.target):
        raise UserError("give --pairs FILE, or --source FILE and --target FILE")
    if f.select and not f.gold:
        raise UserError("--select needs --gold")
    if f.prior_weight is not None and not 0.0 <= f.prior_weight <= 1.0:
        raise UserError(f"--prior_weight must be in [0, 1], got {f.prior_weight:g}")
    if f.batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {f.batch_size}")
    if f.plot:
        prepare_output_folder(Path(f.plot).parent)  # fail before the work
    given = {"checkpoint": f.checkpoint, "shift": f.shift, "words": f.words,
             "layer": None if f.layer is None else parse_layer(f.layer),
             "heads": None if f.heads is None else parse_heads(f.heads),
             "threshold": None if f.threshold is None else parse_threshold(f.threshold),
             "prior_weight": f.prior_weight}
    sources, targets = read_pairs(f.pairs) if f.pairs else read_sides(f.source, f.target)
    golds = read_gold(f.gold, sources, targets) if f.gold else None
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO lines on every restore
    from models.compilation import enable_compilation_cache

    enable_compilation_cache()
    if f.plot and not 0 <= f.plot_pair < len(sources):
        raise UserError(f"--plot_pair {f.plot_pair}: the input has pairs 0..{len(sources) - 1}")
    options = dict(reverse_workdir=f.reverse_workdir, dev_sentences=f.dev_sentences,
                   batch_size=f.batch_size, keep_recorded=bool(f.plot), **given)
    if f.select:
        inputs = {"pairs": f.pairs, "source": f.source, "target": f.target, "gold": f.gold}
        result = select(f.workdir, sources, targets, golds,
                        inputs={k: v for k, v in inputs.items() if v}, **options)
    else:
        result = align(f.workdir, sources, targets, golds=golds, symmetrize_with=f.symmetrize,
                       **options)
    sys.stdout.write("".join(format_pharaoh(links) + "\n" for links in result["links"]))
    sys.stdout.flush()
    if f.plot:
        plot_pair(result, sources, targets, golds, f.plot_pair, f.plot)
    if golds is not None:
        dev = min(f.dev_sentences, len(sources)) if f.select else f.dev_sentences
        print("\n".join(score_lines(result, dev)), file=sys.stderr)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
