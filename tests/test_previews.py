"""Validation's previews drawn on a background thread (evaluation/previews.py) are the
ones drawn in line: the same PNG pixels, the same TensorBoard images, every job done by
`close`, and a job's error raised, not lost."""

import threading

import numpy as np
import pytest
from PIL import Image
from test_mapfile import make_maps

from attention.heatmaps import heatmap_figure, render, save_png
from evaluation.previews import PreviewDrawer


class RecordingLog:
    """MetricsLog's image interface, remembering each call and the thread it came from."""

    def __init__(self):
        self.images, self.threads = [], set()

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        self.images.append((tag, image, step))
        self.threads.add(threading.get_ident())


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def test_a_png_holds_the_pixels_of_its_one_drawing(tmp_path):
    maps = make_maps()
    path = save_png(heatmap_figure(maps, 1, "cross"), tmp_path / "a.png")
    np.testing.assert_array_equal(pixels(path), render(heatmap_figure(maps, 1, "cross")))


def test_background_previews_equal_the_ones_drawn_in_line(tmp_path):
    maps = make_maps()
    logs = {"inline": RecordingLog(), "background": RecordingLog()}
    for name, log in logs.items():
        drawer = PreviewDrawer(log, background=name == "background")
        for stem in ("valid_a", "valid_b"):  # two validations queued behind each other
            drawer.submit(maps, tmp_path / name, stem)
        drawer.close()
        drawer.raise_error()
    inline = sorted(p.name for p in (tmp_path / "inline").iterdir())
    assert inline == sorted(p.name for p in (tmp_path / "background").iterdir())
    assert len(inline) == 2 * 2 * maps.num_examples  # (mean, last layer) per example
    for name in inline:
        np.testing.assert_array_equal(pixels(tmp_path / "inline" / name),
                                      pixels(tmp_path / "background" / name))
    got, want = logs["background"].images, logs["inline"].images
    assert [(tag, step) for tag, _, step in got] == [(tag, step) for tag, _, step in want]
    assert [f"attention/{maps.decode}/example{i}" for i in range(maps.num_examples)] * 2 == [
        tag for tag, _, _ in want]
    for (_, a, _), (_, b, _) in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # The mean preview's PNG and its TensorBoard image are one drawing.
    np.testing.assert_array_equal(pixels(tmp_path / "inline" / "valid_a.ex0.cross.mean.mean.png"),
                                  want[0][1])
    assert logs["background"].threads.isdisjoint({threading.get_ident()})


def test_a_failed_drawing_is_raised_by_the_next_submit_and_after_close(tmp_path):
    maps = make_maps()
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the previews' folder should be")
    drawer = PreviewDrawer(RecordingLog())
    drawer.submit(maps, blocker, "valid")
    drawer.close()
    with pytest.raises(OSError):
        drawer.raise_error()

    drawer = PreviewDrawer(RecordingLog())
    drawer.submit(maps, blocker, "valid")
    drawer._jobs[0].exception()  # wait for it to fail
    with pytest.raises(OSError):
        drawer.submit(maps, tmp_path / "ok", "valid")
    drawer.close()
