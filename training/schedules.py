"""Learning-rate schedules: optax's, after a linear warmup, and the time-budgeted cosine
whose factor the host computes from the clock."""

from __future__ import annotations

import math

import jax.numpy as jnp
import optax

from configs.base import SCHEDULES

COSINE_END = 0.01  # both cosine schedules end at this fraction of the peak


def learning_rate_schedule(cfg_train) -> optax.Schedule:
    """Linear warmup to `learning_rate`, then inverse-sqrt, cosine or constant decay.

    "cosine_budget" is constant here: its cosine runs over the time budget, which only
    the host knows, so the loop multiplies each step's update by `budget_decay(...)`.
    """
    peak, warmup = cfg_train.learning_rate, max(1, cfg_train.warmup_steps)
    if cfg_train.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, peak, warmup, max(cfg_train.num_steps, warmup + 1), end_value=peak * COSINE_END
        )
    warmup_fn = optax.linear_schedule(0.0, peak, warmup)
    if cfg_train.schedule == "inverse_sqrt":
        # join_schedules evaluates both branches: at count = step - warmup < 0 (still in
        # warmup) the decay must not divide by zero, e.g. for step 0 as a Python int.
        decay_fn = lambda count: peak * jnp.sqrt(warmup / jnp.maximum(count + warmup, warmup))  # noqa: E731
    elif cfg_train.schedule in ("constant", "cosine_budget"):
        decay_fn = optax.constant_schedule(peak)
    else:
        raise ValueError(f"train.schedule must be one of {', '.join(SCHEDULES)}, "
                         f"not {cfg_train.schedule!r}")
    return optax.join_schedules([warmup_fn, decay_fn], [warmup])


def budget_decay(train_seconds: float, decay_start_seconds: float, budget_seconds: float) -> float:
    """The factor on the learning rate of `train.schedule = "cosine_budget"` after
    `train_seconds` of training: 1 until warmup ended (at `decay_start_seconds`), then a
    cosine to COSINE_END reached when the budget (`budget_seconds`, evaluations
    included) runs out; a negative `decay_start_seconds` means warmup is still running.

    The budgeted-training schedule (Li et al. 2020: decay to ~0 by the end of the
    budget) for a budget in minutes, whose last step depends on the machine's speed. It
    follows the clock, so two such runs match only as closely as their timings do; a
    resume continues from the saved train_seconds.
    """
    if decay_start_seconds < 0:  # warmup still running
        return 1.0
    span = budget_seconds - decay_start_seconds
    done = 1.0 if span <= 0 else min(max((train_seconds - decay_start_seconds) / span, 0.0), 1.0)
    return COSINE_END + (1 - COSINE_END) * 0.5 * (1 + math.cos(math.pi * done))
