"""Checkpoints through orbax's CheckpointManager.

Each step directory holds two items:
  * "state": the train state pytree (`training/step.py`), saved with StandardSave;
  * "meta": JSON with the host-side loop state: data position (epoch, batch_index),
    best validation figures so far and the best step, patience left, wall-clock time trained.

Orbax writes each step into a temporary directory (`<step>.orbax-checkpoint-tmp`) and
renames it when complete, so a run killed mid-save never leaves a checkpoint that
`latest_step()` would pick up; a writable manager deletes such leftovers when created.
Preservation: the last `keep` steps plus the best validated step: the highest BLEU, or
the lowest loss for a run whose train.patience_metric is "loss" (`rank`).

Integrity: "meta" also holds `state_crc32`, a CRC-32 of every array of the saved state.
TensorStore reads a damaged data file back without complaint when only bytes changed
(not the length), so `restore` recomputes the CRC and refuses a checkpoint that does
not match, as it refuses one that orbax cannot read. Nothing is ever deleted or
repaired here: the error names the step directory and the step to fall back to.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import warnings
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from common.errors import UserError

CHECKSUM_KEY = "state_crc32"
# In the meta of an exported checkpoint (`export`): the dtype its parameters are stored in.
EXPORT_KEY = "exported_params_dtype"


def rank(metrics: dict) -> float:
    """The ranking of a validated checkpoint by the figure saved with it (higher is
    better): its validation BLEU, or minus its validation loss (train.patience_metric
    "loss"). A run saves one of the two throughout: the key is locked on resume."""
    return metrics["bleu"] if "bleu" in metrics else -metrics["loss"]


def make_manager(directory: Path, keep: int, *, read_only: bool = False) -> ocp.CheckpointManager:
    """A CheckpointManager over `<workdir>/checkpoints` (created unless read_only)."""
    policy = cm.AnyPreservationPolicy([
        cm.LatestN(n=max(1, keep)),
        cm.BestN(get_metric_fn=rank, reverse=False, n=1, keep_checkpoints_without_metrics=False),
    ])
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policy, best_fn=rank, best_mode="max",
        create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    manager = ocp.CheckpointManager(Path(directory).absolute(), options=options,
                                    item_names=("state", "meta"))
    # Orbax deletes the leftovers on a background thread and waits for it only before its
    # first save: a run that restores and stops without saving (nothing left to train, an
    # export) could exit first and leave them. Wait here, so a created manager is clean.
    getattr(manager, "_maybe_await_cleanup_tmp_directory", lambda: None)()
    return manager


def state_checksum(state) -> int:
    """CRC-32 over the dtype, shape and bytes of every array of `state`, in tree order.

    Arrays are replicated (the train state is), so the first local copy is read: the
    same value on every process.
    """
    crc = 0
    for leaf in jax.tree.leaves(state):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            leaf = leaf.addressable_data(0)
        array = np.ascontiguousarray(np.asarray(leaf))
        crc = zlib.crc32(f"{array.dtype.str}{array.shape};".encode(), crc)
        crc = zlib.crc32(array.reshape(-1).view(np.uint8), crc)
    return crc


# The manager whose asynchronous save may still be running in this process, and the
# lock that makes saves of several managers (train.py --seeds N --together: one per seed,
# each in its own thread) take turns: orbax's asynchronous save waits on signals keyed
# by a process-wide operation id, so two managers saving at once release each other's
# writes early (seen: a JSON item written before its folder existed).
_LAST_SAVING: list[ocp.CheckpointManager] = []
_SAVE_LOCK = threading.Lock()


def save(manager: ocp.CheckpointManager, step: int, state: dict, meta: dict,
         metrics: dict[str, float] | None = None, *, host_copy: bool = True) -> None:
    """Save asynchronously; `metrics` ({"bleu": ...} or {"loss": ...}, the validation at
    this step by train.patience_metric) ranks the best checkpoint (`rank`).

    The CRC of `state` is computed (synchronously) and stored in meta before the save.
    Another manager's save still running in this process is waited for first.
    host_copy: the state is read to the host first, in one batched `jax.device_get`, and
    that copy is checksummed and saved (it restores into device arrays alike), rather than
    orbax reading each of its ~500 arrays to the host itself and the checksum once more:
    the save then holds the loop about half as long (bench/save_stall.py). A state spread
    over processes is saved from the device whatever this says.
    """
    if host_copy and all(getattr(x, "is_fully_addressable", True)
                         for x in jax.tree.leaves(state)):
        state = jax.device_get(state)
    meta = {**meta, CHECKSUM_KEY: state_checksum(state)}
    with _SAVE_LOCK:
        for other in _LAST_SAVING:
            if other is not manager:
                other.wait_until_finished()
        manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                    meta=ocp.args.JsonSave(meta)),
            metrics=None if metrics is None else {k: float(v) for k, v in metrics.items()},
            force=True,
        )
        _LAST_SAVING[:] = [manager]


def _damaged(manager: ocp.CheckpointManager, step: int, problem: str) -> UserError:
    """UserError naming the step directory and the older step a user could fall back to."""
    older = [s for s in manager.all_steps() if s < step]
    fallback = (f"move it away to use step {max(older)} instead" if older
                else "move it away to start over")
    return UserError(f"checkpoint step {step} ({Path(manager.directory) / str(step)}) {problem}; "
                     f"{fallback} (nothing was deleted)")


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    text = text.splitlines()[0] if text else type(err).__name__
    return text.split(" See full TensorStore details")[0][:200]


def _ignore_abandoned_reads() -> None:
    """When a restore fails, orbax closes its event loop while other TensorStore reads are
    still running; their completion callbacks then raise "Event loop is closed", printed
    as dozens of tracebacks; under load, reads cut off the same way also surface as
    never-awaited coroutines and asyncio's "Task was destroyed" log lines. Only these
    harmless leftovers of the abandoned reads are dropped."""
    previous = sys.unraisablehook
    if getattr(previous, "_attnmt", False):
        return
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)

    def hook(unraisable):
        closed_loop = (isinstance(unraisable.exc_value, RuntimeError)
                       and str(unraisable.exc_value) == "Event loop is closed")
        if not (closed_loop or inspect.iscoroutine(unraisable.object)):
            previous(unraisable)

    hook._attnmt = True
    sys.unraisablehook = hook


def restore_meta(manager: ocp.CheckpointManager, step: int) -> dict:
    """The "meta" item of `step` alone (cheap: no arrays are read)."""
    _ignore_abandoned_reads()
    try:
        restored = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    except Exception as err:  # orbax raises many types for damaged files
        raise _damaged(manager, step, f"cannot be read ({_first_line(err)})") from err
    return dict(restored["meta"])


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: dict) -> tuple[dict, dict]:
    """Restore (state, meta) of `step` into the structure/shardings of `abstract_state`.

    Raises UserError naming the step directory if the checkpoint is truncated, corrupted
    (CRC mismatch) or does not fit `abstract_state`. An exported checkpoint (`export`)
    gives {"step", "params"} alone, cast to the dtypes of `abstract_state`. Checkpoints
    written before the train state held plain dicts (each parameter and Adam moment an
    nnx Variable, its array under "value") are read too.
    """
    _ignore_abandoned_reads()
    try:
        exported = restore_meta(manager, step).get(EXPORT_KEY)
    except UserError:  # damaged: the full restore below says how
        exported = None
    abstract_params = abstract_state["params"]
    if exported:  # `export`: the parameters alone, stored in another dtype
        abstract_state = {"step": abstract_state["step"], "params": jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, exported, sharding=a.sharding),
            abstract_state["params"])}
    try:
        restored = _restore_items(manager, step, abstract_state)
    except Exception as err:  # orbax raises many types for damaged files
        if "tree structures do not match" not in str(err):
            raise _damaged(manager, step, f"cannot be restored ({_first_line(err)})") from err
        try:
            restored = _restore_items(manager, step, _as_variables(abstract_state))
        except Exception:  # noqa: BLE001 - not the old layout either: report the first error
            raise _damaged(manager, step, f"cannot be restored ({_first_line(err)})") from err
        restored["state"] = jax.tree.map(lambda x: x["value"] if _is_variable(x) else x,
                                         restored["state"], is_leaf=_is_variable)
    state, meta = restored["state"], dict(restored["meta"])
    expected = meta.pop(CHECKSUM_KEY, None)
    if expected is not None and state_checksum(state) != expected:
        raise _damaged(manager, step, "is corrupted: its arrays do not match the CRC-32 saved "
                                      "with them")
    if exported:  # back to the dtypes the model computes in
        state = {**state, "params": jax.tree.map(lambda x, a: x.astype(a.dtype), state["params"],
                                                 abstract_params)}
    return state, meta


def _restore_items(manager: ocp.CheckpointManager, step: int, abstract_state) -> dict:
    return dict(manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())))


def _as_variables(abstract_state: dict) -> dict:
    """The old layout of `abstract_state`: each array inside a nested dict (parameters,
    Adam moments) wrapped as {"value": array}, as an nnx Variable was stored."""
    def wrap(path, leaf):
        nested = sum(isinstance(key, jax.tree_util.DictKey) for key in path) >= 2
        return {"value": leaf} if nested else leaf

    return jax.tree_util.tree_map_with_path(wrap, abstract_state)


def _is_variable(x) -> bool:
    return isinstance(x, dict) and set(x) == {"value"}


def abstract_of(tree):
    """ShapeDtypeStruct tree (with shardings) to restore into."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree
    )


