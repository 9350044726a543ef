"""Data parallelism over every local device (jax.sharding) and several processes
(jax.distributed): the mesh, replicated state and sharded batches."""

from collections.abc import Iterable, Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from common.errors import UserError


def initialize_distributed() -> None:
    """Joins a multi-process run when one is launched, before any JAX computation.

    With JAX_COORDINATOR_ADDRESS set (host:port of process 0), JAX_NUM_PROCESSES and
    JAX_PROCESS_ID give this process's place (a manual launch: one command per host);
    without them JAX detects SLURM, Open MPI or a TPU pod itself. On CPU the processes
    exchange gradients over gloo. Without JAX_COORDINATOR_ADDRESS, nothing happens.
    """
    import os

    if "JAX_COORDINATOR_ADDRESS" not in os.environ or jax.distributed.is_initialized():
        return  # not launched multi-process, or joined already (train.py --seeds: seed 2..N)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only
    place = {}
    if "JAX_NUM_PROCESSES" in os.environ:
        place = {"num_processes": int(os.environ["JAX_NUM_PROCESSES"]),
                 "process_id": int(os.environ["JAX_PROCESS_ID"])}
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], **place)


def use_cpu_devices(count: int) -> None:
    """Split this host's CPU into `count` JAX devices (`train.cpu_devices`; 0 leaves JAX's
    one), so that data parallelism steps `count` slices of each batch at once.

    Why: one device's kernels do not keep every core evenly busy on a model this small;
    two devices with half a batch each step the CPU recipe faster on 2 cores
    (bench/README.md, "Two CPU devices", holds the figures).
    Accelerators are untouched: the count is the CPU backend's alone. It has to be set
    before JAX starts its backends; afterwards only the count already in effect is
    accepted (train.py --seeds trains its seeds in one process).
    """
    if count == 0:
        return
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as error:  # jax's "should be updated before backends are initialized"
        raise UserError(f"train.cpu_devices={count}: JAX already runs with "
                        f"{jax.local_device_count('cpu')} CPU device(s) in this process; "
                        "set it in a fresh process (train.py does, before JAX starts)") from error


def make_mesh() -> Mesh:
    """A 1-D mesh over every device of every process, axis "data"."""
    return Mesh(np.asarray(jax.devices()), ("data",))


def replicate(tree, mesh: Mesh):
    """Place a pytree on every device of the mesh (parameters, optimizer state)."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Split a host batch along its first axis over the "data" axis.

    batch: arrays [B, ...] with B a multiple of the global device count. Each process
    passes the same global batch and contributes its own slice, so this also works
    multi-host (after `jax.distributed.initialize()`).
    """
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    num_proc, proc = jax.process_count(), jax.process_index()

    def put(x: np.ndarray) -> jax.Array:
        local = np.array_split(x, num_proc)[proc] if num_proc > 1 else x
        return jax.make_array_from_process_local_data(sharding, local, x.shape)

    return {k: put(v) for k, v in batch.items() if isinstance(v, np.ndarray) and v.ndim >= 1}


def device_batches(batches: Iterable[tuple[int, int, dict]], mesh: Mesh) -> Iterator[tuple]:
    """(epoch, index, batch) -> (epoch, index, target tokens, batch on the mesh): run
    inside the input pipeline's prefetch thread (data/batching.py `prefetch`), so each
    batch's host-to-device copy is made while the device still runs the previous step
    instead of on the loop's critical path. The host batch's "num_tokens" comes apart."""
    for epoch, index, batch in batches:
        tokens = batch.pop("num_tokens")
        yield epoch, index, tokens, shard_batch(batch, mesh)
