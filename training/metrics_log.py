"""A run's metrics: `<workdir>/metrics.jsonl` (one JSON event per line) and TensorBoard
event files in `<workdir>/tensorboard/`; only process 0 writes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np
from tensorboardX import SummaryWriter

from common.files import write_atomic


class MetricsLog:
    """metrics.jsonl events `{"step", "split", "time", **values}` plus TensorBoard scalars
    (`<split>/<key>`) and images.

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
        self.jsonl.write(json.dumps({"step": step, "split": split, "time": time.time(),
                                     **values}) + "\n")
        self.jsonl.flush()
        for key, value in values.items():
            if isinstance(value, int | float):
                self.tb.add_scalar(f"{split}/{key}", value, step)
        self.tb.flush()

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        """image: uint8 [H, W, 3]."""
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
        write_atomic(path, "".join(keep))
