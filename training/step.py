"""Optimizer, loss and the jit-compiled train / eval steps.

The train state is a plain pytree dict so it flows through `jax.jit` (with donation),
orbax and sharding without wrappers:

    {"step": int32 [], "params": nested dict of arrays, "opt_state": optax state,
     "nonfinite_step": int32 [] (-1 while every loss and gradient so far was finite)}

The parameters are plain nested dicts (`nnx.State.to_pure_dict`), not an nnx.State of
Variables: JAX flattens dicts in C++ but an nnx.State node by node in Python, on every
call of the step, which can cost the host more than the device's step (bench/README.md).

    graphdef, state = create_train_state(cfg, src_vocab_size, tgt_vocab_size, mesh)
    train_step = make_train_step(graphdef, cfg.train)
    state, metrics = train_step(state, batch)

Dropout keys are derived from (seed, step), so a resumed run draws the same keys
as an uninterrupted one without storing any RNG state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh

from common.errors import UserError
from configs.model import ModelConfig
from data.tokenizer import PAD_ID
from models.transformer import Transformer
from training.accumulation import accumulate_gradients
from training.distributed import replicate
from training.plugins import Plugin, active_plugins, param_groups
from training.schedules import learning_rate_schedule

PACKING_KEYS = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")


def build_model(cfg, src_vocab_size: int, tgt_vocab_size: int,
                plugins: Sequence[Plugin] = ()) -> Transformer:
    """The model of the experiment config, initialised from `train.seed`: a `Transformer`,
    or the one a plug-in builds (training/plugins.py; at most one may)."""
    config = ModelConfig.from_config(cfg.model, src_vocab_size=src_vocab_size,
                                     tgt_vocab_size=tgt_vocab_size)
    rngs = nnx.Rngs(cfg.train.seed)
    models = [m for m in (p.build_model(config, rngs) for p in plugins) if m is not None]
    if len(models) > 1:
        raise UserError("two plug-ins each build the model; switch one off")
    return models[0] if models else Transformer(config, rngs=rngs)


def create_train_state(cfg, src_vocab_size: int, tgt_vocab_size: int,
                       mesh: Mesh | None = None,
                       plugins: Sequence[Plugin] | None = None) -> tuple[nnx.GraphDef, dict]:
    """The model's graph and a fresh train state (module docstring), replicated over
    `mesh` when one is given. The one place a run's model and optimizer are set up.
    plugins: those `cfg` switches on (`active_plugins(cfg)`, the default)."""
    plugins = active_plugins(cfg) if plugins is None else plugins
    model = build_model(cfg, src_vocab_size, tgt_vocab_size, plugins)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    state = {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt_state": build_optimizer(cfg.train, param_groups(plugins)).init(params),
        "nonfinite_step": jnp.full((), -1, jnp.int32),
    }
    return nnx.graphdef(model), (state if mesh is None else replicate(state, mesh))


def clip_by_group_norm(max_norm: float,
                       groups: Sequence[Sequence[str]] = ()) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` on each group of the gradients apart: `groups` lists
    top-level parameter names (a plug-in's `param_groups`), every other parameter forms
    the first group. A plug-in trained on stop-gradient inputs then never shrinks the
    translation model's update, nor it the plug-in's (one global norm would let the
    plug-in's loss scale translation's step). Without groups it is
    `optax.clip_by_global_norm` itself. The updates keep their container (a dict, or an
    nnx.State)."""
    if not groups:
        return optax.clip_by_global_norm(max_norm)
    index = {name: g for g, names in enumerate(groups, start=1) for name in names}

    def update(updates, state, params=None):
        def group(path) -> int:  # by the top-level name (a dict key or a State's)
            name = getattr(path[0], "key", getattr(path[0], "name", None)) if path else None
            return index.get(name, 0)

        leaves = jax.tree_util.tree_leaves_with_path(updates)
        norms = [optax.tree.norm([u for path, u in leaves if group(path) == g])
                 for g in range(len(groups) + 1)]

        def clip(path, u):  # optax.clip_by_global_norm's formula, per group
            g = norms[group(path)]
            return jax.lax.select(g < max_norm, u, (u / g.astype(u.dtype)) * max_norm)

        return jax.tree_util.tree_map_with_path(clip, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def flat_adamw(learning_rate, *, b1: float, b2: float, eps: float, weight_decay: float,
               mask: Callable[[Any], Any]) -> optax.GradientTransformation:
    """`optax.adamw` with the updates and parameters raveled into one vector each
    (`train.flat_optimizer`): the same update, element by element, but Adam's two moments
    are one vector each ([P], P the parameters' total size), not one array per parameter
    array; the updates come back in the parameters' structure. The train state's array
    count (523 for the tiny model, 179 flat) is what each step's dispatch and each save
    pay for on the host (bench/README.md). Weight decay applies to the parameter arrays
    where `mask(params)` is True, as adamw's `mask`: the decayed term is raveled from
    those arrays, zeros in place of the others."""
    inner = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)

    def init(params):
        return inner.init(ravel_pytree(params)[0])

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("flat_adamw's update needs the parameters (weight decay)")
        flat, unravel = ravel_pytree(updates)
        decayed = jax.tree.map(lambda p, m: p if m else jnp.zeros_like(p), params, mask(params))
        flat, state = inner.update(flat, state, ravel_pytree(decayed)[0])
        return unravel(flat), state

    return optax.GradientTransformation(init, update)


