"""Plug-ins: subsystems trained beside translation (word alignment, alignment/plugin.py)
that the translation core -- model, train step, config validation -- does not know.

A config group switches one on by naming its module under `plugin`:

    config.alignment = alignment_group.get_group()  # .plugin = "alignment.plugin"

`active_plugins(cfg)` imports each such module and calls its `make_plugin(cfg)`, which
checks the group (UserError) and returns a `Plugin`. Naming the module in the config,
rather than registering it from an entry point, lets every command that reads a run's
config.json (evaluate.py, the attention.* commands, bench/) build the run's model.

The core calls a plug-in at these points, each optional (the `Plugin` defaults do
nothing):
  * `build_model`: the model to train, a `Transformer` subclass holding the plug-in's
    modules as top-level attributes (training/step.py `build_model`);
  * `param_groups`: top-level parameter names whose gradients are clipped apart
    (training/step.py `clip_by_group_norm`);
  * `aux_losses`: terms added to the training loss (training/step.py `batch_loss`);
  * `read_inputs` / `batch_fields`: the plug-in's input files, read before anything is
    written (their fingerprints kept in the checkpoint, training/loop.py), and the arrays
    it adds to each training batch (data/batching.py `TrainBatcher`);
  * `locked_on_resume`: its config keys that a resumed run cannot change.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

import jax
import ml_collections
from flax import nnx

from common.errors import UserError
from configs.model import ModelConfig
from models.transformer import Features, Transformer

PLUGIN_KEY = "plugin"


class Plugin:
    """What a plug-in adds to training; subclasses override the members they need."""

    # Gradients clipped apart from the rest's, one tuple of top-level parameter names each.
    param_groups: tuple[tuple[str, ...], ...] = ()
    # Dotted config keys (or group prefixes ending in ".") fixed for the life of a run.
    locked_on_resume: tuple[str, ...] = ()

    def build_model(self, config: ModelConfig, rngs: nnx.Rngs) -> Transformer | None:
        """The model to train, or None for the plain `Transformer`."""
        return None

    def read_inputs(self, pairs: int) -> dict[str, str]:
        """Reads and checks the plug-in's input files against the training text of `pairs`
        pairs (UserError), before anything is written; returns {name: SHA-256}, kept in
        the checkpoint so that a resume cannot switch files."""
        return {}

    def batch_fields(self, tokenizer, source_ids, target_ids,
                     dropped: int) -> dict[str, Callable]:
        """Arrays the plug-in adds to each training batch: {name: fields(rows, B, L) -> array
        [B, ...]}, rows the batch's pair indices into source_ids / target_ids (the encoded
        training pairs, `dropped` of them dropped as too long)."""
        return {}

    def aux_losses(self, model: Transformer, batch: dict, features: Features,
                   step: jax.Array | int) -> tuple[jax.Array | float, dict]:
        """(a float32 scalar added to the summed training loss, {name_sum: float32 scalar}
        for the metrics) of one batch; `features` is the translation pass over it
        (`Transformer.features`, with its dropout), `step` the 0-based step (traced)."""
        return 0.0, {}


def active_plugins(cfg: ml_collections.ConfigDict) -> tuple[Plugin, ...]:
    """The plug-ins `cfg` switches on (module docstring), in the config's key order.
    Raises UserError for a module that does not exist or a group it refuses."""
    plugins = []
    for name, group in cfg.items():
        module_name = group.get(PLUGIN_KEY) if hasattr(group, "get") else None
        if not module_name:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise UserError(f"{name}.{PLUGIN_KEY}: no module {module_name!r} ({e})") from None
        plugins.append(module.make_plugin(cfg))
    return tuple(plugins)


def param_groups(plugins: Sequence[Plugin]) -> tuple[tuple[str, ...], ...]:
    """Every plug-in's `param_groups`, together."""
    return tuple(group for plugin in plugins for group in plugin.param_groups)


def locked_keys(*configs: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The `locked_on_resume` keys of the plug-ins of any of `configs` (the saved run's and
    the new one's: switching a plug-in on or off changes the model too)."""
    return tuple(key for cfg in configs for plugin in active_plugins(cfg)
                 for key in plugin.locked_on_resume)