def choose_step(manager: ocp.CheckpointManager, which: str) -> int:
    """Resolve `best` | `last` | a step number to a saved step (UserError if impossible).

    `best` is the best validated step (`rank`): orbax's metrics when the checkpoints
    carry them, else the `best_step` the training loop stores in the newest checkpoint's
    meta item, else (that step no longer saved) the newest step.
    """
    steps = manager.all_steps()
    if not steps:
        raise UserError(f"no checkpoint in {manager.directory} (train first)")
    if which == "last":
        return max(steps)
    if which == "best":
        if any(manager.metrics(s) for s in steps):
            best = manager.best_step()
        else:
            best = restore_meta(manager, max(steps)).get("best_step")
        return best if isinstance(best, int) and best in steps else max(steps)
    if not which.isdigit() or int(which) not in steps:
        raise UserError(f"checkpoint {which!r} not found; saved steps: {sorted(steps)}")
    return int(which)


def average_params(param_trees: list) -> object:
    """Element-wise mean of parameter pytrees of identical structure (checkpoint averaging)."""
    if not param_trees:
        raise ValueError("nothing to average")
    total = jax.tree.map(lambda x: x.astype(jnp.float32), param_trees[0])
    for tree in param_trees[1:]:
        total = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), total, tree)
    n = float(len(param_trees))
    return jax.tree.map(lambda a, ref: (a / n).astype(ref.dtype), total, param_trees[0])


def export(directory: Path, step: int, params, meta: dict, dtype: str = "float16") -> None:
    """Writes `params` alone, cast to `dtype`, as checkpoint `step` in a new checkpoint
    folder `directory`: a model for inference (float16 halves a float32 model's bytes and
    drops the optimizer state, a sixth of a train checkpoint) that evaluate.py and the
    attention commands load as any checkpoint (`restore`); train.py does not resume it."""
    manager = make_manager(directory, keep=1)
    state = {"step": jnp.asarray(step, jnp.int32),
             "params": jax.tree.map(lambda x: jnp.asarray(x).astype(dtype), params)}
    save(manager, step, state, {**meta, EXPORT_KEY: dtype})
    manager.wait_until_finished()
    manager.close()
