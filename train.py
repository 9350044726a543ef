"""Train an encoder-decoder Transformer from a config (SPEC §1 journey 1).

    python train.py --config configs/multi30k_de_en.py --workdir runs/de_en \
        [--config.model.num_encoder_layers=4 ...]

Running the same command again resumes from the last checkpoint: step, parameters,
optimizer, data position and dropout keys continue exactly where they stopped.
Writes `<workdir>/{config.json, tokenizer/, checkpoints/, metrics.jsonl,
tensorboard/, attention/}` (SPEC §4.2).

Reliability (SPEC §7):
  * Killed at any moment (SIGKILL, power loss of the process), the same command
    resumes from the last complete checkpoint and ends with the same parameters as an
    uninterrupted run. Orbax renames a checkpoint into place only when it is complete;
    leftover temporary directories are deleted when training restarts. On resume,
    metrics.jsonl loses the events after the restored step (they are logged again, so
    no step appears twice; rewritten atomically) and TensorBoard hides them
    (`purge_step`). Attention maps of those steps are rewritten with identical content.
  * SIGINT / SIGTERM: the current step finishes, a checkpoint is saved, and the run
    exits with 130 / 143 and one line saying where it stopped.
  * A non-finite loss or gradient never reaches the parameters (the jitted step skips
    that update and records the step); the loop stops at its next log, eval or
    checkpoint with an error naming the step, saving nothing, so the newest checkpoint
    is the last good one.
  * Resume guard: before anything is written, the config is compared with
    `<workdir>/config.json`, and the training data and tokenizer with fingerprints
    saved in the checkpoint. Keys in SAFE_ON_RESUME may change freely, LOCKED_ON_RESUME
    keys (model shape, vocabulary, data) never, others with --allow_config_change.
  * User errors (bad config, corpus, checkpoint, ...) are one `error: ...` line on
    stderr, exit status 2, files untouched; --debug shows the traceback (and the
    orbax log, which --verbosity=0 shows too).
"""

from __future__ import annotations

import hashlib
import json
import logging as std_logging
import math
import os
import signal
import sys
import time
from pathlib import Path

import jax
import numpy as np
import sacrebleu
from absl import flags, logging
from flax import nnx
from ml_collections import config_flags
from tensorboardX import SummaryWriter
from tqdm import tqdm

from attention.mapfile import save_maps
from attention.plotting import heatmap_image_array, preview_pngs
from configs import base, cli
from configs.cli import config_diff, load_config_json, write_config_json
from configs.errors import UserError
from data.batching import TrainBatcher, eval_batches, prefetch
from data.corpora import load_corpus
from data.packing import pack_batch
from data.tokenizer import encode_for_training, load_or_train_tokenizer
from models import checkpoint as ckpt
from models.timing import CompileTimer
from models.training import (
    build_model,
    build_optimizer,
    init_train_state,
    learning_rate_schedule,
    make_eval_step,
    make_mesh,
    make_train_step,
    replicate,
    shard_batch,
)
from models.translate import record_maps, translate_ids

FLAGS = flags.FLAGS
_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                          lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it holds checkpoints).")
flags.DEFINE_list("allow_config_change", [], "Dotted config keys allowed to differ on resume "
                  "(besides the always-safe ones), e.g. model.dropout.")

# Changing these on resume cannot make the checkpoint inconsistent.
SAFE_ON_RESUME = ("train.num_steps", "train.log_every_steps", "train.patience", "train.max_minutes",
                  "eval.", "checkpoint.every_steps", "checkpoint.keep", "attention_maps.")
# These define the parameter shapes, the vocabulary or the training data (and its batching):
# a checkpoint cannot continue under other values, --allow_config_change or not ...
LOCKED_ON_RESUME = ("data.", "model.")
# ... except these, which only move files, name evaluation files or change computation.
UNLOCKABLE = ("data.data_dir", "data.hf_cache_dir", "data.pack_length", "data.valid_source",
              "data.valid_target",
              "data.test_source", "data.test_target", "model.dropout", "model.attention_dropout",
              "model.attention_impl", "model.embedding_grad", "model.dtype")


