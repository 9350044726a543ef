"""Ensemble decoding: several models that share one tokenizer, searched as one.

`Ensemble` is an `nnx.Module` over its members with the three methods models/search.py
calls (`encode`, `init_decode_state`, `decode_step`), so greedy and beam search, the
jitted entry points of models/translate.py (`nnx.split` / `nnx.merge` of the wrapper) and
the attention-map recording work on it unchanged. Each member encodes the source and
keeps its own decode state (self-attention caches, projected memory); at every step the
ensemble's next-token distribution is the mean of the members' log-softmax,

    log p_ens(y | ...) = (1 / M) * sum_m log p_m(y | ...)      (not renormalized),

so the search's scores are sums of these averaged log-probabilities (as in Marian). The
attention maps are the first member's. The members may differ in architecture; only
their vocabularies must be one (evaluation/loading.py `check_ensemble` refuses others).
A single model is searched directly, never through this wrapper, so its path does no
extra work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from models.transformer import DecodeState


class EnsembleState(NamedTuple):
    """The decode state of an ensemble (a pytree): one `DecodeState` per member, B rows
    each. models/search.py sizes the map buffers from `members[0]` (the recorded member)
    and reorders every member's self-attention caches under beam search."""

    members: tuple[DecodeState, ...]


def mean_log_probs(logits: Sequence[jnp.ndarray]) -> jnp.ndarray:
    """The mean over members of the float32 log-softmax of their logits.

    logits: M arrays [..., V] (one per member, same shape). Returns float32 [..., V].
    """
    stacked = jnp.stack([jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits])
    return jnp.mean(stacked, axis=0)


class Ensemble(nnx.Module):
    """M >= 2 Transformers decoded together (module docstring).

    Args:
      models: the members; the first one's attention maps are recorded.
    """

    # models/search.py: `decode_step` already returns log-probabilities (the members'
    # mean), which a second log-softmax would renormalize.
    returns_log_probs = True

    def __init__(self, models: Sequence[nnx.Module]):
        if len(models) < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {len(models)}")
        self.members = nnx.List(list(models))

    def encode(self, src: jnp.ndarray, *, return_weights: bool = False):
        """Every member encodes `src`: int32 [B, S] (pad = 0).

        Returns (memories: one [B, S, D_m] per member, src_valid bool [B, S], the first
        member's encoder self-attention [L_enc, B, H, S, S] | None).
        """
        memories, valid, weights = [], None, None
        for i, model in enumerate(self.members):
            memory, valid, w = model.encode(src, return_weights=return_weights and i == 0)
            memories.append(memory)
            weights = w if i == 0 else weights
        return tuple(memories), valid, weights

    def init_decode_state(self, memories, src_valid, max_length: int) -> EnsembleState:
        """Each member's empty caches for `max_length` steps and its projected memory."""
        return EnsembleState(tuple(
            model.init_decode_state(memory, src_valid, max_length)
            for model, memory in zip(self.members, memories, strict=True)))

    def decode_step(self, tokens: jnp.ndarray, state: EnsembleState, *,
                    return_weights: bool = False):
        """Feed one token per row to every member (`Transformer.decode_step`).

        tokens: int32 [B]. Returns (mean log-probabilities float32 [B, V], new state, the
        first member's {"decoder_self": [L, B, H, T_max], "cross": [L, B, H, S]} | None).
        """
        logits, states, weights = [], [], None
        for i, (model, member) in enumerate(zip(self.members, state.members, strict=True)):
            out, member, w = model.decode_step(tokens, member,
                                               return_weights=return_weights and i == 0)
            logits.append(out)
            states.append(member)
            weights = w if i == 0 else weights
        return mean_log_probs(logits), EnsembleState(tuple(states)), weights
