"""Seeds stepped together: `train.py --seeds N --together` trains seeds 0..N-1 of one
config with one program per step, so that on an accelerator N seeds cost about one.

Each seed runs train.py's own `train` (every check, resume, hook, checkpoint and metric
of a run) in a thread of its own, into the same `<parent>/seed<k>/` workdir as
`--seeds N`; only its train step differs. The steps of all seeds meet in a `SeedGroup`,
which runs them as one jitted program (`_together`): the step function of
`make_train_step` vmapped over the seeds' train states, stacked on a leading seed axis,
each seed with its own dropout base key (`train.seed = k`). The stacked state stays on
the device from one step to the next (donated to each call), and a seed's loop holds a
`SeedState`, a view of its slice: the slice is cut out (one small program) only when a
hook reads the state (validation, a checkpoint, the finite check), so each seed's
checkpoint is what training it alone would save, while the per-step host work does not
grow with the seeds' states (8 seeds' unstacked states in and out cost 54 ms a call on
an H200, for a 17 ms step: bench/README.md).

Batches: each seed has its own batcher (seed k), so at one step the seeds' padded
batches may differ in shape. Seeds whose batches differ only in their number of rows
share one call: the shorter ones get all-pad rows, which carry no loss weight
(data/batching.py), and dropout masks are drawn by flat element index with rows leading
(attention/dropout.py), so the real rows keep their masks and each seed's update is the
one it makes alone (to float rounding). Seeds whose sequence lengths differ (or any
shape, with R-Drop, which stacks the batch twice) are groups of that step, one call of
the program each: every call steps all N seeds, those outside the group on an all-pad
batch of the group's shape, and keeps only the group's new states (`active`), so the
program compiles once per batch shape, as a seed alone does, whatever the seeds' mix
(a program per group of seeds stalled 8 seeds on padded buckets in compiling;
bench/README.md, "A lent H200 window"). With packed
batches (`data.pack_length`, data/packing.py) every seed's batch has the run's one
shape, so every step is one call.

Threads: seeds are set up one after another (tokenizer, data cache, restore), each
starting once the one before it has reached its first step; SIGINT / SIGTERM are
caught by the main thread and reach every seed, which saves and exits as a lone run
does. A seed that ends (finished, or an error) leaves the group and the others go on,
its slice kept in the stacked state and stepped no more; no seed is started after one
failed; the first error is raised once every seed ended.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from training.loop import StopRequest
from training.step import make_eval_step, make_train_step

# The main thread waits in slices of this many seconds: Python runs signal handlers in the
# main thread alone, and a signal the kernel hands to another thread does not wake a main
# thread asleep in an untimed wait, so SIGINT would reach the seeds only once one ended.
WAIT_SLICE_S = 0.25


class SharedStop:
    """The seeds' view of the main thread's StopRequest: the same signal for all; its
    handlers are put back by the main thread (a thread cannot set signal handlers)."""

    def __init__(self, stop: StopRequest):
        self._stop = stop

    @property
    def signum(self) -> int:
        return self._stop.signum

    @property
    def name(self) -> str:
        return self._stop.name

    def restore(self) -> None:
        pass


class SeedState:
    """One seed's train state inside the group's stacked state, as `version` (the group's
    count of programs run) left it: what a seed's `train` loop holds between steps.
    `materialize()` cuts the seed's slice out (once; training/hooks.py `Tick.state` calls
    it when a hook reads the state); the group takes the view back at the next step
    without restacking."""

    def __init__(self, group: SeedGroup, seed: int, version: int):
        self.group, self.seed, self.version = group, seed, version
        self._state: dict | None = None

    def materialize(self) -> dict:
        """The seed's train state (training/step.py layout), sliced from the group's."""
        if self._state is None:
            self._state = self.group.slice_of(self.seed, self.version)
        return self._state


class SeedSlot:
    """What one seed's `train` takes from the group: `stop` (a `SharedStop`),
    `make_step`, a stand-in for `make_train_step` whose step runs with the other seeds',
    and `make_eval_step`, the group's one eval step."""

    def __init__(self, group: SeedGroup, seed: int):
        self.group, self.seed, self.stop = group, seed, group.stop
        # One progress bar for the group (the first seed's), labelled with every seed.
        self.shows_progress = seed == min(group.seeds)
        self.group_label = f" (seeds {', '.join(map(str, group.seeds))} together)"

    def make_step(self, graphdef, cfg_train, plugins=()) -> Callable:
        """`make_train_step(graphdef, cfg_train, plugins=plugins)`'s signature and step:
        `(state, batch[, lr_scale]) -> (SeedState, metrics)`, blocking until every seed of
        the group has given its step (not its result: the program runs asynchronously).
        `state` is the seed's own train state at its first step, then the `SeedState`
        the step before returned."""
        self.group.set_step_fn(make_train_step(graphdef, cfg_train, plugins=plugins, jit=False),
                               bool(cfg_train.rdrop_alpha))
        key = jax.random.key(cfg_train.seed)
        return functools.partial(self.group.step, self.seed, key)

    def make_eval_step(self, graphdef, label_smoothing: float) -> Callable:
        """`make_eval_step`'s jitted `(params, batch) -> sums`, one for the whole group: the
        seeds' models differ only in their parameters, so one program per batch shape
        serves them all (each seed's own would compile the same programs N times)."""
        return self.group.shared_eval_step(graphdef, label_smoothing)


