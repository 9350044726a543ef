"""Periodic work of the training loop as hooks, each registered with its period, so the
loop itself is a few lines (levanter's habit):

    hooks = train_hooks(cfg, clock, validator, saver, logger, finished)
    while ...:
        state, metrics = train_step(state, batch)
        run_hooks(hooks, Tick(step, state, final=..., stop=stop), logger.hook_seconds)

After every step each hook in turn asks the one predicate of every periodic action,
`itstime(step, every, at_end(tick))` (training/loop.py), or its own `also(tick)` (the
checkpoint after a validation, say); the hooks run in the order they are listed, and
see what the earlier ones of that step left on the tick (a validation's BLEU). The
seconds each hook holds the loop go into the train events (`seconds_in_<hook>`), so a
run's metrics say where its wall time went besides the steps.

The hooks of train.py live here (`MetricsLogger`, `BudgetClock`, `Saver`) but for its
validation, which comes from evaluation/ (training does not import it).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from common.errors import UserError
from training import checkpoint as ckpt
from training.loop import LoopState, StopRequest, itstime
from training.metrics_log import MetricsLog
from training.schedules import budget_decay


@dataclasses.dataclass
class Tick:
    """What the hooks of one step see.

    step: int, the step just trained (1 after the first); `state`: the train state after
    it, from `given`: the train state itself, or what the step returned in its place (a
    seed trained with others, training/together.py's `SeedState`, whose `materialize()`
    cuts it out of the seeds' stacked state: only when a hook reads it); final: the run
    ends after this step (train.num_steps, the time budget or a signal, as known when the
    step ended); signalled: a signal had arrived by then; valid: set by the validation
    hook when it ran at this step, its figures {"loss": ..., "bleu": ...} (bleu None when
    it did not decode).
    """

    step: int
    given: dict | Any
    final: bool
    stop: StopRequest
    signalled: bool = dataclasses.field(init=False)  # read from `stop` when made
    valid: dict[str, float | None] | None = None
    _stopping: bool | None = None

    def __post_init__(self) -> None:
        self.signalled = bool(self.stop.signum)

    @functools.cached_property
    def state(self) -> dict:
        """The train state after this step (`given`, materialised once if it is a view)."""
        return self.given if isinstance(self.given, dict) else self.given.materialize()

    @property
    def stopping(self) -> bool:
        """Whether a signal asks the loop to stop after this step, read once (when first
        asked: by the checkpoint, after the validation, or at a step it saves anyway, by
        the log after it) so that the save and the loop's break agree: a signal that
        arrives while the step is validated or saved (most of a step's wall time when it
        has a host sync) is still saved before the loop stops."""
        if self._stopping is None:
            self._stopping = bool(self.stop.signum)
        return self._stopping

    @staticmethod
    def ends(tick: Tick) -> bool:
        return tick.final

    @staticmethod
    def ends_unsignalled(tick: Tick) -> bool:
        """The run's last step, unless a signal ends it (then no validation: exit soon)."""
        return tick.final and not tick.signalled


@dataclasses.dataclass(frozen=True)
class Hook:
    """Periodic work: `run(tick)` after the steps `itstime(step, every, at_end(tick))`
    names (every `every` steps, 0 = never, and at the end), or when `also(tick)` holds."""

    name: str
    every: int
    run: Callable[[Tick], None]
    at_end: Callable[[Tick], bool] = Tick.ends
    also: Callable[[Tick], bool] = lambda tick: False


def train_hooks(cfg, clock: Callable[[Tick], None], validation: Callable[[Tick], None],
                saver: Saver, logger: Callable[[Tick], None],
                finished: Callable[[int], str]) -> list[Hook]:
    """train.py's periodic work, in the order it runs after a step: the budget clock (the
    factor the step just trained with), validation, the checkpoint (which saves the
    validation's figure with it), then the log. The log comes last so that a train event
    holds the seconds of the validation and save of its own step, and so that the run's
    last train event comes at its last step, however it ended (train.num_steps, the time
    budget, a signal, or `finished(step)`, non-empty once patience ran out at that step's
    validation): its steps since the log before, and the seconds of the end's validation
    and save, are not left out of metrics.jsonl."""
    def ends(tick: Tick) -> bool:
        return tick.final or tick.stopping or bool(finished(tick.step))

    return [Hook("budget_clock", 1, clock),
            Hook("validate", cfg.eval.every_steps, validation, at_end=Tick.ends_unsignalled),
            Hook("checkpoint", cfg.checkpoint.every_steps, saver, also=saver.also_due),
            Hook("log", cfg.train.log_every_steps, logger, at_end=ends)]


def run_hooks(hooks: list[Hook], tick: Tick, seconds: dict[str, float] | None = None) -> None:
    """Run, in order, the hooks due after `tick.step`; with `seconds`, each hook's wall
    seconds are added to `seconds[hook.name]` (every hook named, 0.0 when it did not run):
    the log hook reports them (`MetricsLogger.hook_seconds`)."""
    for hook in hooks:
        if itstime(tick.step, hook.every, hook.at_end(tick)) or hook.also(tick):
            start = time.perf_counter()
            hook.run(tick)
            if seconds is not None:
                seconds[hook.name] = seconds.get(hook.name, 0.0) + time.perf_counter() - start
        elif seconds is not None:
            seconds.setdefault(hook.name, 0.0)


def check_finite(state: dict, manager) -> None:
    """Before any host sync: a non-finite step stops the run without saving (the jitted
    step kept the last finite parameters and recorded the step in "nonfinite_step")."""
    bad = int(state["nonfinite_step"])
    if bad >= 0:
        manager.wait_until_finished()
        good = manager.latest_step()
        kept = f"last good checkpoint: step {good}" if good is not None else "no checkpoint yet"
        raise UserError(f"non-finite loss or gradient at step {bad + 1}; stopped without "
                        f"saving ({kept}); lower train.learning_rate and resume with "
                        "--allow_config_change=train.learning_rate, or use a new --workdir")


@functools.partial(jax.jit, donate_argnums=0)
def _accumulate(total: dict | None, metrics: dict) -> dict:
    """The window's running figures after one more step (None: the window's first): the
    step's sums added up, the gradient norm's sum ("grad_norm_total") and its maximum.
    A window starts from zeros (norms are >= 0), so no output is an input passed through."""
    norm = metrics["grad_norm"]
    sums = {k: v for k, v in metrics.items() if k != "grad_norm"} | {"grad_norm_total": norm}
    if total is None:
        total = jax.tree.map(jnp.zeros_like, sums | {"grad_norm_max": norm})
    return {k: total[k] + v for k, v in sums.items()} | {
        "grad_norm_max": jnp.maximum(total["grad_norm_max"], norm)}


class MetricsLogger:
    """The "log" hook: the train event of metrics.jsonl / TensorBoard over the steps since
    the last one. `add` sums each step's metrics on the device (one small dispatch, no
    sync); the hook fetches the sums once: fetching every step's scalars one by one cost
    the host more than a micro model's step (bench/host_overhead.py).

    `hook_seconds`, filled by `run_hooks`, is logged as `seconds_in_<hook>`: the wall
    seconds each hook held the loop in the window (its own log run counts in the next
    one). A hook's first host sync also waits for the steps queued before it (the step
    just dispatched, at least): the seconds of the first hook of a step that syncs (the
    validation, the save or the log, in train_hooks' order) hold that backlog too.
    """

    def __init__(self, log: MetricsLog, schedule, clock: BudgetClock, manager, progress,
                 compile_seconds: Callable[[], float]):
        self.log, self.schedule, self.clock, self.manager = log, schedule, clock, manager
        self.progress, self.compile_seconds = progress, compile_seconds
        self.epoch = 0
        self.hook_seconds: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        self.sums, self.steps, self.start, self.tokens, self.wait = None, 0, time.time(), 0, 0.0
        self.hook_seconds.clear()  # in place: run_hooks may be filling it as we log

    def add(self, metrics: dict, tokens: int, input_wait: float, epoch: int) -> None:
        """One step's metrics (device scalars: sums over its tokens, and its grad_norm),
        its target tokens and the seconds the loop waited for its batch (the input
        pipeline fell behind)."""
        # The gradient norm over the window: its mean and its largest (a spike between two
        # logs is what one wants to see; the last step's value alone hides it).
        self.sums = _accumulate(self.sums, metrics)
        self.steps += 1
        self.tokens += tokens
        self.wait += input_wait
        self.epoch = epoch

    def __call__(self, tick: Tick) -> None:
        check_finite(tick.state, self.manager)
        sums = jax.device_get(self.sums)
        tokens = max(float(sums["tokens"]), 1.0)
        loss = float(sums["loss_sum"]) / tokens
        window = max(time.time() - self.start, 1e-9)
        # Auxiliary terms per token (R-Drop's KL, a plug-in's losses), when the run has them.
        extra = {key[: -len("_sum")]: float(value) / tokens for key, value in sums.items()
                 if key.endswith("_sum") and key not in ("loss_sum", "nll_sum")}
        self.log.write(tick.step, "train", loss=loss, **extra,
                       learning_rate=float(self.schedule(tick.step - 1)) * self.clock.used,
                       tokens_per_sec=self.tokens / window,
                       grad_norm_mean=float(sums["grad_norm_total"]) / self.steps,
                       grad_norm_max=float(sums["grad_norm_max"]),
                       epoch=self.epoch, compile_seconds=self.compile_seconds(),
                       input_wait_fraction=self.wait / window,
                       **{f"seconds_in_{name}": round(seconds, 4)
                          for name, seconds in self.hook_seconds.items()})
        self.progress.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.tokens / window:.0f}")
        self._reset()


