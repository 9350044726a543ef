"""The two functions behind `python -m attention.align` (alignment/command.py, whose
docstring says what each setting reads): `align` reads one setting's word links of a
bitext (and scores them), `select` tries the grid of settings on the first
DEV_SENTENCES gold pairs and stores the best with the run.

    result = align("runs/align_de_en", sources, targets, golds=golds)
    result["links"], result["settings"], result["scores"]["all"]["aer"]
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path

from alignment.forced import Recorded
from alignment.links import (
    HEAD_LAYER,
    HEAD_LAYERS,
    HEADS_AND_STUDENT_LAYER,
    JOINT_HEADS_LAYER,
    PRIOR_LAYERS,
    REVERSE_HEAD_LAYER,
    SYMMETRIZE,
    alignment_scores,
    symmetrize,
)
from alignment.settings import SETTING_KEYS, result_file, stored_settings
from common.errors import UserError
from common.files import prepare_output_folder, write_atomic
from common.workdir_lock import check_not_training, evaluation_locks
from configs import resolved
from configs.alignment_group import GROUP

DEV_SENTENCES = 100  # the protocol: every setting is chosen on the first 100 gold pairs
THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
PRIOR_WEIGHTS = (1.0, 0.5, 0.25, 0.0)  # the head's posterior: prior^w x lexical
TOP_PER_DIRECTION = 5  # each direction's best settings combined by --select
# The joint reading's settings where neither given nor stored: the word map, heads' links
# where the geometric mean of their posteriors is >= 0.3, transitions raised to 0.25. What
# --select chose on the RWTH dev pairs for both runs of configs/align_de_en.py measured
# (on all 508 pairs, W 0.5 or a threshold of 0.25-0.4 was at most 0.7 AER
# worse), so a run of another language pair without gold links to select on reads its
# heads the way that works, not the forward head's argmax (about 6 AER worse there). The
# mean of the heads' and the eflomal-taught student's joint readings (HEADS_AND_STUDENT_LAYER)
# selected the same settings.
JOINT_READING = {"words": True, "threshold": 0.3, "prior_weight": 0.25}


def _given_or_stored(given: dict, stored: dict, keys) -> dict:
    """Each of `keys` given, else stored (else None); a given "argmax" threshold is None
    and words are a bool."""
    s = {k: given[k] if given.get(k) is not None else stored.get(k) for k in keys}
    s["threshold"] = None if given.get("threshold") == "argmax" else s["threshold"]
    s["words"] = bool(s["words"])
    return s


def _direction(workdir, stored: dict, given: dict, sources, targets, batch_size, max_tokens):
    """(settings, Recorded) of one direction: given > stored > built-in default."""
    s = _given_or_stored(given, stored, SETTING_KEYS)
    s["checkpoint"] = s["checkpoint"] or "best"
    s["heads"] = "mean" if s["heads"] in (None, "mean") else tuple(s["heads"])
    s["shift"] = bool(s["shift"])
    s["measure"] = s["measure"] or "weights"
    rec = Recorded(workdir, s["checkpoint"], sources, targets, s["heads"], batch_size, max_tokens,
                   s["measure"], reinit_seed=given.get("reinit_seed"))
    s["checkpoint"] = str(rec.step)
    if s["layer"] is None:  # the recipe's reading: heads and the student they were taught
        # beside (by an outside aligner's links), else the heads' joint reading, the head,
        # the penultimate layer
        taught = (rec.cfg.get(GROUP, {}).get("teacher_links")
                  and HEADS_AND_STUDENT_LAYER in rec.head_layers)
        s["layer"] = (HEADS_AND_STUDENT_LAYER if taught else
                      JOINT_HEADS_LAYER if JOINT_HEADS_LAYER in rec.head_layers else
                      HEAD_LAYER if rec.has_head else max(rec.num_layers - 2, 0))
    s["layer"] = rec.layer_index(s["layer"])
    if s["layer"] in (JOINT_HEADS_LAYER, HEADS_AND_STUDENT_LAYER):
        s.update({k: v for k, v in JOINT_READING.items()
                  if given.get(k) is None and stored.get(k) is None})
    if s["layer"] not in PRIOR_LAYERS:
        if given.get("prior_weight") is not None:
            raise UserError("--prior_weight applies to the heads' layers "
                            f"({', '.join(PRIOR_LAYERS)}) only")
        s["prior_weight"] = None
    elif s["prior_weight"] is None:
        s["prior_weight"] = 1.0
    return s, rec


def _own_reverse(fwd: dict, stored: dict, given: dict) -> dict:
    """The settings of a run's own reverse head (REVERSE_HEAD_LAYER) as the reverse
    direction: the forward's checkpoint; words, threshold and prior weight given >
    stored > default."""
    s = _given_or_stored(given, stored, ("words", "threshold", "prior_weight"))
    return {"checkpoint": fwd["checkpoint"], "layer": REVERSE_HEAD_LAYER, "heads": fwd["heads"],
            "measure": fwd["measure"], "shift": False, "words": s["words"],
            "threshold": s["threshold"],
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
        with its column links, `alignment.links.column_links`).
      given: checkpoint, layer, heads, shift, words, threshold (a float, or "argmax"),
        measure ("weights", "norm", "alti": what a decoder layer's map is) of the
        forward model; None or absent = the stored `--select` choice, else the default.
        The reverse model takes the same given values, else its stored ones (when it
        is the stored reverse run), else the defaults. `reinit_seed` N reads every run
        with random parameters (`evaluation.loading.reinitialised`) and the settings
        stored for them (`alignment.settings.result_file`).
    Returns:
      {"links": N sorted (i, j) lists, "settings": {... , "symmetrize", "reverse"},
       "scores": {"all", "dev", "test"} (alignment_scores dicts; with golds only),
       "recorded": the forward run's `Recorded` (with keep_recorded only)}.
    """
    stored = stored_settings(workdir, given.get("reinit_seed"))
    stored_rev, explicit_rev = stored.get("reverse") or {}, reverse_workdir is not None
    reverse_workdir = reverse_workdir or stored_rev.get("workdir")
    stored_method = stored.get("symmetrize") if stored.get("symmetrize") != "none" else None
    method = symmetrize_with or stored_method or (SYMMETRIZE[0] if explicit_rev else "none")
    own_reverse = bool(reverse_workdir) and (Path(reverse_workdir).resolve()
                                             == Path(workdir).resolve())
    if own_reverse and not resolved.load_config_json(workdir).get(GROUP, {}).get("reverse"):
        raise UserError(f"--reverse_workdir {reverse_workdir} is the run itself, which has no "
                        "reverse head (alignment.reverse): give a run of the other "
                        "direction")
    if method != "none" and reverse_workdir and not own_reverse:  # before any forced decoding
        langs = resolved.load_config_json(workdir).data
        rev_langs = resolved.load_config_json(reverse_workdir).data
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
    from evaluation.loading import kept_steps

    steps = [given["checkpoint"]] if given.get("checkpoint") else [str(s) for s in
                                                                     kept_steps(workdir)]
    heads = "mean" if given.get("heads") in (None, "mean") else tuple(given["heads"])
    measure = given.get("measure") or "weights"  # one measure per --select: not a grid axis
    word_maps = (False, True) if given.get("words") is None else (bool(given["words"]),)
    readings = [(t, "none") for t in (None, *THRESHOLDS)]
    if not transpose:
        readings += [(None, method) for method in SYMMETRIZE]
    out = []
    for step in steps:
        src, tgt = (targets, sources) if transpose else (sources, targets)
        rec = Recorded(workdir, step, src, tgt, heads, batch_size, max_tokens, measure,
                       reinit_seed=given.get("reinit_seed"))
        for layer in rec.layers:
            head = layer in HEAD_LAYERS
            if layer not in PRIOR_LAYERS:
                weights = (None,)  # only the heads have a prior to weigh
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
                                "prior_weight": weight, "measure": measure}
                    out.append((alignment_scores(links, golds)["aer"], settings, links,
                                both_ways))
    return sorted(out, key=lambda c: c[0])  # stable: ties keep the grid order


