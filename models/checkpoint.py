"""Checkpoints through orbax's CheckpointManager.

Each step directory holds two items:
  * "state": the train state pytree (`models/training.py`), saved with StandardSave;
  * "meta": JSON with the host-side loop state: data position (epoch, batch_index),
    best validation BLEU so far and its step, patience left, wall-clock time trained.

Orbax writes each step into a temporary directory and renames it when complete, so
a run killed mid-save never leaves a checkpoint that `latest_step()` would pick up.
Preservation: the last `keep` steps plus the step with the best validation BLEU.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from configs.errors import UserError


def make_manager(directory: Path, keep: int, *, read_only: bool = False) -> ocp.CheckpointManager:
    """A CheckpointManager over `<workdir>/checkpoints` (created unless read_only)."""
    policy = cm.AnyPreservationPolicy([
        cm.LatestN(n=max(1, keep)),
        cm.BestN(get_metric_fn=lambda m: m["bleu"], reverse=False, n=1,
                 keep_checkpoints_without_metrics=False),
    ])
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policy, best_fn=lambda m: m["bleu"], best_mode="max",
        create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(Path(directory).absolute(), options=options,
                                 item_names=("state", "meta"))


def save(manager: ocp.CheckpointManager, step: int, state: dict, meta: dict,
         bleu: float | None = None) -> None:
    """Save asynchronously; `bleu` (validation BLEU at this step) ranks the best checkpoint."""
    manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        metrics=None if bleu is None else {"bleu": float(bleu)},
        force=True,
    )


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: dict) -> tuple[dict, dict]:
    """Restore (state, meta) of `step` into the structure/shardings of `abstract_state`.

    Raises UserError naming the step if the checkpoint is truncated or does not fit.
    """
    try:
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    except Exception as err:  # orbax raises many types for damaged files
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"cannot restore checkpoint step {step} in {manager.directory}: {first_line[:300]}"
        ) from err
    return restored["state"], dict(restored["meta"])


def abstract_of(tree):
    """ShapeDtypeStruct tree (with shardings) to restore into."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree
    )


def choose_step(manager: ocp.CheckpointManager, which: str) -> int:
    """Resolve `best` | `last` | a step number to a saved step (UserError if impossible)."""
    steps = manager.all_steps()
    if not steps:
        raise UserError(f"no checkpoint in {manager.directory} (train first)")
    if which == "last":
        return max(steps)
    if which == "best":
        best = manager.best_step() if _has_metrics(manager) else None
        return best if best is not None else max(steps)
    if not which.isdigit() or int(which) not in steps:
        raise UserError(f"checkpoint {which!r} not found; saved steps: {sorted(steps)}")
    return int(which)


def _has_metrics(manager: ocp.CheckpointManager) -> bool:
    return any(manager.metrics(s) for s in manager.all_steps())


def average_params(param_trees: list) -> object:
    """Element-wise mean of parameter pytrees of identical structure (checkpoint averaging)."""
    if not param_trees:
        raise ValueError("nothing to average")
    total = jax.tree.map(lambda x: x.astype(jnp.float32), param_trees[0])
    for tree in param_trees[1:]:
        total = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), total, tree)
    n = float(len(param_trees))
    return jax.tree.map(lambda a, ref: (a / n).astype(ref.dtype), total, param_trees[0])