class BudgetClock:
    """`train.schedule = "cosine_budget"`: `factor()`, asked before each step, is that
    step's factor on the learning rate (`budget_decay` of the training time so far; None
    for the other schedules, so the step multiplies nothing); the hook, after each step,
    notes when warmup ended, from which the cosine runs."""

    def __init__(self, cfg_train, loop: LoopState):
        self.enabled = cfg_train.schedule == "cosine_budget"
        self.loop, self.budget_seconds = loop, 60 * cfg_train.max_minutes
        self.warmup_end = max(1, cfg_train.warmup_steps)
        self.used = 1.0  # the factor the last step trained with (for its log)

    def factor(self) -> np.float32 | None:
        if not self.enabled:
            return None
        scale = np.float32(budget_decay(self.loop.train_seconds, self.loop.decay_start_seconds,
                                        self.budget_seconds))
        self.used = float(scale)
        return scale

    def __call__(self, tick: Tick) -> None:
        if self.enabled and self.loop.decay_start_seconds < 0 and tick.step >= self.warmup_end:
            self.loop.decay_start_seconds = self.loop.train_seconds


def in_last_saves(step: int, num_steps: int, keep: int, every: int) -> bool:
    """Whether `step` is one of the last `keep` saves `every` steps apart before
    `num_steps` (checkpoint.last_every_steps; every 0: none): a multiple of `every` in the
    last keep * every steps."""
    return every > 0 and step % every == 0 and step > num_steps - keep * every