class MetricsLog:
    """metrics.jsonl (SPEC §4.3) plus TensorBoard scalars/images; only process 0 writes.

    Opened at `step` (the restored one, 0 when starting): events after it, left by a run
    that was killed before its next checkpoint, are dropped from metrics.jsonl and hidden
    from TensorBoard, since this run logs those steps again.
    """

    def __init__(self, workdir: Path, step: int):
        self.enabled = jax.process_index() == 0
        if self.enabled:
            trim_metrics(workdir / "metrics.jsonl", step)
            tb_dir = workdir / "tensorboard"
            self.jsonl = open(workdir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
            self.tb = SummaryWriter(str(tb_dir), purge_step=step + 1 if tb_dir.is_dir() else None)

    def write(self, step: int, split: str, **values) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, "split": split, "time": time.time(), **values}) + "\n")
        self.jsonl.flush()
        for key, value in values.items():
            if isinstance(value, int | float):
                self.tb.add_scalar(f"{split}/{key}", value, step)
        self.tb.flush()

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        if self.enabled:
            self.tb.add_image(tag, image, step, dataformats="HWC")

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            self.tb.close()


def trim_metrics(path: Path, step: int) -> None:
    """Drop events after `step` and any line cut off by a kill; atomic, no-op if nothing to drop."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    keep = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and isinstance(event.get("step"), int) and event["step"] <= step:
            keep.append(line.rstrip("\n") + "\n")
    if keep != lines:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(keep), encoding="utf-8")
        os.replace(tmp, path)


def check_resume_config(cfg, workdir: Path) -> None:
    """Refuse to resume under a config that changed the model, data or vocabulary."""
    saved = load_config_json(workdir)
    allowed = tuple(FLAGS.allow_config_change)
    # A field added to configs/base.py after the run started is no change while it holds
    # its default (the default keeps what the code did before the field existed).
    saved_keys, defaults = cli.flatten_config(saved), cli.flatten_config(base.get_config())
    diff = [(k, old, new) for k, old, new in config_diff(saved, cfg)
            if not k.startswith(SAFE_ON_RESUME)
            and not (k not in saved_keys and k in defaults and new == defaults[k])]
    locked = [d for d in diff if d[0].startswith(LOCKED_ON_RESUME) and d[0] not in UNLOCKABLE]
    unsafe = [d for d in diff if d not in locked and d[0] not in allowed]

    def fields(items):
        return "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in items)

    if locked:
        raise UserError(f"config differs from the checkpointed run in {workdir} in fields that "
                        f"fix the model shape, vocabulary or data ({fields(locked)}); they cannot "
                        "change on resume: use a new --workdir")
    if unsafe:
        raise UserError(f"config differs from the checkpointed run in {workdir} ({fields(unsafe)}); "
                        "use a new --workdir, or --allow_config_change="
                        f"{','.join(k for k, _, _ in unsafe)} to continue with the new values")


def corpus_fingerprint(sources: list[str], targets: list[str]) -> str:
    """SHA-256 of the training pairs as loaded (after filtering and max_train_sentences)."""
    digest = hashlib.sha256()
    for side in (sources, targets):
        for line in side:
            digest.update(line.encode("utf-8") + b"\n")
        digest.update(b"\0")
    return digest.hexdigest()


def tokenizer_fingerprint(directory: Path) -> str:
    """SHA-256 of the SentencePiece model file(s) in `directory`."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.model")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def check_resume_inputs(meta: dict, step: int, workdir: Path, data_digest: str) -> None:
    """Refuse a checkpoint whose training data or tokenizer differ from what this run has
    (the config can be unchanged while a file was edited or tokenizer/ replaced)."""
    saved = meta.get("data_sha256")
    if saved and saved != data_digest:
        raise UserError(f"the training data differ from those checkpoint step {step} in {workdir} "
                        "was trained on (same config, other file contents); use a new --workdir")
    tokenizer_dir = workdir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise UserError(f"{tokenizer_dir} is missing or incomplete; checkpoint step {step} needs "
                        "the tokenizer it was trained with")
    saved = meta.get("tokenizer_sha256")
    if saved and saved != tokenizer_fingerprint(tokenizer_dir):
        raise UserError(f"the tokenizer in {tokenizer_dir} is not the one checkpoint step {step} was "
                        "trained with (its vocabulary files changed); put the original back or use "
                        "a new --workdir")