def select(workdir: str | Path, sources: Sequence[str], targets: Sequence[str], golds: Sequence,
           *, reverse_workdir: str | Path | None = None, dev_sentences: int = DEV_SENTENCES,
           batch_size: int = 32, max_tokens: int | None = None, inputs: dict | None = None,
           keep_recorded: bool = False, **given) -> dict:
    """Chooses the settings with the lowest AER on the first `dev_sentences` pairs, writes
    them to `<workdir>/eval/alignment.json` (with `given["reinit_seed"]` N, random
    parameters: `eval/alignment.reinit<N>.json`) and returns `align(...)` with them on all pairs
    (plus "grid": the dev AER of every setting tried, best first).

    The grid: every saved checkpoint (or `given["checkpoint"]`) x decoder layer and mean
    (and the head x PRIOR_WEIGHTS) x shift x piece or word map x argmax and THRESHOLDS,
    and the argmax rows with the columns of the same map by each SYMMETRIZE, heads
    averaged (or `given["heads"]`); with `reverse_workdir` the same for it (rows only),
    and every SYMMETRIZE of the two directions' best TOP_PER_DIRECTION row readings.
    `inputs` (file names, say) is stored as provenance.
    """
    result_path = Path(workdir) / result_file(given.get("reinit_seed"))
    out = result_path.parent
    if out.is_dir():
        prepare_output_folder(out)  # a read-only or full eval/ fails before the work
    elif not os.access(workdir, os.W_OK):
        raise UserError(f"cannot write {out}: {workdir} is not writable")
    check_not_training(workdir)  # before the work; the lock itself once the checks passed
    dev = min(dev_sentences, len(sources)) if dev_sentences > 0 else len(sources)
    args = (sources[:dev], targets[:dev], golds[:dev])
    fwd = _candidates(workdir, *args, given, batch_size, max_tokens, transpose=False)
    # Only now, with a checkpoint loaded: a refused run (no or damaged checkpoint) leaves
    # the workdir untouched; never into a run being trained (common/workdir_lock.py).
    with evaluation_locks([Path(workdir)], purpose="alignment selection"):
        prepare_output_folder(result_path.parent)
        return _choose(workdir, sources, targets, golds, fwd, dev, result_path, inputs=inputs,
                       reverse_workdir=reverse_workdir, batch_size=batch_size,
                       max_tokens=max_tokens, keep_recorded=keep_recorded, given=given)


def _choose(workdir: str | Path, sources: Sequence[str], targets: Sequence[str],
            golds: Sequence, fwd: list, dev: int, result_path: Path, *, inputs: dict | None,
            reverse_workdir: str | Path | None, batch_size: int, max_tokens: int | None,
            keep_recorded: bool, given: dict) -> dict:
    """`select` from its forward candidates `fwd` on: the reverse direction's, the best
    combination, stored in `result_path`, then `align` with it."""
    args = (sources[:dev], targets[:dev], golds[:dev])
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
    write_atomic(result_path, json.dumps(stored, indent=2) + "\n")
    result = align(workdir, sources, targets, golds=golds, batch_size=batch_size,
                   dev_sentences=dev, max_tokens=max_tokens, keep_recorded=keep_recorded,
                   reinit_seed=given.get("reinit_seed"))
    write_atomic(result_path, json.dumps(
        {**stored, "scores": result["scores"], "grid": grid}, indent=2) + "\n")
    return {**result, "grid": grid}
