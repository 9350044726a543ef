"""Validation's attention previews, drawn beside training rather than in its way.

Drawing a validation's PNG previews is pure host work: about a second a figure on a CPU
core, 16 figures for the recipes' 4 examples, seconds during which the accelerator would
wait. `PreviewDrawer` draws them on one background thread, in the order validations
submit them, while the loop trains on; the map file itself is written before `submit`
returns, so nothing a later step reads depends on the drawing.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from attention.heatmaps import preview_images, write_previews
from attention.mapfile import AttentionMaps
from training.metrics_log import MetricsLog


def draw_previews(maps: AttentionMaps, out_dir: Path, stem: str, log: MetricsLog) -> None:
    """Each example's previews (`attention.heatmaps.preview_images`) as PNGs in `out_dir`,
    and the all-layer mean of each as a TensorBoard image `attention/<decode>/example<I>`."""
    images = preview_images(maps)  # drawn once: the PNGs and TensorBoard's images
    write_previews(images, out_dir, stem)
    for (example, layer), pixels in images.items():
        if layer == "mean":
            log.image(f"attention/{maps.decode}/example{example}", pixels, maps.step)


class PreviewDrawer:
    """`draw_previews` on one background thread, jobs in submission order.

    With `background=False` each job runs inside `submit` (evaluate-style callers, tests).
    A job's error is raised by the next `submit` or by `raise_error` after `close`.
    """

    def __init__(self, log: MetricsLog, background: bool = True):
        self.log = log
        self._pool = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="previews")
                      if background else None)
        self._jobs: list[concurrent.futures.Future] = []
        self.error: BaseException | None = None

    def submit(self, maps: AttentionMaps, out_dir: Path, stem: str) -> None:
        self._collect(wait=False)
        self.raise_error()
        if self._pool is None:
            draw_previews(maps, out_dir, stem, self.log)
        else:
            self._jobs.append(self._pool.submit(draw_previews, maps, out_dir, stem, self.log))

    def close(self) -> None:
        """Waits for every job (before the metrics log closes); never raises, so that it
        can sit in a `finally` among other clean-ups: call `raise_error` after."""
        self._collect(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _collect(self, wait: bool) -> None:
        pending = []
        for job in self._jobs:
            if wait or job.done():
                if (error := job.exception()) is not None and self.error is None:
                    self.error = error
            else:
                pending.append(job)
        self._jobs = pending
