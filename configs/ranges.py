"""The range of every config key of configs/base.py, in one table.

`check_ranges(config)` (run by `configs.validation.validate_config`, so before any
work) refuses a value outside its key's range in one line naming the key, e.g.
"train.max_minutes must be at least 0, got -1.0 (0 = no time budget; ...)". A value of
the wrong type never gets here (ml_collections checks each override against the
field's type). The checks that relate several keys (data.spm_sampling_alpha of a BPE
model, share_embeddings with a joint vocabulary, d_model divisible by num_heads, ...)
stay in configs/validation.py and configs/model.py; a plug-in's group (training/
plugins.py) checks its own keys.

Every key of configs/base.py has a row (tests/test_configs.py checks that), so a new key
needs one. Ranges are inclusive unless a bound is marked open; NaN is outside every
range.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections

from common.errors import UserError
from configs.base import DATASETS, NORMALIZATIONS, PATIENCE_METRICS, SCHEDULES, TEXT_PROTOCOLS
from configs.model import (
    ACTIVATIONS,
    ATTENTION_IMPLS,
    DTYPES,
    EMBEDDING_GRADS,
    KERNEL_INITS,
    POSITIONS,
)


def _number(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclasses.dataclass(frozen=True)
class Interval:
    """low <= value <= high (either bound may be None: unbounded; or open)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def contains(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.high is None and not self.low_open:
            return f"must be at least {low}"  # the wording of the other checks
        if self.high is None:
            return f"must be above {low}"
        return (f"must be in {'(' if self.low_open else '['}{low}, {high}"
                f"{')' if self.high_open else ']'}")


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `values`."""

    values: tuple[str, ...]
    why: str = ""

    def contains(self, value: Any) -> bool:
        return value in self.values

    def describe(self) -> str:
        return f"must be one of {', '.join(self.values)}"


@dataclasses.dataclass(frozen=True)
class Any_:
    """Any value of the field's type: a path, a name or a switch, checked where it is used."""

    why: str = ""

    def contains(self, value: Any) -> bool:
        return True

    def describe(self) -> str:
        return "any value"


def at_least(low: float, why: str = "") -> Interval:
    return Interval(low, why=why)


PATH = Any_("a path, checked when it is read")
NAME = Any_("a name handed to the loader, which refuses one it cannot find")
SWITCH = Any_("True or False")
STEPS_OR_OFF = "0 = only at the final step"

RANGES: dict[str, Interval | Choice | Any_] = {
    # data
    "data.dataset": Choice(DATASETS, "each has a loader in data/corpora.py"),
    "data.source_lang": NAME,
    "data.target_lang": NAME,
    "data.data_dir": PATH,
    "data.path": PATH,
    "data.valid_size": at_least(1, "held-out pairs: an empty split has no BLEU"),
    "data.test_size": at_least(1, "held-out pairs: an empty split has no BLEU"),
    "data.train_source": PATH,
    "data.train_target": PATH,
    "data.valid_source": PATH,
    "data.valid_target": PATH,
    "data.test_source": PATH,
    "data.test_target": PATH,
    "data.hf_name": NAME,
    "data.hf_config": NAME,
    "data.hf_revision": NAME,
    "data.hf_data_files": PATH,
    "data.hf_cache_dir": PATH,
    "data.cache_dir": PATH,
    "data.max_train_sentences": at_least(0, "0 = all"),
    "data.distilled_targets": PATH,
    "data.distilled_mix": Choice(("replace", "add"), "data/corpora.py with_distilled"),
    "data.text_protocol": Choice(TEXT_PROTOCOLS, "data/protocol.py"),
    "data.vocab_size": at_least(5, "SentencePiece's special pieces and one more"),
    "data.joint_vocab": SWITCH,
    "data.spm_model_type": Choice(("unigram", "bpe")),
    "data.character_coverage": Interval(0.98, 1.0, why="SentencePiece's own range"),
    "data.spm_normalization": Choice(NORMALIZATIONS),
    "data.spm_max_sentences": at_least(1, "the tokenizer's training sample"),
    "data.max_length": at_least(2, "a token and the end-of-sentence mark"),
    "data.long_pairs": Choice(("drop", "truncate")),
    "data.bucket_step": at_least(1),
    "data.spm_sampling_alpha": at_least(0, "0 = off; below 1 for BPE (validation.py)"),
    # Read only when a unigram model samples: then 2 to 1024 (configs/validation.py).
    "data.spm_nbest_size": Any_("2 to 1024 when a unigram model samples, else unread"),
    "data.pack_length": at_least(0, "0 = padded buckets; else the least packed row "
                                    "length (a row grows to hold the longest pair)"),
    # model (configs/model.py checks them again, and how they fit together)
    "model.d_model": at_least(1),
    "model.num_heads": at_least(1),
    "model.num_encoder_layers": at_least(1),
    "model.num_decoder_layers": at_least(1),
    "model.d_ff": at_least(1),
    "model.dropout": Interval(0, 1, high_open=True, why="a probability; 1 drops everything"),
    "model.attention_dropout": Interval(0, 1, high_open=True,
                                        why="a probability; 1 drops everything"),
    "model.activation": Choice(ACTIVATIONS),
    "model.pre_ln": SWITCH,
    "model.kernel_init": Choice(KERNEL_INITS),
    "model.positions": Choice(POSITIONS),
    "model.max_positions": at_least(1),
    "model.share_embeddings": SWITCH,
    "model.dtype": Choice(DTYPES),
    "model.param_dtype": Choice(DTYPES),
    "model.attention_impl": Choice(ATTENTION_IMPLS),
    "model.embedding_grad": Choice(EMBEDDING_GRADS),
    # train
    "train.num_steps": at_least(1),
    "train.batch_tokens": at_least(1),
    "train.learning_rate": Interval(0, low_open=True, why="0 trains nothing, a negative "
                                                          "rate climbs the loss"),
    "train.warmup_steps": at_least(0),
    "train.schedule": Choice(SCHEDULES),
    "train.weight_decay": at_least(0),
    "train.grad_clip": at_least(0, "0 = off"),
    "train.adam_b1": Interval(0, 1, high_open=True, why="Adam's decay rate"),
    "train.adam_b2": Interval(0, 1, high_open=True, why="Adam's decay rate"),
    "train.adam_eps": Interval(0, 1, low_open=True, why="Adam's denominator floor"),
    "train.flat_optimizer": SWITCH,
    "train.seed": Interval(0, 2**32 - 1, why="a JAX key keeps 32 bits (seed 2**32 would "
                                             "train seed 0 again); NumPy refuses negative seeds"),
    "train.label_smoothing": Interval(0, 1, high_open=True,
                                      why="1 would spread every target uniformly"),
    "train.grad_accum_steps": at_least(1, "1 = an update after every micro-batch"),
    "train.rdrop_alpha": at_least(0, "0 = off"),
    "train.log_every_steps": at_least(0, STEPS_OR_OFF),
    "train.patience": at_least(0, "0 = off"),
    "train.patience_metric": Choice(PATIENCE_METRICS),
    "train.max_minutes": at_least(0, "0 = no time budget; a negative one is spent before "
                                     "the first step"),
    "train.cpu_devices": at_least(0, "0 = JAX's single CPU device"),
    # eval (validation during training)
    "eval.every_steps": at_least(0, STEPS_OR_OFF),
    "eval.beam_size": at_least(1, "1 = greedy"),
    "eval.length_penalty": at_least(0, "GNMT's alpha; 0 = none"),
    "eval.batch_size": at_least(1),
    "eval.max_sentences": at_least(0, "0 = all"),
    "eval.decode": SWITCH,
    "eval.precompile": SWITCH,
    "eval.detokenize": SWITCH,
    # checkpoint
    "checkpoint.every_steps": at_least(1, "a run must be resumable before its end"),
    "checkpoint.keep": at_least(1, "the newest checkpoint is what a resume needs"),
    "checkpoint.last_every_steps": at_least(0, "0 = the last saves come every_steps apart"),
    # attention_maps
    "attention_maps.enabled": SWITCH,
    "attention_maps.num_examples": at_least(0),
    "attention_maps.contributions": SWITCH,
    "attention_maps.previews": SWITCH,
}


def _lookup(config: ml_collections.ConfigDict, key: str) -> tuple[bool, Any]:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def check_ranges(config: ml_collections.ConfigDict) -> None:
    """Raises UserError for the first key of `RANGES` whose value is outside its range
    (module docstring). A key the config lacks is skipped (a config.json written before
    the key existed takes its default, which is in range)."""
    for key, allowed in RANGES.items():
        present, value = _lookup(config, key)
        if present and not allowed.contains(value):
            why = f" ({allowed.why})" if allowed.why else ""
            raise UserError(f"{key} {allowed.describe()}, got {value!r}{why}")
