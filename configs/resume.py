"""Which config changes a resumed run accepts.

A run's config is saved as `<workdir>/config.json`; running train.py again on that
workdir compares the new config with it:

  * keys starting with SAFE_ON_RESUME change freely (how long to train, how often to
    evaluate, log and save);
  * keys starting with LOCKED_ON_RESUME (the model's shape, the vocabulary, the data and
    its batching) never change: the checkpoint cannot continue under other values...
  * ...except CHANGEABLE_WITH_FLAG ones, which only move files, name evaluation files or
    change how the same computation runs;
  * every other change (the learning rate, say) needs `--allow_config_change=KEY,...`.

`config_diff` (over `flatten_config`'s dotted keys) finds the changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import ml_collections

from common.errors import UserError
from configs import base

SAFE_ON_RESUME = ("data.cache_dir", "train.num_steps", "train.log_every_steps", "train.patience",
                  "train.max_minutes", "train.cpu_devices", "eval.", "checkpoint.",
                  "attention_maps.")
LOCKED_ON_RESUME = ("data.", "model.", "train.flat_optimizer")  # the last: the state's layout
# Not data.pack_length: it decides which pairs make each batch of an epoch (data/packing.py),
# so a change mid-run would repeat or skip pairs of the epoch under way.
CHANGEABLE_WITH_FLAG = ("data.data_dir", "data.hf_cache_dir", "data.valid_source", "data.valid_target", "data.test_source",
                        "data.test_target", "model.dropout", "model.attention_dropout",
                        "model.attention_impl", "model.embedding_grad", "model.dtype")


def check_resume_config(saved: ml_collections.ConfigDict, new: ml_collections.ConfigDict,
                        workdir: str, allowed: Iterable[str] = (),
                        locked: Iterable[str] = ()) -> None:
    """Raises UserError when `new` may not continue the run saved with config `saved`.

    allowed: keys given with --allow_config_change; locked: more keys (or group prefixes
    ending in ".") that never change, as LOCKED_ON_RESUME (a plug-in's,
    training/plugins.py).
    """
    allowed, locked_keys = tuple(allowed), (*LOCKED_ON_RESUME, *locked)
    # A field added to configs/base.py after the run started is no change while it holds
    # its default (the default keeps what the code did before the field existed).
    saved_keys, defaults = flatten_config(saved), flatten_config(base.get_config())
    diff = [(k, old, value) for k, old, value in config_diff(saved, new)
            if not k.startswith(SAFE_ON_RESUME)
            and not (k not in saved_keys and k in defaults and value == defaults[k])]
    locked = [d for d in diff
              if d[0].startswith(locked_keys) and d[0] not in CHANGEABLE_WITH_FLAG]
    unsafe = [d for d in diff if d not in locked and d[0] not in allowed]

    new_keys = flatten_config(new)

    def fields(items):
        # A key only the saved run has came from a version of the code with that option
        # (one since removed, say): say so rather than "-> None".
        return "; ".join(f"{k}: {old!r} -> " + (repr(value) if k in new_keys
                                                 else "(not a key of this code)")
                         for k, old, value in items)

    if locked:
        raise UserError(f"config differs from the checkpointed run in {workdir} in fields that "
                        "fix the model shape, vocabulary, data or train state layout "
                        f"({fields(locked)}); they cannot change on resume: use a new --workdir")
    if unsafe:
        raise UserError(f"config differs from the checkpointed run in {workdir} "
                        f"({fields(unsafe)}); use a new --workdir, or --allow_config_change="
                        f"{','.join(k for k, _, _ in unsafe)} to continue with the new values")


def flatten_config(config: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    """{dotted key: value} with JSON-normalized values (tuples become lists)."""
    tree = json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict") else config))
    flat: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(tree, "")
    return flat


def config_diff(old: ml_collections.ConfigDict | dict, new: ml_collections.ConfigDict | dict,
                ignore: Iterable[str] = ()) -> list[tuple[str, Any, Any]]:
    """Differences between two configs, for the resume guard.

    Args:
      old, new: configs (or plain nested dicts, e.g. parsed config.json).
      ignore: dotted keys or group prefixes ("eval" or "eval.") to skip.
    Returns:
      Sorted [(dotted key, old value, new value)]; a key present on one side
      only has None on the other.
    """
    prefixes = tuple(p.rstrip(".") for p in ignore)
    a, b = flatten_config(old), flatten_config(new)
    out = []
    for key in sorted(a.keys() | b.keys()):
        if any(key == p or key.startswith(p + ".") for p in prefixes):
            continue
        if key not in a or key not in b or a[key] != b[key]:
            out.append((key, a.get(key), b.get(key)))
    return out