def build_optimizer(cfg_train, groups: Sequence[Sequence[str]] = ()) -> optax.GradientTransformationExtraArgs:
    """AdamW with gradient clipping (each of `groups` apart, `clip_by_group_norm`); weight
    decay skips biases and layer-norm parameters; with `train.flat_optimizer`, AdamW is
    `flat_adamw`. With `train.grad_accum_steps` k > 1 it updates on every k-th call, from
    the token-weighted mean gradient of the k micro-batches (training/accumulation.py;
    `update(..., tokens=n)`), at the rate of the update's first micro-batch's step."""
    def decay_mask(params):
        return jax.tree.map(lambda x: x.ndim > 1, params)

    every_k = cfg_train.get("grad_accum_steps", 1)
    schedule = learning_rate_schedule(cfg_train)
    adamw = flat_adamw if cfg_train.get("flat_optimizer", False) else optax.adamw
    return accumulate_gradients(optax.chain(
        clip_by_group_norm(cfg_train.grad_clip, groups) if cfg_train.grad_clip > 0
        else optax.identity(),
        adamw(schedule if every_k == 1 else lambda update: schedule(update * every_k),
              b1=cfg_train.adam_b1, b2=cfg_train.adam_b2,
              eps=cfg_train.get("adam_eps", 1e-9), weight_decay=cfg_train.weight_decay, mask=decay_mask),
    ), every_k)


