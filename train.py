"""Train an encoder-decoder Transformer from a config (README, journey 1).

    python train.py --config configs/multi30k_de_en.py --workdir runs/de_en \
        [--config.model.num_encoder_layers=4 ...]
    python train.py --config configs/multi30k_de_en.py --workdir runs/de_en_seeds --seeds 3

Running the same command again resumes from the last checkpoint: step, parameters,
optimizer, data position and dropout keys continue exactly where they stopped.
Writes `<workdir>/{config.json, tokenizer/, checkpoints/, metrics.jsonl,
tensorboard/, attention/}`. From Python: `train.train(config, workdir) -> exit code`.
`--seeds N` trains seeds 0..N-1 (`train.seed = k`) into `<workdir>/seed<k>/`, one after
another, each resumed like a workdir; `evaluate.py --workdir <workdir>` then summarizes
them (evaluation/seeds.py). From Python: `train.train_seeds(config, workdir, N)`.
`--seeds N --together` trains the same seed runs at once, their steps one vmapped
program (training/together.py): on an accelerator N seeds cost about one.

Reliability:
  * Killed at any moment (SIGKILL, power loss of the process), the same command
    resumes from the last complete checkpoint and ends with the same parameters as an
    uninterrupted run. Orbax renames a checkpoint into place only when it is complete;
    leftover temporary directories are deleted when training restarts. On resume,
    metrics.jsonl loses the events after the restored step (they are logged again, so
    no step appears twice; rewritten atomically) and TensorBoard hides them
    (`purge_step`). Attention maps of those steps are rewritten with identical content.
    Temporary files of a write cut off by a kill are deleted (common/files.py).
  * SIGINT / SIGTERM: the current step finishes, a checkpoint is saved, and the run
    exits with 130 / 143 and one line saying where it stopped.
  * A non-finite loss or gradient never reaches the parameters (the jitted step skips
    that update and records the step); the loop stops at its next log, eval or
    checkpoint with an error naming the step, saving nothing, so the newest checkpoint
    is the last good one.
  * Resume guard: before anything is written, the config is compared with
    `<workdir>/config.json` (configs/resume.py says which keys may change), and the
    training data and tokenizer with fingerprints saved in the checkpoint.
  * One writer per run: once its checks have passed, a run holds its workdir (and a
    --seeds parent) with a lock (common/workdir_lock.py) that the kernel drops when the
    process dies; a second training, or an evaluate.py writing there, is refused in one
    line naming the holder (pid, host, start time). Process 0 alone takes it.
  * User errors (bad config, corpus, checkpoint, ...) are one `error: ...` line on
    stderr, exit status 2, files untouched; --debug shows the traceback (and the
    orbax log, which --verbosity=0 shows too).
"""

from __future__ import annotations

import contextlib
import copy
import logging as std_logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
from absl import flags, logging
from ml_collections import config_flags
from tqdm import tqdm

from common import cli
from common.errors import UserError
from common.files import remove_stale_temp_files
from common.workdir_lock import WorkdirLock, check_not_training
from configs import resolved
from configs.resolved import CONFIG_JSON, load_config_json, write_config_json
from configs.resume import check_resume_config
from configs.validation import validate_config
from data.batching import prefetch
from data.cache import DataCache
from data.corpora import load_corpus
from data.packing import make_batcher
from data.sampling import SampledEpochs
from data.streaming import training_source
from data.tokenizer import tokenizer_fingerprint
from evaluation.corpus import validate
from evaluation.precompile import ValidationPrograms, compile_validation_ahead
from evaluation.previews import PreviewDrawer
from evaluation.seeds import seed_workdir, seed_workdirs
from training import checkpoint as ckpt
from training.compilation import CompileTimer, enable_compilation_cache
from training.distributed import (
    device_batches,
    initialize_distributed,
    make_mesh,
    use_cpu_devices,
)
from training.hooks import (
    BudgetClock,
    MetricsLogger,
    Saver,
    Tick,
    check_finite,
    run_hooks,
    step_cap_warning,
    train_hooks,
)
from training.loop import (
    LoopState,
    StopRequest,
    check_resume_inputs,
    expected_last_step,
    finished_reason,
)
from training.metrics_log import MetricsLog
from training.plugins import active_plugins, locked_keys
from training.schedules import learning_rate_schedule
from training.step import create_train_state, make_eval_step, make_train_step
from training.together import SeedSlot, train_together

