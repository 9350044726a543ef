"""Gradient accumulation (`train.grad_accum_steps`): k micro-batches, one update.

`accumulate_gradients(inner, k)` wraps the optimizer: each micro-batch's gradient is added
to a running sum weighted by its target-token count, and every k-th call hands the
token-weighted mean to `inner` (clipping, AdamW) and returns its update; the other calls
return zeros. The update is then exactly that of one step on the k micro-batches
concatenated, whose loss is the mean over all their tokens (fairseq's --update-freq does
the same: summed losses over the summed sample size). `optax.MultiSteps` would average the
k per-batch means instead, which weighs a batch of short sentences (fewer real tokens, more
padding) as much as a full one.

The accumulator lives in the optimizer state, so a checkpoint taken between two updates
holds the partial sum and a resume continues it exactly. The inner optimizer counts
updates; the learning-rate schedule counts train steps (micro-batches), so the update made
of micro-batches k*j .. k*j + k - 1 takes the rate of step k*j (build_optimizer): a
schedule written in micro-batches gives k accumulated batches of B tokens the rates that
one batch of k*B tokens gets with every step count divided by k.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class AccumulationState(NamedTuple):
    """The accumulator between two updates (all arrays, so orbax saves and restores it)."""

    micro_step: jax.Array  # int32 []: micro-batches summed since the last update
    grad_sum: optax.Updates  # float32, like the parameters: sum of tokens_i * gradient_i
    token_sum: jax.Array  # float32 []: sum of tokens_i
    inner: optax.OptState


def accumulate_gradients(inner: optax.GradientTransformation,
                         every_k: int) -> optax.GradientTransformationExtraArgs:
    """`inner` applied to the token-weighted mean gradient of every `every_k` micro-batches.

    `update(grads, state, params, tokens=n)`: `grads` is the gradient of the micro-batch's
    mean loss over its `n` target tokens; without `tokens` every micro-batch weighs 1.
    Returns zero updates but on every `every_k`-th call. `every_k=1` returns `inner`.
    """
    if every_k < 1:
        raise ValueError(f"every_k must be at least 1, got {every_k}")
    if every_k == 1:
        return optax.with_extra_args_support(inner)

    def init(params) -> AccumulationState:
        return AccumulationState(
            micro_step=jnp.zeros((), jnp.int32),
            grad_sum=jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
            token_sum=jnp.zeros((), jnp.float32), inner=inner.init(params))

    def update(updates, state: AccumulationState, params=None, *, tokens=None, **extra_args):
        del extra_args  # the inner chain takes none
        weight = jnp.asarray(1.0 if tokens is None else tokens, jnp.float32)
        grad_sum = jax.tree.map(lambda s, g: s + weight * g.astype(jnp.float32),
                                state.grad_sum, updates)
        token_sum = state.token_sum + weight

        def apply(_):
            mean = jax.tree.map(lambda s, g: (s / jnp.maximum(token_sum, 1e-9)).astype(g.dtype),
                                grad_sum, updates)
            new_updates, inner_state = inner.update(mean, state.inner, params)
            return new_updates, AccumulationState(
                jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, grad_sum),
                jnp.zeros((), jnp.float32), inner_state)

        def hold(_):
            return (jax.tree.map(jnp.zeros_like, updates),
                    AccumulationState(state.micro_step + 1, grad_sum, token_sum, state.inner))

        # Only the last micro-batch of an update runs the inner optimizer.
        return jax.lax.cond(state.micro_step == every_k - 1, apply, hold, None)

    return optax.GradientTransformationExtraArgs(init, update)
