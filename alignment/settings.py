"""The settings of a word-alignment reading (alignment/command.py): what `--select` stores
in `<workdir>/eval/alignment.json`, the flags' text parsed into them, and one line
naming them.

A direction's settings are a dict over SETTING_KEYS: checkpoint (a step, as text),
layer (a decoder layer index, "mean" or one of HEAD_LAYERS), heads ("mean" or a tuple of
indices), shift (bool), words (bool: the map merged into words before it is read; stored
files from before the key read as False), threshold (None = argmax, else a float in (0, 1]) and
prior_weight (the head's, in [0, 1]; None for a layer) and measure (what a decoder
layer's map is: "weights", "norm" or "alti", models/contributions.py; files from before
the key read as "weights").
"""

from __future__ import annotations

import json
from pathlib import Path

from alignment.links import HEAD_LAYERS
from common.errors import UserError

RESULT_FILE = Path("eval") / "alignment.json"  # relative to the workdir
SETTING_KEYS = ("checkpoint", "layer", "heads", "shift", "words", "threshold", "prior_weight",
                "measure")


def result_file(reinit_seed: int | None = None) -> Path:
    """Where `--select` stores its choice, relative to the workdir: RESULT_FILE for the
    run's own parameters, `eval/alignment.reinit<N>.json` for random ones (`--reinit_seed
    N`), so that a sanity check never replaces the trained run's settings."""
    if reinit_seed is None:
        return RESULT_FILE
    return RESULT_FILE.with_name(f"{RESULT_FILE.stem}.reinit{reinit_seed}{RESULT_FILE.suffix}")


def stored_settings(workdir: str | Path, reinit_seed: int | None = None) -> dict:
    """The settings `--select` stored in `<workdir>/` `result_file(reinit_seed)`, or {}."""
    path = Path(workdir) / result_file(reinit_seed)
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))["settings"]
        if not isinstance(settings, dict):
            raise TypeError
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise UserError(f"{path}: not an alignment settings file (run --select again or "
                        "delete it)") from None
    return settings


def parse_layer(text: str) -> int | str:
    """`--layer`: a layer index (negative counts from the last), "mean", or a head layer's name."""
    if text == "mean" or text in HEAD_LAYERS:
        return text
    if text.lstrip("-").isdigit():
        return int(text)
    names = ", ".join(f"'{name}'" for name in HEAD_LAYERS)
    raise UserError(f"--layer must be an index, 'mean' or one of {names}, got {text!r}")


def parse_heads(text: str) -> str | tuple[int, ...]:
    """`--heads`: "mean", or head indices such as "0,2"."""
    try:
        return "mean" if text == "mean" else tuple(int(h) for h in text.split(","))
    except ValueError:
        raise UserError(f"--heads must be 'mean' or indices like 0,2, got {text!r}") from None


def parse_threshold(text: str) -> float | str:
    """"argmax" stays, "0.3" -> 0.3 (in (0, 1])."""
    if text == "argmax":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise UserError(f"--threshold must be 'argmax' or a number in (0, 1], got {text!r}")
    return value


def describe(settings: dict) -> str:
    """One line naming a direction's settings."""
    rule = "argmax" if settings["threshold"] is None else f"threshold {settings['threshold']}"
    heads = settings["heads"] if settings["heads"] == "mean" else ",".join(map(str, settings["heads"]))
    weight = settings.get("prior_weight")
    return (f"checkpoint {settings['checkpoint']}, layer {settings['layer']}, heads {heads}, "
            f"{rule}{', shift' if settings['shift'] else ''}"
            f"{', word map' if settings.get('words') else ''}"
            f"{'' if weight is None else f', prior weight {weight:g}'}"
            f"{'' if settings.get('measure', 'weights') == 'weights' else ', measure ' + settings['measure']}")