ONE_WRITER_HINT = "one run has one writer: wait for it to end, or give another --workdir"


def train(cfg, workdir: str | Path, *, allow_config_change: tuple[str, ...] = (),
          hold: tuple[WorkdirLock, ...] = (), slot: SeedSlot | None = None) -> int:
    """Run (or resume) training in `workdir`; returns the process exit code (0, or 130/143
    after SIGINT/SIGTERM). Raises UserError for bad input, before anything is written,
    and when another process holds the workdir (common/workdir_lock.py).

    allow_config_change: dotted config keys that may differ from the run being resumed.
    hold: more locks to take with the workdir's (unless held already) and keep: the
    parent folder's of `train_seeds`, which lets it go.
    slot: this seed's place in `--seeds N --together` (training/together.py): its train
    step runs with the other seeds', and signals reach it through the main thread.
    """
    with contextlib.ExitStack() as held:  # the workdir's lock, let go however training ends
        return _train(cfg, Path(workdir), allow_config_change, hold, held, slot)


def _train(cfg, workdir: Path, allow_config_change: tuple[str, ...],
           hold: tuple[WorkdirLock, ...], held: contextlib.ExitStack,
           slot: SeedSlot | None = None) -> int:
    """`train`; the workdir's lock goes into `held` once every check has passed."""
    validate_config(cfg)
    plugins = active_plugins(cfg)  # word alignment, say (training/plugins.py); checks them
    use_cpu_devices(cfg.train.cpu_devices)  # before anything starts JAX's backends
    enable_compilation_cache()
    initialize_distributed()  # a multi-process launch (training/step.py)

    # 1. Every check runs before anything is written; checkpoints are read through a
    # read-only manager until the restore has succeeded. A training that holds the
    # workdir is named first: it may delete the very checkpoint the checks would read.
    on_process0(lambda: check_not_training(workdir, hint=ONE_WRITER_HINT), workdir)
    checkpoint_dir = workdir / "checkpoints"
    reader = ckpt.make_manager(checkpoint_dir, cfg.checkpoint.keep, read_only=True) \
        if checkpoint_dir.is_dir() else None
    latest = reader.latest_step() if reader is not None else None
    saved_meta = ckpt.restore_meta(reader, latest) if latest is not None else {}
    if latest is not None:
        if ckpt.EXPORT_KEY in saved_meta:
            raise UserError(f"{workdir} holds an exported model (parameters alone, for "
                            "inference: scripts/export_pretrained.py); train in a new --workdir")
        saved = load_config_json(workdir)
        check_resume_config(saved, cfg, str(workdir), allow_config_change,
                            locked=locked_keys(saved, cfg))
    # The training split streams (never whole in memory) into the data cache; a warm
    # start reads its fingerprint from there and maps the encoded ids (data/cache.py).
    source = training_source(cfg.data)
    cache = DataCache(cfg.data.cache_dir)
    corpus = cache.scan(source)
    valid = load_corpus(cfg.data, "valid")
    fingerprints = {name: sha256 for plugin in plugins
                    for name, sha256 in plugin.read_inputs(corpus.pairs).items()}
    if latest is not None:
        check_resume_inputs(LoopState.from_meta(saved_meta), latest,
                            workdir, corpus.data_sha256, fingerprints)

    hold_workdir(workdir, checkpoint_dir, latest, hold, held)  # one writer from here on
    # 2. The data checks passed: the tokenizer and the encoded data are written (or read).
    tokenizer = cache.tokenizer(workdir / "tokenizer", cfg.data, source, corpus)
    src_ids, tgt_ids, dropped = cache.encoded(source, corpus, tokenizer, workdir / "tokenizer",
                                              cfg.data.max_length, cfg.data.long_pairs)
    mesh = make_mesh()
    fields = {name: field for plugin in plugins
              for name, field in plugin.batch_fields(tokenizer, src_ids, tgt_ids, dropped).items()}
    # Subword regularisation draws each epoch's segmentation afresh (data/sampling.py).
    batcher = (SampledEpochs(source, tokenizer, cfg.data, batch_tokens=cfg.train.batch_tokens,
                             batch_multiple=mesh.size, seed=cfg.train.seed)
               if cfg.data.spm_sampling_alpha else
               make_batcher(src_ids, tgt_ids, cfg.train.batch_tokens, cfg.data.max_length,
                            pack_length=cfg.data.pack_length, bucket_step=cfg.data.bucket_step,
                            batch_multiple=mesh.size, seed=cfg.train.seed, fields=fields))
    graphdef, state = create_train_state(cfg, tokenizer.source_vocab_size,
                                         tokenizer.target_vocab_size, mesh, plugins)
    loop = LoopState()
    if latest is not None:
        state, meta = ckpt.restore(reader, latest, ckpt.abstract_of(state))
        loop = LoopState.from_meta(meta)
    if reader is not None:
        reader.close()
    loop.data_sha256 = corpus.data_sha256
    loop.tokenizer_sha256 = tokenizer_fingerprint(workdir / "tokenizer")
    loop.fingerprints = fingerprints
    step = int(state["step"])

    manager = ckpt.make_manager(checkpoint_dir, cfg.checkpoint.keep)  # drops half-written saves
    if jax.process_index() == 0:
        write_config_json(cfg, workdir)
        for folder in (workdir, workdir / "attention", workdir / "eval"):  # cut off by a kill
            remove_stale_temp_files(folder)
    if latest is not None and (done := finished_reason(step, loop, cfg.train)):
        # A finished run resumes to no work (a time budget or patience would otherwise
        # let it train one more step); a larger train.num_steps extends it.
        print(f"attnmt: {workdir} finished training at step {step} ({done}); nothing to do",
              file=sys.stderr)
        manager.close()
        return 0
    log = MetricsLog(workdir, step)
    previews = PreviewDrawer(log)  # validation's PNG previews, drawn while training goes on
    params_count = sum(x.size for x in jax.tree.leaves(state["params"]))
    print(f"attnmt: {len(src_ids)} training pairs ({dropped} too long, dropped), "
          f"{params_count / 1e6:.2f}M parameters, {jax.device_count()} device(s), "
          f"{'resuming from step ' + str(step) if latest is not None else 'starting'} in {workdir}",
          file=sys.stderr)

    # 3. The loop: one step, then the periodic work due after it (training/hooks.py).
    train_step = (slot.make_step if slot else make_train_step)(graphdef, cfg.train, plugins=plugins)
    eval_step = (slot.make_eval_step if slot else make_eval_step)(graphdef, cfg.train.label_smoothing)
    # Validation's programs compile on background threads meanwhile (a dozen of them).
    ahead = (compile_validation_ahead(cfg, graphdef, state["params"], eval_step, tokenizer, valid)
             if cfg.eval.precompile else ValidationPrograms({}))
    stop = slot.stop if slot else StopRequest()
    batches = prefetch(device_batches(batcher.iterate(loop.epoch, loop.batch_index), mesh))
    budget = f" (stops after {cfg.train.max_minutes:g} min)" if cfg.train.max_minutes else ""
    # Seeds trained together share one bar, the first seed's; each seed's lines name it.
    tag = f"seed {slot.seed}: " if slot else ""
    progress = tqdm(total=cfg.train.num_steps, initial=step, dynamic_ncols=True,
                    disable=jax.process_index() != 0 or bool(slot and not slot.shows_progress),
                    desc=f"train{slot.group_label if slot else ''}{budget}", mininterval=5)
    first_step, step_cap_warned = step, False
    session_start, trained_before = time.time(), loop.train_seconds
    compile_timer = CompileTimer().start()  # XLA compilation (or cache loads) of this run

    def validation(tick: Tick) -> None:
        check_finite(tick.state, manager)
        ahead.wait()
        figures = tick.valid = validate(cfg, graphdef, tick.state["params"], eval_step,
                                        tokenizer, valid, tick.step, log, workdir, previews)
        metric = cfg.train.patience_metric
        loop.record_validation(tick.step, figures["bleu"], figures["loss"], metric)
        said = f"valid BLEU {figures['bleu']:.2f}, " if figures["bleu"] is not None else ""
        best = f"{loop.best_bleu:.2f}" if metric == "bleu" else f"loss {loop.best_loss:.4f}"
        progress.write(f"{tag}step {tick.step}: {said}loss {figures['loss']:.4f} "
                       f"(best {best} at step {loop.best_step})")

    def train_seconds() -> float:
        return trained_before + time.time() - session_start

    def finished(at: int) -> str:
        return finished_reason(at, loop, cfg.train)

    clock = BudgetClock(cfg.train, loop)
    logger = MetricsLogger(log, learning_rate_schedule(cfg.train), clock, manager, progress,
                           lambda: compile_timer.seconds)
    saver = Saver(manager, loop, finished, train_seconds, cfg.train.patience_metric,
                  (cfg.train.num_steps, cfg.checkpoint.keep, cfg.checkpoint.last_every_steps))
    hooks = train_hooks(cfg, clock, validation, saver, logger, finished)
    try:
        while step < cfg.train.num_steps:
            waiting = time.perf_counter()
            epoch, index, tokens, batch = next(batches)
            input_wait = time.perf_counter() - waiting
            state, metrics = train_step(state, batch, clock.factor())
            step += 1
            loop.epoch, loop.batch_index = epoch, index + 1  # where to resume
            loop.train_seconds = train_seconds()
            logger.add(metrics, tokens, input_wait, epoch)
            progress.total = expected_last_step(  # under a time budget: the step it ends at
                step, cfg.train.num_steps, cfg.train.max_minutes, loop.train_seconds,
                (time.time() - session_start) / (step - first_step))
            if not step_cap_warned and (warning := step_cap_warning(cfg.train, progress.total)):
                step_cap_warned = True  # the step cap, not the clock, will end this run
                progress.write(warning, file=sys.stderr)
            progress.update(1)
            # Known before this step's validation: train.num_steps, the budget, a signal.
            final = bool(finished(step)) or bool(stop.signum)
            tick = Tick(step, state, final, stop)
            run_hooks(hooks, tick, logger.hook_seconds)
            if tick.stopping:
                break
            if why := finished(step):  # after validation: patience too
                if step < cfg.train.num_steps:
                    progress.write(f"{tag}stopping at step {step}: {why}")
                break
    finally:
        ahead.cancel()
        batches.close()  # stops the input thread, which places batches with JAX
        stop.restore()
        manager.wait_until_finished()
        previews.close()
        progress.close()
        log.close()
        compile_timer.stop()
    previews.raise_error()
    print(f"attnmt: {compile_timer.seconds:.1f} s of this session went to compiling "
          "(train, eval and decoding programs)", file=sys.stderr)
    if stop.signum:  # printed last, after the progress bar's final line
        report_signal(stop.name, step, manager.all_steps(read=True), workdir)
        return 128 + stop.signum
    return 0


