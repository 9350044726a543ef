"""Validation's attention previews, drawn beside training rather than in its way.

Drawing a validation's PNG previews is pure host work: about a second a figure on a CPU
core, 16 figures for the recipes' 4 examples. On a thread of the training process that
work holds Python's GIL, which the loop needs to dispatch each step: behind a drawing, a
fast accelerator's steps waited on the host (bench/previews.py, `loop_*`). So
`PreviewDrawer` hands each map file to one drawing process (evaluation/preview_worker.py:
no JAX, no trainer state), in the order validations submit them, while the loop trains
on. The map file is written before `submit`, and nothing a later step reads depends on
the drawing; the TensorBoard images are the PNGs read back (PNG is lossless: the same
pixels), logged by a thread that only waits on the worker's replies.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image

from attention.heatmaps import preview_images, write_previews
from attention.mapfile import AttentionMaps
from training.metrics_log import MetricsLog

REPO = Path(__file__).resolve().parents[1]


def log_mean_image(log: MetricsLog, maps_decode: str, example: int, pixels: np.ndarray,
                   step: int) -> None:
    """An example's all-layer preview as the TensorBoard image `attention/<decode>/example<I>`."""
    log.image(f"attention/{maps_decode}/example{example}", pixels, step)


def draw_previews(maps: AttentionMaps, map_file: Path, log: MetricsLog) -> None:
    """Each example's previews (`attention.heatmaps.preview_images`) as PNGs beside
    `map_file`, named after its stem, and the all-layer mean of each logged to TensorBoard."""
    images = preview_images(maps)  # drawn once: the PNGs and TensorBoard's images
    write_previews(images, map_file.parent, map_file.stem)
    for (example, layer), pixels in images.items():
        if layer == "mean":
            log_mean_image(log, maps.decode, example, pixels, maps.step)


def _worker_error(reply: dict) -> Exception:
    """The exception a failed job's reply stands for: an OSError on a path as such (the
    command line words it in one line), anything else a RuntimeError naming the map file."""
    if reply.get("errno") is not None:
        return OSError(reply["errno"], reply["strerror"], reply["filename"])
    return RuntimeError(f"drawing the previews of {reply['map_file']} failed: {reply['error']}")


class PreviewDrawer:
    """`draw_previews` in one drawing process, jobs in submission order.

    The process starts at the first `submit`. With `background=False` each job runs
    inside `submit` (evaluate-style callers, tests). A job's error is raised by the next
    `submit` or by `raise_error` after `close`.
    """

    def __init__(self, log: MetricsLog, background: bool = True):
        self.log, self.background = log, background
        self.error: BaseException | None = None
        self._worker: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._pending: list[str] = []  # map files sent, not yet answered
        self._lock = threading.Lock()

    def submit(self, maps: AttentionMaps, map_file: Path) -> None:
        """Draws the previews of `maps`, already saved as `map_file` (the worker reads it)."""
        self.raise_error()
        if not self.background:
            draw_previews(maps, Path(map_file), self.log)
            return
        if self._worker is None:
            self._start()
        with self._lock:
            self._pending.append(str(map_file))
        try:
            self._worker.stdin.write(json.dumps({"map_file": str(map_file)}) + "\n")
            self._worker.stdin.flush()
        except BrokenPipeError:
            self._fail(RuntimeError(f"the preview drawing process exited (code "
                                    f"{self._worker.wait()}) before drawing {map_file}"))
            self.raise_error()

    def close(self) -> None:
        """Waits for every job (before the metrics log closes); never raises, so that it
        can sit in a `finally` among other clean-ups: call `raise_error` after."""
        if self._worker is None:
            return
        with contextlib.suppress(BrokenPipeError):  # a worker that died: reported below
            self._worker.stdin.close()
        self._reader.join()
        code = self._worker.wait()
        if self._pending:
            self._fail(RuntimeError(f"the preview drawing process exited (code {code}) "
                                    f"before drawing {', '.join(self._pending)}"))

    @property
    def pending(self) -> int:
        """Jobs submitted to the drawing process and not yet answered."""
        with self._lock:
            return len(self._pending)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self._worker = subprocess.Popen(
            [sys.executable, "-m", "evaluation.preview_worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, encoding="utf-8", env=env,
            # Its own process group: Ctrl-C (or a signal to the trainer's group) asks the
            # trainer to save and stop, and the previews already queued are still drawn.
            start_new_session=True)
        self._reader = threading.Thread(target=self._read, args=(self._worker.stdout,),
                                        name="previews", daemon=True)
        self._reader.start()

    def _read(self, replies: IO[str]) -> None:
        """The reader thread: each reply logged (its TensorBoard images) or kept as the error."""
        for line in replies:
            reply = json.loads(line)
            with self._lock:
                self._pending.remove(reply["map_file"])
            if "error" in reply:
                self._fail(_worker_error(reply))
                continue
            try:
                for example, png in reply["means"]:
                    with Image.open(png) as image:
                        pixels = np.asarray(image.convert("RGB"))
                    log_mean_image(self.log, reply["decode"], example, pixels, reply["step"])
            except OSError as error:
                self._fail(error)

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