class SeedGroup:
    """The rendezvous of the seeds' train steps: once every seed still training has
    given its (state, batch, lr_scale), the first to find the group complete runs them
    all (`_together`) on the stacked state and each seed gets its `SeedState` and
    metrics back."""

    def __init__(self, seeds: Sequence[int], stop: StopRequest):
        self.stop = SharedStop(stop)
        self.seeds = tuple(seeds)
        self._cond = threading.Condition()
        self._members = set(seeds)  # seeds that have not left (started or not)
        self._arrived: set[int] = set()  # seeds that gave a step or left
        self._pending: dict[int, tuple] = {}  # seed -> (key, state, batch, lr_scale)
        self._results: dict[int, object] = {}  # seed -> (SeedState, metrics) or an exception
        self._program: Callable | None = None
        self._eval_step: Callable | None = None
        self._rdrop = False
        self._stacked: dict | None = None  # every seed's state, stacked in `self.seeds` order
        self._keys: jax.Array | None = None  # the seeds' dropout base keys, stacked
        self._active_masks: dict[tuple[int, ...], jax.Array] = {}
        self.programs_run = 0  # calls of the jitted program: the version of `_stacked`

    def slot(self, seed: int) -> SeedSlot:
        return SeedSlot(self, seed)

    def set_step_fn(self, step_fn: Callable, rdrop: bool) -> None:
        """The unjitted step of the first seed (`make_train_step(..., jit=False)`); the
        seeds' configs differ only in train.seed, which enters as each seed's key."""
        with self._cond:
            if self._program is None:
                self._program = jax.jit(functools.partial(_together, step_fn), donate_argnums=0)
                self._rdrop = rdrop

    def shared_eval_step(self, graphdef, label_smoothing: float) -> Callable:
        """The first seed's `make_eval_step(graphdef, label_smoothing)`, for every seed."""
        with self._cond:
            if self._eval_step is None:
                self._eval_step = make_eval_step(graphdef, label_smoothing)
            return self._eval_step

    def slice_of(self, seed: int, version: int) -> dict:
        """`seed`'s train state as the `version`-th program left it (`SeedState`)."""
        with self._cond:
            if version != self.programs_run:  # its arrays were donated to a later step
                raise RuntimeError(f"seed {seed}: its state of step call {version} was "
                                   f"replaced by call {self.programs_run}'s; read it before")
            return _slice(self._stacked, self.seeds.index(seed))

    def step(self, seed: int, key: jax.Array, state, batch: dict, lr_scale=None):
        with self._cond:
            self._arrived.add(seed)
            self._pending[seed] = (key, state, batch, lr_scale)
            self._cond.notify_all()  # `wait_arrived` of the main thread
            self._run_if_complete()
            while seed not in self._results:
                self._cond.wait()
            result = self._results.pop(seed)
        if isinstance(result, BaseException):
            raise result
        return result

    def leave(self, seed: int) -> None:
        """`seed` trains no more (it ended, or failed): the others stop waiting for it."""
        with self._cond:
            self._members.discard(seed)
            self._arrived.add(seed)
            self._run_if_complete()
            self._cond.notify_all()

    def wait_arrived(self, seed: int) -> None:
        """Until `seed` has given its first step or left (its set-up is over)."""
        with self._cond:
            while seed not in self._arrived:
                self._cond.wait(WAIT_SLICE_S)  # the main thread's: see WAIT_SLICE_S

    def _active(self, group: list[int]) -> jax.Array:
        """bool [n]: which of the seeds `group` holds (placed once per group, not per step)."""
        key = tuple(group)
        if key not in self._active_masks:
            self._active_masks[key] = jnp.asarray([k in group for k in self.seeds])
        return self._active_masks[key]

    def _restack(self, pending: dict[int, tuple]) -> None:
        """With the lock held: `_stacked` from the seeds' own states where one gave a state
        that is not a view of the current stack (its first step). A seed that left keeps
        its slice; one that never gave a step has another's state there, stepped never."""
        given = {k: state for k, (_, state, _, _) in pending.items()}
        if self._stacked is None or not all(_is_current(s, self.programs_run)
                                            for s in given.values()):
            filler = next(iter(given.values()))
            states = []
            for index, seed in enumerate(self.seeds):
                state = given.get(seed)
                if state is None:
                    state = filler if self._stacked is None else _slice(self._stacked, index)
                states.append(state.materialize() if isinstance(state, SeedState) else state)
            self._stacked = _stack(tuple(states))
        if self._keys is None:
            first = next(iter(pending.values()))[0]
            self._keys = jnp.stack([pending.get(k, (first,))[0] for k in self.seeds])

    def _run_if_complete(self) -> None:
        """With the lock held: run the pending steps once every member has given one."""
        if not self._pending or not self._members <= self._pending.keys():
            return
        pending, self._pending = self._pending, {}
        try:
            self._restack(pending)
            batches = {k: batch for k, (_, _, batch, _) in pending.items()}
            scales = None if next(iter(pending.values()))[3] is None else jnp.stack(
                [pending[k][3] if k in pending else jnp.float32(1) for k in self.seeds])
            metrics_of = {}
            for group in batch_groups(batches, self._rdrop):
                # The others step on an all-pad batch of the group's shape (no loss weight)
                # and keep their states (`active`): one program per batch shape.
                blank = None if len(group) == len(self.seeds) else {
                    name: jnp.zeros(x.shape, x.dtype) for name, x in batches[group[0]].items()}
                step_batches = tuple(batches[k] if k in group else blank for k in self.seeds)
                self._stacked, metrics = self._program(self._stacked, step_batches, scales,
                                                       self._keys, self._active(group))
                self.programs_run += 1
                metrics_of.update((k, metrics[self.seeds.index(k)]) for k in group)
            self._results.update((k, (SeedState(self, k, self.programs_run), metrics_of[k]))
                                 for k in pending)
        except Exception as err:  # noqa: BLE001 - every waiting seed raises it
            for seed in pending:
                self._results.setdefault(seed, err)
        self._cond.notify_all()