def hold_workdir(workdir: Path, checkpoint_dir: Path, latest: int | None,
                 hold: tuple[WorkdirLock, ...], held: contextlib.ExitStack) -> None:
    """Makes this run the one writer of `workdir` (the locks of `train`), before it
    writes anything: UserError naming the holder if another process has it. Process 0
    alone writes, so it alone takes the locks; the others learn whether it got them.

    latest: the newest checkpoint step the checks saw. A run that saved a newer one
    meanwhile (it ended between our checks and our lock) is refused too: the checks
    were of a workdir that is no longer there.
    """
    def take() -> None:
        for lock in hold:
            lock.acquire()  # let go by its owner
        held.enter_context(WorkdirLock(workdir, purpose="training", hint=ONE_WRITER_HINT))
        on_disk = [int(p.name) for p in checkpoint_dir.iterdir() if p.name.isdigit()] \
            if checkpoint_dir.is_dir() else []
        if max(on_disk, default=None) != latest:
            raise UserError(f"{workdir} changed while this command checked it (another "
                            f"training saved step {max(on_disk)}); run the command again")

    on_process0(take, workdir)


def on_process0(check: Callable[[], None], workdir: Path) -> None:
    """Runs `check` (a workdir check that may raise UserError) on process 0 alone, and
    raises its UserError on every process, or on none: a process that stopped alone
    would leave the others waiting in a collective."""
    refusal = ""
    if jax.process_index() == 0:
        try:
            check()
        except UserError as e:
            refusal = str(e)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        refused = multihost_utils.broadcast_one_to_all(jax.numpy.int32(bool(refusal)))
        if refused and not refusal:
            refusal = f"process 0 could not take {workdir} (its error line says why)"
    if refusal:
        raise UserError(refusal)