def packed(batches, length: int, rows_multiple: int):
    """(epoch, index, batch) with each batch's pairs packed into rows (data/packing.py);
    unchanged when `length` is 0. Runs in the prefetch thread, off the training step."""
    for epoch, index, batch in batches:
        yield epoch, index, (pack_batch(batch, length, rows_multiple) if length else batch)


class StopRequest:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint at the next step and exits."""

    def __init__(self):
        self.signum = 0
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        if self.signum:  # second signal: give up at once
            raise KeyboardInterrupt
        self.signum = signum


def save_validation_maps(cfg, model, tokenizer, valid, step: int, out_dir: Path):
    """Maps of the first `attention_maps.num_examples` validation sentences, teacher-forced on
    the reference and under the configured decoder; yields (tag, RGB image) for TensorBoard."""
    n = cfg.attention_maps.num_examples
    src_ids = tokenizer.encode_source(valid[0][:n])
    tgt_ids = tokenizer.encode_target(valid[1][:n])
    out_dir.mkdir(parents=True, exist_ok=True)
    for targets in (tgt_ids, None):
        maps = record_maps(model, tokenizer, src_ids, targets, beam_size=cfg.eval.beam_size,
                           length_penalty=cfg.eval.length_penalty, step=step)
        stem = f"valid_step{step:07d}_{maps.decode}"
        save_maps(out_dir / f"{stem}.npz", maps)
        preview_pngs(maps, out_dir, stem)
        for example in range(maps.num_examples):
            yield f"attention/{maps.decode}/example{example}", heatmap_image_array(maps, example)


def validate(cfg, graphdef, params, tokenizer, valid, eval_step, step, log, workdir) -> float:
    """Validation loss, BLEU of the configured decoder and attention maps; returns BLEU."""
    sources, targets = valid
    if cfg.eval.max_sentences:
        sources, targets = sources[: cfg.eval.max_sentences], targets[: cfg.eval.max_sentences]
    src_ids = tokenizer.encode_source(sources)
    totals = {"loss_sum": 0.0, "nll_sum": 0.0, "tokens": 0.0}
    for batch, _ in eval_batches(src_ids, tokenizer.encode_target(targets),
                                 batch_size=cfg.eval.batch_size, bucket_step=cfg.data.bucket_step):
        batch.pop("num_tokens")
        for key, value in eval_step(params, batch).items():
            totals[key] += float(value)
    tokens = max(totals["tokens"], 1.0)
    model = nnx.merge(graphdef, params)
    hyp_ids = translate_ids(model, src_ids, beam_size=cfg.eval.beam_size,
                            length_penalty=cfg.eval.length_penalty, batch_size=cfg.eval.batch_size,
                            bucket_step=cfg.data.bucket_step)
    hyps = tokenizer.decode_target(hyp_ids)
    bleu = sacrebleu.corpus_bleu(hyps, [list(targets)])
    decode = "greedy" if cfg.eval.beam_size == 1 else "beam"
    log.write(step, "valid", loss=totals["loss_sum"] / tokens, nll=totals["nll_sum"] / tokens,
              ppl=float(np.exp(totals["nll_sum"] / tokens)), bleu=bleu.score, decode=decode,
              num_sentences=len(sources))
    if cfg.attention_maps.enabled and cfg.attention_maps.num_examples > 0 and jax.process_index() == 0:
        for tag, image in save_validation_maps(cfg, model, tokenizer, valid, step, workdir / "attention"):
            log.image(tag, image, step)
    return bleu.score


def enable_compilation_cache() -> None:
    """Reuse compiled XLA programs across runs (resume, evaluate): seconds instead of minutes."""
    default = Path.home() / ".cache" / "attnmt" / "xla"
    jax.config.update("jax_compilation_cache_dir", os.environ.get("JAX_COMPILATION_CACHE_DIR", str(default)))


def train(cfg, workdir: Path) -> int:
    """Run (or resume) training; returns the process exit code."""
    enable_compilation_cache()
    if "JAX_COORDINATOR_ADDRESS" in os.environ:  # multi-host launch
        jax.distributed.initialize()
    # Every check runs before anything is written; checkpoints are read through a
    # read-only manager until the restore has succeeded.
    checkpoint_dir = workdir / "checkpoints"
    reader = ckpt.make_manager(checkpoint_dir, cfg.checkpoint.keep, read_only=True) \
        if checkpoint_dir.is_dir() else None
    latest = reader.latest_step() if reader is not None else None
    if latest is not None:
        check_resume_config(cfg, workdir)

    train_src, train_tgt = load_corpus(cfg.data, "train")
    valid = load_corpus(cfg.data, "valid")
    data_digest = corpus_fingerprint(train_src, train_tgt)
    if latest is not None:
        check_resume_inputs(ckpt.restore_meta(reader, latest), latest, workdir, data_digest)
    tokenizer = load_or_train_tokenizer(workdir / "tokenizer", cfg.data, train_src, train_tgt)
    src_ids, tgt_ids, dropped = encode_for_training(tokenizer, train_src, train_tgt,
                                                    cfg.data.max_length, cfg.data.long_pairs)
    mesh = make_mesh()
    batcher = TrainBatcher(src_ids, tgt_ids, cfg.train.batch_tokens, cfg.data.max_length,
                           bucket_step=cfg.data.bucket_step, batch_multiple=mesh.size,
                           seed=cfg.train.seed)

    model = build_model(cfg, tokenizer.source_vocab_size, tokenizer.target_vocab_size, cfg.train.seed)
    graphdef = nnx.graphdef(model)
    optimizer = build_optimizer(cfg.train)
    schedule = learning_rate_schedule(cfg.train)
    state = replicate(init_train_state(model, optimizer), mesh)
    meta = {"epoch": 0, "batch_index": 0, "best_bleu": -1.0, "best_step": -1, "bad_evals": 0,
            "train_seconds": 0.0}
    if latest is not None:
        state, meta = ckpt.restore(reader, latest, ckpt.abstract_of(state))
    if reader is not None:
        reader.close()
    meta.update(data_sha256=data_digest,
                tokenizer_sha256=tokenizer_fingerprint(workdir / "tokenizer"))
    step = int(state["step"])

    # Inputs are good: from here on the workdir is written.
    manager = ckpt.make_manager(checkpoint_dir, cfg.checkpoint.keep)  # drops half-written saves
    if jax.process_index() == 0:
        write_config_json(cfg, workdir)
        for stale in (workdir / "attention").glob(".*.tmp*"):  # a map file cut off by a kill
            stale.unlink(missing_ok=True)
    log = MetricsLog(workdir, step)
    params_count = sum(x.size for x in jax.tree.leaves(state["params"]))
    print(f"attnmt: {len(src_ids)} training pairs ({dropped} too long, dropped), "
          f"{params_count / 1e6:.2f}M parameters, {jax.device_count()} device(s), "
          f"{'resuming from step ' + str(step) if latest is not None else 'starting'} in {workdir}",
          file=sys.stderr)

    train_step = make_train_step(graphdef, optimizer, cfg.train)
    eval_step = make_eval_step(graphdef, cfg.train.label_smoothing)
    stop = StopRequest()
    batches = prefetch(packed(batcher.iterate(meta["epoch"], meta["batch_index"]),
                              cfg.data.pack_length, math.lcm(8, mesh.size)))
    progress = tqdm(total=cfg.train.num_steps, initial=step, dynamic_ncols=True,
                    disable=jax.process_index() != 0, desc="train", mininterval=5)
    pending, window_start, window_tokens = [], time.time(), 0
    session_start, trained_before = time.time(), meta["train_seconds"]
    exit_code = 0
    compile_timer = CompileTimer().start()  # XLA compilation (or cache loads) of this run

    def save_checkpoint(bleu: float | None = None) -> None:
        meta["train_seconds"] = trained_before + time.time() - session_start
        ckpt.save(manager, step, state, dict(meta), bleu)

    def check_finite() -> None:
        bad = int(state["nonfinite_step"])
        if bad >= 0:
            manager.wait_until_finished()
            good = manager.latest_step()
            kept = f"last good checkpoint: step {good}" if good is not None else "no checkpoint yet"
            raise UserError(f"non-finite loss or gradient at step {bad + 1}; stopped without "
                            f"saving ({kept}); lower train.learning_rate and resume with "
                            "--allow_config_change=train.learning_rate, or use a new --workdir")

    try:
        while step < cfg.train.num_steps:
            epoch, index, batch = next(batches)
            window_tokens += batch.pop("num_tokens")
            state, metrics = train_step(state, shard_batch(batch, mesh))
            step += 1
            meta["epoch"], meta["batch_index"] = batcher.position(step)  # where to resume
            pending.append(metrics)
            progress.update(1)
            out_of_time = cfg.train.max_minutes and (
                trained_before + time.time() - session_start > 60 * cfg.train.max_minutes)
            last = step == cfg.train.num_steps or out_of_time or stop.signum
            if step % cfg.train.log_every_steps == 0 or last:
                check_finite()
                sums = jax.device_get(pending)
                loss = sum(m["loss_sum"] for m in sums) / max(sum(m["tokens"] for m in sums), 1.0)
                tokens_per_sec = window_tokens / max(time.time() - window_start, 1e-9)
                lr = float(schedule(step - 1))
                log.write(step, "train", loss=float(loss), learning_rate=lr,
                          tokens_per_sec=tokens_per_sec, grad_norm=float(sums[-1]["grad_norm"]),
                          epoch=epoch, compile_seconds=compile_timer.seconds)
                progress.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_sec:.0f}")
                pending, window_start, window_tokens = [], time.time(), 0
            bleu = None
            if step % cfg.eval.every_steps == 0 or (last and not stop.signum):
                check_finite()
                bleu = validate(cfg, graphdef, state["params"], tokenizer, valid, eval_step, step,
                                log, workdir)
                if bleu > meta["best_bleu"]:
                    meta.update(best_bleu=bleu, best_step=step, bad_evals=0)
                else:
                    meta["bad_evals"] += 1
                progress.write(f"step {step}: valid BLEU {bleu:.2f} (best {meta['best_bleu']:.2f} "
                               f"at step {meta['best_step']})")
            patience_over = cfg.train.patience and meta["bad_evals"] >= cfg.train.patience
            if step % cfg.checkpoint.every_steps == 0 or last or bleu is not None or patience_over:
                check_finite()
                save_checkpoint(bleu)
            if stop.signum:
                exit_code = 128 + stop.signum
                break
            if patience_over or out_of_time:
                why = "no BLEU gain in {} evals".format(meta["bad_evals"]) if patience_over else "time budget"
                progress.write(f"stopping at step {step}: {why}")
                break
    finally:
        manager.wait_until_finished()
        progress.close()
        log.close()
        compile_timer.stop()
    print(f"attnmt: {compile_timer.seconds:.1f} s of this session went to compiling "
          "(train, eval and decoding programs)", file=sys.stderr)
    if exit_code:  # stopped by a signal; printed last, after the progress bar's final line
        name = "SIGINT" if stop.signum == signal.SIGINT else "SIGTERM"
        on_disk = manager.all_steps(read=True)  # what a resume will find, not what was asked
        if step in on_disk:
            print(f"{name}: saved step {step} in {workdir}; run the same command to resume",
                  file=sys.stderr, flush=True)
        else:
            newest = max(on_disk) if on_disk else None
            print(f"{name}: the checkpoint of step {step} did not reach {workdir / 'checkpoints'}; "
                  f"a resume starts from {f'step {newest}' if newest is not None else 'scratch'}",
                  file=sys.stderr, flush=True)
    return exit_code


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present and not cli.debug_enabled():
        # orbax logs hundreds of INFO lines per run through absl; keep stderr for the
        # progress bar and one-line errors (--verbosity=0 or --debug show them).
        logging.set_verbosity(logging.WARNING)
        std_logging.getLogger("absl").setLevel(std_logging.CRITICAL)
    cfg = cli.resolve_config(_CONFIG)
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    sys.exit(train(cfg, Path(FLAGS.workdir)))


if __name__ == "__main__":
    cli.run(main)