def _is_current(state, version: int) -> bool:
    return isinstance(state, SeedState) and state.version == version


@jax.jit
def _stack(states: tuple) -> dict:
    """n train states of one structure -> one, each array with a leading seed axis [n, ...]."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


@jax.jit
def _slice(stacked: dict, index: jax.Array) -> dict:
    """The `index`-th train state of a stacked one (`_stack`); one program for every index."""
    return jax.tree.map(lambda x: x[index], stacked)


def batch_groups(batches: dict[int, dict], full_shape: bool = False) -> list[list[int]]:
    """The seeds (keys of `batches`, {seed: batch}) that can share one program, in
    groups: equal keys, dtypes and shapes but for the leading rows axis (all of it when
    `full_shape`: R-Drop's doubled batch would move the second copy's dropout masks)."""
    groups: dict[tuple, list[int]] = {}
    for seed in sorted(batches):
        signature = tuple(sorted((name, tuple(x.shape[0 if full_shape else 1:]), str(x.dtype))
                                 for name, x in batches[seed].items()))
        groups.setdefault(signature, []).append(seed)
    return list(groups.values())


def _together(step_fn: Callable, stacked: dict, batches: tuple, lr_scales: jax.Array | None,
              keys: jax.Array, active: jax.Array) -> tuple[dict, tuple]:
    """One train step of n seeds as one program (jitted by SeedGroup, `stacked` donated).

    stacked: the n seeds' train states (training/step.py), each array [n, ...]; batches: n
    batches with equal keys, each array [B_k, ...] with the same trailing shape (padded
    here to the most rows with all-pad rows); lr_scales: float32 [n], or None; keys: n
    typed PRNG keys [n] (each seed's dropout base key); active: bool [n], the seeds this
    call steps (the others' states come back unchanged).
    Returns (the stacked new states, n metrics dicts), each active seed's as `step_fn`
    alone gives them.
    """
    rows = max(x.shape[0] for batch in batches for x in batch.values())

    def pad_rows(x):  # all-pad rows: no loss weight, and the real rows' masks stay put
        return jnp.pad(x, [(0, rows - x.shape[0])] + [(0, 0)] * (x.ndim - 1))

    stacked_batches = jax.tree.map(lambda *xs: jnp.stack(xs),
                                   *[jax.tree.map(pad_rows, b) for b in batches])
    new, metrics = jax.vmap(step_fn)(stacked, stacked_batches, lr_scales, keys)
    new = jax.tree.map(lambda n, o: jnp.where(active.reshape((-1,) + (1,) * (n.ndim - 1)), n, o),
                       new, stacked)
    return new, tuple(jax.tree.map(lambda x, k=k: x[k], metrics) for k in range(len(batches)))


def train_together(run_seed: Callable[[int, SeedSlot], int], seeds: Sequence[int]) -> int:
    """Runs `run_seed(seed, slot)` (train.py's `train` of that seed, its step taken from
    `slot`) for every seed in a thread of its own, their steps one program (module
    docstring). Returns the first non-zero exit code (130 / 143 after a signal), else 0;
    raises the first seed's exception (by seed order) once all have ended."""
    stop = StopRequest()  # in the main thread, the one that can catch signals
    group = SeedGroup(seeds, stop)
    outcomes: dict[int, int | BaseException] = {}

    def work(seed: int) -> None:
        try:
            outcomes[seed] = run_seed(seed, group.slot(seed))
        except BaseException as err:  # noqa: BLE001 - raised again in the main thread
            outcomes[seed] = err
        finally:
            group.leave(seed)

    threads = []
    try:
        for seed in seeds:
            if any(isinstance(o, BaseException) for o in outcomes.values()):
                group.leave(seed)  # not started: a seed failed
                continue
            thread = threading.Thread(target=work, args=(seed,), name=f"seed{seed}", daemon=True)
            thread.start()
            threads.append(thread)
            group.wait_arrived(seed)  # one seed's set-up at a time
        for thread in threads:
            while thread.is_alive():
                thread.join(WAIT_SLICE_S)
    finally:
        stop.restore()
    for seed in seeds:
        if isinstance(outcome := outcomes.get(seed), BaseException):
            raise outcome
    return next((code for seed in seeds if (code := outcomes.get(seed, 0))), 0)