class Saver:
    """The "checkpoint" hook: saves every `checkpoint.every_steps`, at the end, when the
    run finishes early (the time budget, patience), when a signal asks to stop, after
    every validation (whose figure named by `metric`, train.patience_metric, ranks the
    best checkpoint), and at the last saves `in_last_saves` names (`last_saves`: its
    num_steps, keep and every)."""

    def __init__(self, manager, loop: LoopState, finished: Callable[[int], str],
                 train_seconds: Callable[[], float], metric: str,
                 last_saves: tuple[int, int, int] = (0, 0, 0)):
        self.manager, self.loop, self.finished, self.train_seconds = (manager, loop, finished,
                                                                      train_seconds)
        self.metric, self.last_saves = metric, last_saves

    def also_due(self, tick: Tick) -> bool:
        return (tick.stopping or bool(self.finished(tick.step)) or tick.valid is not None
                or in_last_saves(tick.step, *self.last_saves))

    def __call__(self, tick: Tick) -> None:
        check_finite(tick.state, self.manager)
        self.loop.train_seconds = self.train_seconds()
        value = None if tick.valid is None else tick.valid[self.metric]
        ckpt.save(self.manager, tick.step, tick.state, dataclasses.asdict(self.loop),
                  None if value is None else {self.metric: value})


def step_cap_warning(cfg_train, expected_last: int) -> str:
    """The warning for a "cosine_budget" run whose train.num_steps will end it before its
    time budget ("" when the clock ends it)."""
    if cfg_train.schedule != "cosine_budget" or expected_last < cfg_train.num_steps:
        return ""
    return (f"warning: train.num_steps ({cfg_train.num_steps}) ends this run before its "
            f"{cfg_train.max_minutes:g}-minute budget, with the cosine_budget learning rate "
            "not yet decayed; raise it to let the clock end the run")