def report_signal(name: str, step: int, on_disk: list[int], workdir: Path) -> None:
    """One line saying where a run stopped by `name` (SIGINT/SIGTERM) will resume;
    `on_disk` are the steps a resume will find (read back, not what was asked for)."""
    if step in on_disk:
        print(f"{name}: saved step {step} in {workdir}; run the same command to resume",
              file=sys.stderr, flush=True)
    else:
        newest = f"step {max(on_disk)}" if on_disk else "scratch"
        print(f"{name}: the checkpoint of step {step} did not reach {workdir / 'checkpoints'}; "
              f"a resume starts from {newest}", file=sys.stderr, flush=True)


def train_seeds(cfg, parent: str | Path, num_seeds: int, *,
                allow_config_change: tuple[str, ...] = (), together: bool = False) -> int:
    """`train` of seeds 0..num_seeds-1 of `cfg` (train.seed = k) into `<parent>/seed<k>/`,
    one after another, or all at once with `together` (their steps one vmapped program,
    training/together.py); a finished seed resumes to no work. Returns the first non-zero
    exit code (SIGINT/SIGTERM stop the remaining seeds), else 0."""
    if num_seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {num_seeds}")
    if (Path(parent) / CONFIG_JSON).is_file():
        raise UserError(f"{parent} holds a single training run (config.json); --seeds needs a "
                        "new --workdir or the parent of earlier --seeds runs")
    # The parent is held too (taken by the first seed's `train` once its checks passed):
    # a second --seeds run would train the same seeds, evaluate.py would summarize them.
    lock = WorkdirLock(parent, purpose="training --seeds", hint=(
        "one run has one writer: wait for it to end, or give another --workdir"))

    def run_seed(seed: int, slot: SeedSlot | None = None) -> int:
        seeded = copy.deepcopy(cfg)  # the caller's config stays as it was
        seeded.train.seed = seed
        print(f"attnmt: seed {seed + 1} of {num_seeds}", file=sys.stderr, flush=True)
        return train(seeded, seed_workdir(parent, seed), allow_config_change=allow_config_change,
                     hold=(lock,), slot=slot)

    try:
        if together:
            return train_together(run_seed, range(num_seeds))
        for seed in range(num_seeds):
            if code := run_seed(seed):
                return code
    finally:
        lock.release()
    return 0


