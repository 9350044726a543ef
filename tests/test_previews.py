"""Validation's previews drawn by the drawing process (evaluation/previews.py,
evaluation/preview_worker.py) are the ones drawn in line: the same PNG pixels, the same
TensorBoard images, every job done by `close`, and a job's error raised, not lost."""

import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_script
from PIL import Image
from test_mapfile import make_maps

from attention.heatmaps import heatmap_figure, render, save_png
from attention.mapfile import save_maps
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


def save(maps, folder, stem):
    folder.mkdir(exist_ok=True)
    return save_maps(folder / f"{stem}.npz", maps)


def test_background_previews_equal_the_ones_drawn_in_line(tmp_path):
    maps = make_maps()
    logs = {"inline": RecordingLog(), "background": RecordingLog()}
    for name, log in logs.items():
        drawer = PreviewDrawer(log, background=name == "background")
        for stem in ("valid_a", "valid_b"):  # two validations queued behind each other
            drawer.submit(maps, save(maps, tmp_path / name, stem))
        drawer.close()
        drawer.raise_error()
    inline = sorted(p.name for p in (tmp_path / "inline").glob("*.png"))
    assert inline == sorted(p.name for p in (tmp_path / "background").glob("*.png"))
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


def test_the_drawing_is_another_process_that_never_imports_jax(tmp_path):
    drawer = PreviewDrawer(RecordingLog())
    drawer.submit(make_maps(), save(make_maps(), tmp_path, "valid"))
    worker = drawer._worker.pid
    assert worker != os.getpid()
    modules = subprocess.run(
        [sys.executable, "-c", "import sys, evaluation.preview_worker; "
         "print('jax' in sys.modules, 'flax' in sys.modules)"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    assert modules.stdout.split() == ["False", "False"]
    drawer.close()
    drawer.raise_error()


def test_a_signal_to_the_trainers_process_group_leaves_queued_previews_drawn(tmp_path):
    """Ctrl-C goes to the terminal's process group: the worker is in a group of its own,
    or the trainer's clean stop (save, then exit 130) would end in the previews' error."""
    maps = make_maps()
    drawer = PreviewDrawer(RecordingLog())
    drawer.submit(maps, save(maps, tmp_path, "valid"))
    assert os.getpgid(drawer._worker.pid) != os.getpgid(0)
    drawer.close()
    drawer.raise_error()
    assert len(list(tmp_path.glob("valid.*.png"))) == 2 * maps.num_examples


def wait_for_error(drawer, seconds=60.0):
    end = time.monotonic() + seconds
    while drawer.error is None and time.monotonic() < end:
        time.sleep(0.05)


def test_a_failed_drawing_is_raised_by_the_next_submit_and_after_close(tmp_path):
    maps = make_maps()
    map_file = save(maps, tmp_path, "valid")
    blocker = tmp_path / "valid.ex0.cross.mean.mean.png"
    blocker.mkdir()  # a folder where a preview should be written
    drawer = PreviewDrawer(RecordingLog())
    drawer.submit(maps, map_file)
    drawer.close()
    with pytest.raises(OSError) as raised:
        drawer.raise_error()
    assert raised.value.errno is not None and "valid.ex0.cross.mean.mean" in str(raised.value)

    drawer = PreviewDrawer(RecordingLog())
    drawer.submit(maps, map_file)
    wait_for_error(drawer)
    with pytest.raises(OSError):
        drawer.submit(maps, save(maps, tmp_path, "other"))
    drawer.close()


def test_a_worker_that_dies_is_an_error_naming_the_undrawn_map(tmp_path):
    maps = make_maps()
    drawer = PreviewDrawer(RecordingLog())
    drawer.submit(maps, save(maps, tmp_path, "valid_a"))
    drawer._worker.kill()
    drawer._worker.wait()
    with pytest.raises(RuntimeError, match="exited"):
        for stem in ("valid_b", "valid_c"):  # the pipe may take one line before it breaks
            drawer.submit(maps, save(maps, tmp_path, stem))
        drawer.close()
        drawer.raise_error()


def image_tags(tensorboard_dir: Path) -> set[tuple[str, int]]:
    """(tag, step) of every image summary in the folder's event files (TFRecord framing:
    an 8-byte length, its 4-byte CRC, the record, the record's 4-byte CRC)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in tensorboard_dir.glob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 16 + length
            tags |= {(v.tag, event.step) for v in event.summary.value if v.HasField("image")}
    return tags


def test_training_draws_each_validations_previews(tmp_path):
    """train.py with `attention_maps.previews` draws the PNGs of every map file it saves
    and logs their means to TensorBoard (the smoke config alone saves the maps:
    tests/test_train.py)."""
    workdir = tmp_path / "run"
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                        "--config.train.num_steps=20", "--config.attention_maps.previews=True")
    assert result.returncode == 0, result.stderr[-3000:]
    stems = sorted(p.stem for p in (workdir / "attention").glob("*.npz"))
    assert stems == ["valid_step0000020_greedy", "valid_step0000020_teacher_forced"]
    pngs = sorted(p.name for p in (workdir / "attention").glob("*.png"))
    assert pngs == sorted(f"{stem}.ex0.cross.{layer}.mean.png" for stem in stems
                          for layer in ("0", "mean"))
    assert image_tags(workdir / "tensorboard") == {("attention/greedy/example0", 20),
                                                   ("attention/teacher_forced/example0", 20)}
