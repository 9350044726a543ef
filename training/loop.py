"""The training loop's host-side bookkeeping: its state, when periodic work is due, when
to stop, and the checks a resume must pass. train.py reads these top to bottom."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

from common.errors import UserError
from data.tokenizer import tokenizer_fingerprint


@dataclasses.dataclass
class LoopState:
    """What the loop carries between steps besides the train state; saved as JSON in each
    checkpoint's "meta" item (training/checkpoint.py), so its field names are a file format."""

    epoch: int = 0  # data position to resume from: epoch ...
    batch_index: int = 0  # ... and batch within it
    best_bleu: float = -1.0  # best validation BLEU so far (-1: none yet) ...
    best_loss: float = -1.0  # ... lowest validation loss so far (-1: none yet) ...
    best_step: int = -1  # ... and the step of the best by train.patience_metric
    bad_evals: int = 0  # validations since that best one (train.patience)
    train_seconds: float = 0.0  # wall time spent training, over all sessions
    decay_start_seconds: float = -1.0  # train_seconds when warmup ended ("cosine_budget")
    data_sha256: str = ""  # fingerprints of the training pairs and tokenizer files ...
    tokenizer_sha256: str = ""
    # ... and of the plug-ins' input files, {name: SHA-256} (training/plugins.py)
    fingerprints: dict[str, str] = dataclasses.field(default_factory=dict)

    def record_validation(self, step: int, bleu: float | None, loss: float,
                          metric: str) -> None:
        """Takes in the validation at `step` (BLEU None when it did not decode): the best
        of each figure, and the best step and patience count by `metric` ("bleu" | "loss",
        train.patience_metric)."""
        bleu_gain = bleu is not None and bleu > self.best_bleu
        loss_gain = self.best_loss < 0 or loss < self.best_loss
        if bleu_gain:
            self.best_bleu = bleu
        if loss_gain:
            self.best_loss = loss
        if loss_gain if metric == "loss" else bleu_gain:
            self.best_step, self.bad_evals = step, 0
        else:
            self.bad_evals += 1

    @classmethod
    def from_meta(cls, meta: dict) -> LoopState:
        """From a checkpoint's meta item (keys a LoopState does not know are ignored; an
        input's fingerprint saved as its own field `<name>_sha256`, as before
        `fingerprints` held them, reads as fingerprints[name])."""
        known = {f.name for f in dataclasses.fields(cls)}
        loop = cls(**{k: v for k, v in meta.items() if k in known})
        for key, value in meta.items():
            if key not in known and key.endswith("_sha256") and value:
                loop.fingerprints.setdefault(key.removesuffix("_sha256"), value)
        return loop


def itstime(step: int, every: int, final: bool = False) -> bool:
    """Whether a periodic action (log, validate, save) is due after `step`: every `every`
    steps (0 = never), and always at the final step of the run."""
    return final or (every > 0 and step % every == 0)


def finished_reason(step: int, loop: LoopState, cfg_train) -> str:
    """Why a run at `step` with loop state `loop` has nothing left to train, or "" when it
    has: `train.num_steps` reached, its time budget (`train.max_minutes` of training) spent,
    or `train.patience` validations without a gain in `train.patience_metric`. The one
    reading of "finished" for the loop's stop, a resume of a finished run, and
    evaluate.py's check that seed runs are done."""
    if step >= cfg_train.num_steps:
        return f"train.num_steps ({cfg_train.num_steps}) reached"
    if cfg_train.max_minutes and loop.train_seconds > 60 * cfg_train.max_minutes:
        return "time budget"
    if cfg_train.patience and loop.bad_evals >= cfg_train.patience:
        metric = "loss" if cfg_train.get("patience_metric", "bleu") == "loss" else "BLEU"
        return f"no validation {metric} gain in {loop.bad_evals} evals"
    return ""


def expected_last_step(step: int, num_steps: int, max_minutes: float, train_seconds: float,
                       seconds_per_step: float) -> int:
    """The step a run will stop at: `num_steps`, or earlier when the time budget
    (`max_minutes` of training, 0 = none) runs out at `seconds_per_step`. For the progress
    bar, so that its total and ETA tell the truth under a time budget."""
    if not max_minutes or seconds_per_step <= 0:
        return num_steps
    left = max(0.0, 60 * max_minutes - train_seconds)
    return min(num_steps, step + int(left / seconds_per_step) + 1)


class StopRequest:
    """SIGINT/SIGTERM set `signum`; the loop saves a checkpoint after the current step and
    exits with 128 + signum. A second signal interrupts at once. `restore()` puts the
    previous handlers back (train() called from a notebook leaves Ctrl-C as it was)."""

    def __init__(self):
        self.signum = 0
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame):
        if self.signum:
            raise KeyboardInterrupt
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


def check_resume_inputs(loop: LoopState, step: int, workdir: Path, data_sha256: str,
                        fingerprints: dict[str, str] | None = None) -> None:
    """Refuse a checkpoint whose training data, plug-in inputs (`fingerprints`, {name:
    SHA-256}) or tokenizer differ from what this run has (the config can be unchanged
    while a file was edited or tokenizer/ replaced). A fingerprint the checkpoint lacks
    (saved before it existed) is not checked."""
    if loop.data_sha256 and loop.data_sha256 != data_sha256:
        raise UserError(f"the training data differ from those checkpoint step {step} in {workdir} "
                        "was trained on (same config, other file contents); use a new --workdir")
    for name, saved in loop.fingerprints.items():
        if saved and saved != (fingerprints or {}).get(name, ""):
            raise UserError(f"the {name} file differs from the one checkpoint step {step} in "
                            f"{workdir} was trained with (same config, other contents, or none); "
                            "put the original file back or use a new --workdir")
    tokenizer_dir = workdir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise UserError(f"{tokenizer_dir} is missing or incomplete; checkpoint step {step} needs "
                        "the tokenizer it was trained with")
    if loop.tokenizer_sha256 and loop.tokenizer_sha256 != tokenizer_fingerprint(tokenizer_dir):
        raise UserError(f"the tokenizer in {tokenizer_dir} is not the one checkpoint step {step} "
                        "was trained with (its vocabulary files changed); put the original back "
                        "or use a new --workdir")
