"""The model's typed, frozen config: built once from the `model` group of an experiment
config and the tokenizer's vocabulary sizes, then handed to every layer.

    config = ModelConfig.from_config(cfg.model, src_vocab_size=8000, tgt_vocab_size=8000)
    model = Transformer(config, rngs=nnx.Rngs(0))

It is hashable (a frozen dataclass of plain values), so modules keep it as a static
attribute and jit can key compiled programs on it. `__post_init__` checks every value,
so a bad `--config.model.*` is refused with one line before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common.errors import UserError

ACTIVATIONS = ("relu", "gelu")
POSITIONS = ("sinusoidal", "learned")
EMBEDDING_GRADS = ("auto", "scatter", "one_hot")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "reference")
DTYPES = ("float32", "bfloat16", "float16")
KERNEL_INITS = ("lecun_normal", "xavier_uniform")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of the encoder-decoder Transformer (see configs/base.py)."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 256
    num_heads: int = 4
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1  # on embeddings, residual branches and the feed-forward hidden layer
    attention_dropout: float = 0.0  # on the attention weights
    activation: str = "relu"
    pre_ln: bool = True
    # Weight matrices' initialisation (models/layers.py): Flax's lecun_normal, or fairseq's
    # xavier_uniform (query/key/value at gain 1/sqrt(2)); embeddings are normal(d^-0.5) in both.
    kernel_init: str = "lecun_normal"
    positions: str = "sinusoidal"
    max_positions: int = 1024  # learned positions only
    share_embeddings: bool = True  # one table for source, target and output projection
    dtype: str = "float32"  # compute dtype; softmax and loss are always float32
    param_dtype: str = "float32"
    attention_impl: str = "auto"  # attention/core.py dot_product_attention
    # Gradient of the embedding tables: one-hot matmul or scatter-add; "auto" = one_hot on
    # GPU/TPU, scatter on CPU (models/layers.py embedding_lookup).
    embedding_grad: str = "auto"

    @classmethod
    def from_config(cls, model: Mapping[str, Any], *, src_vocab_size: int,
                    tgt_vocab_size: int) -> ModelConfig:
        """From the `model` config group (a ConfigDict or dict); unknown keys are refused.

        A key missing from `model` (a config.json written before the field existed)
        takes the field's default, which is what the code did before.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = dict(model.items())
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(f"unknown model config key(s): {', '.join(unknown)}")
        return cls(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, **values)

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff",
                     "num_encoder_layers", "num_decoder_layers", "max_positions"):
            if getattr(self, name) < 1:
                raise UserError(f"model.{name} must be at least 1, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise UserError(f"model.d_model={self.d_model} is not divisible by "
                            f"model.num_heads={self.num_heads}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        choices = {"activation": ACTIVATIONS, "positions": POSITIONS,
                   "embedding_grad": EMBEDDING_GRADS, "attention_impl": ATTENTION_IMPLS,
                   "dtype": DTYPES, "param_dtype": DTYPES, "kernel_init": KERNEL_INITS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise UserError(f"model.{name} must be one of {', '.join(allowed)}, "
                                f"got {getattr(self, name)!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise UserError("model.share_embeddings needs one joint vocabulary "
                            "(data.joint_vocab=True)")