def token_losses(logits: jnp.ndarray, targets: jnp.ndarray, label_smoothing: float):
    """Label-smoothed cross-entropy per token.

    logits: float32 [B, T, V]; targets: int32 [B, T]. Smoothing puts `label_smoothing`
    mass uniformly over the vocabulary (as in Szegedy et al. 2016 / fairseq). Written
    with logsumexp so the [B, T, V] log-probabilities are never materialised: the
    vocabulary projection and its softmax dominate a small model's step on CPU.
    Returns (smoothed loss [B, T], negative log-likelihood [B, T]).
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    uniform = log_z - jnp.mean(logits, axis=-1)
    return (1.0 - label_smoothing) * nll + label_smoothing * uniform, nll


def symmetric_kl_sum(logits_p: jnp.ndarray, logits_q: jnp.ndarray,
                     weights: jnp.ndarray) -> jnp.ndarray:
    """R-Drop's regulariser: sum over weighted tokens of (KL(p||q) + KL(q||p)) / 2.

    logits_p, logits_q: [B, T, V], two dropout passes over the same batch; weights: float32
    [B, T] (1 for a real target token, 0 for pad). Returns a float32 scalar. Written as
    sum((p - q) * (logits_p - logits_q)) / 2, which equals the two KLs' mean (the log
    normalisers cancel since p and q both sum to 1): no log-softmax over the vocabulary.
    """
    x, y = logits_p.astype(jnp.float32), logits_q.astype(jnp.float32)
    per_token = 0.5 * jnp.sum((jax.nn.softmax(x) - jax.nn.softmax(y)) * (x - y), axis=-1)
    return jnp.sum(per_token * weights)


def batch_loss(model: Transformer, batch: dict, label_smoothing: float, dropout_rng=None,
               head_mask: dict | None = None, rdrop_alpha: float = 0.0,
               plugins: Sequence[Plugin] = (), step: jax.Array | int = 0):
    """Mean loss over non-pad target tokens.

    batch: {"src": [B, S], "tgt_in": [B, T], "tgt_out": [B, T]} int32, plus the segments and
    positions of data/packing.py when the rows are packed (and a plug-in's fields);
    head_mask: heads to keep or remove, {kind: [L, H] or [L, B, H]} (models/transformer.py).
    Returns (mean smoothed loss, {"loss_sum", "nll_sum", "tokens"} float32 scalars).

    R-Drop (Liang et al. 2021), `rdrop_alpha` > 0: the batch runs twice in one forward pass
    ([2B, ...], each copy with its own dropout masks); the loss is the cross-entropy of both
    copies plus alpha times `symmetric_kl_sum` of their outputs, divided by the 2N target
    tokens, as in the authors' fairseq criterion, so their alpha values carry over. The sums
    then count both copies and add "rdrop_kl_sum". About twice a step's compute.

    Each of `plugins` (training/plugins.py) adds its `aux_losses` of the batch at `step`
    (the 0-based train step) to the summed loss and its sums to the returned ones;
    "loss_sum" and "nll_sum" stay the translation's. Not with a head mask (which
    measures translation alone).
    """
    if rdrop_alpha:
        batch = {k: jnp.concatenate([v, v]) for k, v in batch.items()}
    packing = {k: batch[k] for k in PACKING_KEYS if k in batch}
    features = model.features(batch["src"], batch["tgt_in"], dropout_rng=dropout_rng,
                              head_mask=head_mask, **packing)
    logits = model.target_embed.logits(features.states)
    smoothed, nll = token_losses(logits, batch["tgt_out"], label_smoothing)
    weights = (batch["tgt_out"] != PAD_ID).astype(jnp.float32)
    tokens = jnp.sum(weights)
    sums = {"loss_sum": jnp.sum(smoothed * weights), "nll_sum": jnp.sum(nll * weights),
            "tokens": tokens}
    total = sums["loss_sum"]
    if rdrop_alpha:
        half = logits.shape[0] // 2
        sums["rdrop_kl_sum"] = symmetric_kl_sum(logits[:half], logits[half:], weights[:half])
        total = total + rdrop_alpha * sums["rdrop_kl_sum"]
    for plugin in plugins if head_mask is None else ():
        loss, extra = plugin.aux_losses(model, batch, features, step)
        sums.update(extra)
        total = total + loss
    return total / jnp.maximum(tokens, 1.0), sums


def make_train_step(graphdef: nnx.GraphDef, cfg_train,
                    optimizer: optax.GradientTransformation | None = None,
                    plugins: Sequence[Plugin] = (), *, jit: bool = True):
    """The jit-compiled train step `(state, batch[, lr_scale]) -> (state, metrics)`; `state`
    is donated. `lr_scale`, a float32 scalar, multiplies the update (the learning rate and
    weight decay together): `budget_decay` of a "cosine_budget" run; None = 1, no multiply.
    `jit=False` gives the step function itself, whose fourth argument `base_key` (a typed
    PRNG key, default `jax.random.key(cfg_train.seed)`) seeds the dropout keys:
    training/together.py vmaps it over seeds, each with its own key.

    The optimizer is `build_optimizer(cfg_train, param_groups(plugins))`, the one
    `create_train_state` initialised (bench/step_profile.py passes another to compare state
    layouts); `plugins` (training/plugins.py) add their losses (`batch_loss`).

    A step whose loss or gradient is not finite leaves the parameters untouched and
    records its number in `state["nonfinite_step"]`; the host checks it when it syncs
    anyway (logging, checkpointing), so there is no host round-trip per step.
    """
    base_key = jax.random.key(cfg_train.seed)
    optimizer = optax.with_extra_args_support(
        optimizer or build_optimizer(cfg_train, param_groups(plugins)))

    def step_fn(state: dict, batch: dict, lr_scale: jax.Array | None = None,
                base_key: jax.Array = base_key):
        dropout_rng = jax.random.fold_in(base_key, state["step"])

        def loss_fn(params):
            model = nnx.merge(graphdef, params)
            return batch_loss(model, batch, cfg_train.label_smoothing, dropout_rng,
                              rdrop_alpha=cfg_train.rdrop_alpha, plugins=plugins,
                              step=state["step"])

        (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        grad_norm = optax.global_norm(grads)
        updates, new_opt_state = optimizer.update(grads, state["opt_state"], state["params"],
                                                  tokens=sums["tokens"])  # accumulation's weight
        if lr_scale is not None:  # "cosine_budget": the host's factor on the learning rate
            updates = jax.tree.map(lambda u: u * lr_scale.astype(u.dtype), updates)
        new_params = optax.apply_updates(state["params"], updates)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        first_bad = jnp.where((state["nonfinite_step"] < 0) & ~finite, state["step"], state["nonfinite_step"])
        new_state = {
            "step": state["step"] + 1,
            "params": keep(new_params, state["params"]),
            "opt_state": keep(new_opt_state, state["opt_state"]),
            "nonfinite_step": first_bad,
        }
        return new_state, {**sums, "grad_norm": grad_norm}

    return jax.jit(step_fn, donate_argnums=0) if jit else step_fn


def make_eval_step(graphdef: nnx.GraphDef, label_smoothing: float):
    """Jitted `(params, batch) -> {"loss_sum", "nll_sum", "tokens"}` without dropout."""
    def eval_fn(params, batch):
        _, sums = batch_loss(nnx.merge(graphdef, params), batch, label_smoothing)
        # Translation only, no plug-in's losses: a plug-in's modules are not run.
        return {k: sums[k] for k in ("loss_sum", "nll_sum", "tokens")}

    return jax.jit(eval_fn)


# --- data parallelism -------------------------------------------------------------