# --------------------------------------------------------------------- command line

FLAGS = flags.FLAGS
_CONFIG: flags.FlagHolder | None = None  # --config, set by define_flags


def define_flags() -> None:
    """The command-line flags (only when run as a script, so importing `train` from
    tests or notebooks defines no global flags)."""
    global _CONFIG
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file "
                                              "(configs/*.py).", lock_config=True)
    flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it holds "
                        "checkpoints).")
    flags.DEFINE_list("allow_config_change", [], "Dotted config keys allowed to differ on "
                      "resume (besides the always-safe ones), e.g. model.dropout.")
    flags.DEFINE_integer("seeds", None, "Train seeds 0..N-1 (train.seed) into "
                         "<workdir>/seed<k>/, one after another.")
    flags.DEFINE_bool("together", False, "With --seeds: train the seeds at once, their steps "
                      "one program (parameters stacked on a seed axis); same workdirs.")


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present and not cli.debug_enabled():
        # orbax logs hundreds of INFO lines per run through absl; keep stderr for the
        # progress bar and one-line errors (--verbosity=0 or --debug show them).
        logging.set_verbosity(logging.WARNING)
        std_logging.getLogger("absl").setLevel(std_logging.CRITICAL)
    cfg = resolved.resolve_config(_CONFIG)
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    allowed = tuple(FLAGS.allow_config_change)
    if FLAGS.seeds is not None:
        sys.exit(train_seeds(cfg, FLAGS.workdir, FLAGS.seeds, allow_config_change=allowed,
                             together=FLAGS.together))
    if FLAGS.together:
        raise UserError("--together needs --seeds N")
    if seed_workdirs(FLAGS.workdir) and not (Path(FLAGS.workdir) / CONFIG_JSON).is_file():
        raise UserError(f"{FLAGS.workdir} holds --seeds runs (seed<k>/): add --seeds N, or "
                        "give another --workdir")
    sys.exit(train(cfg, FLAGS.workdir, allow_config_change=allowed))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
