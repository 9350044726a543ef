"""What validation's attention previews cost the training thread (evaluation/previews.py).

    python -m bench.previews [--examples 4] [--source 22] [--target 20] [--layers 4]
        [--heads 4] [--repeat 3] [--json OUT]

One validation's maps of `--examples` sentences (random attention rows of the given
lengths and shape: the previews' cost depends on the tokens drawn, not on the weights),
their previews drawn three ways, each `--repeat` times (the median is reported):

  * `savefig_s`: each preview saved with matplotlib's `Figure.savefig` and the all-layer
    mean drawn a second time for TensorBoard, as validation drew them before
    `attention.heatmaps.render` (savefig lays a constrained figure out and draws it again);
  * `inline_s`: `PreviewDrawer(background=False).submit`: each figure drawn once, its pixels
    written as the PNG and logged to TensorBoard, on the training thread;
  * `background_held_s`: `PreviewDrawer().submit`, the time the training thread is held
    (the drawing itself runs on the drawer's thread; `background_drain_s` is the wait for
    it at `close`).

The defaults are the recipes' validation maps (4 examples, Transformer-tiny: 4 decoder
layers, 4 heads) at Multi30k's typical sentence lengths in subword tokens.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("examples", 4), ("source", 22), ("target", 20), ("layers", 4),
                          ("heads", 4), ("repeat", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if min(args.examples, args.source, args.target, args.layers, args.heads, args.repeat) < 1:
        parser.error("every size must be at least 1")
    return args


def random_maps(args: argparse.Namespace):
    """AttentionMaps of `args.examples` sentences, every row a random distribution over
    its valid keys: encoder_self [N, L, H, S, S], decoder_self [N, L, H, T, T] (causal),
    cross [N, L, H, T, S]."""
    from attention.mapfile import AttentionMaps

    rng = np.random.default_rng(0)
    n, layers, heads, s, t = args.examples, args.layers, args.heads, args.source, args.target

    def rows(q: int, k: int, causal: bool = False) -> np.ndarray:
        w = rng.random((n, layers, heads, q, k), dtype=np.float32)
        if causal:
            w = w * np.tril(np.ones((q, k), np.float32))
        return w / w.sum(-1, keepdims=True)

    return AttentionMaps(
        encoder_self=rows(s, s), decoder_self=rows(t, t, causal=True), cross=rows(t, s),
        source_tokens=np.array([[f"▁src{i}" for i in range(s)]] * n),
        target_tokens=np.array([[f"▁tgt{i}" for i in range(t)]] * n),
        source_lengths=np.full(n, s, np.int32), target_lengths=np.full(n, t, np.int32),
        step=100, decode="greedy")


def savefig_previews(maps, out_dir: Path, log) -> None:
    """The previews as drawn before `render`: savefig per PNG, the mean drawn again for
    TensorBoard."""
    from attention.heatmaps import heatmap_figure, heatmap_image_array, png_name

    last = maps.num_layers("cross") - 1
    for example in range(maps.num_examples):
        for layer in ("mean", last):
            buffer = io.BytesIO()
            heatmap_figure(maps, example, "cross", layer, "mean").savefig(buffer, format="png")
            (out_dir / png_name("savefig", example, "cross", layer, "mean")).write_bytes(
                buffer.getvalue())
        log.image(f"attention/{maps.decode}/example{example}",
                  heatmap_image_array(maps, example, "cross", "mean", "mean"), maps.step)


def run(args: argparse.Namespace) -> dict:
    from bench.matmul_peak import host_cpu
    from evaluation.previews import PreviewDrawer
    from training.metrics_log import MetricsLog

    maps = random_maps(args)
    times: dict[str, list[float]] = {"savefig_s": [], "inline_s": [],
                                     "background_held_s": [], "background_drain_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        log = MetricsLog(out_dir, 0)
        savefig_previews(maps, out_dir, log)  # warm-up: fonts, colormaps, imports
        for _ in range(args.repeat):
            start = time.perf_counter()
            savefig_previews(maps, out_dir, log)
            times["savefig_s"].append(time.perf_counter() - start)

            inline = PreviewDrawer(log, background=False)
            start = time.perf_counter()
            inline.submit(maps, out_dir, "inline")
            times["inline_s"].append(time.perf_counter() - start)

            drawer = PreviewDrawer(log)
            start = time.perf_counter()
            drawer.submit(maps, out_dir, "background")
            held = time.perf_counter()
            drawer.close()
            drawer.raise_error()
            times["background_held_s"].append(held - start)
            times["background_drain_s"].append(time.perf_counter() - held)
        figures = len(list(out_dir.glob("inline.*.png")))
        log.close()
    result = {name: round(statistics.median(values), 4) for name, values in times.items()}
    return {**result, "figures": figures, "examples": args.examples,
            "tokens": [args.target, args.source], "layers": args.layers, "heads": args.heads,
            "repeat": args.repeat, "runs": times, "machine": host_cpu(), "time": time.time()}


def print_table(result: dict) -> None:
    print(f"{result['figures']} previews of {result['examples']} examples "
          f"({result['tokens'][0]} x {result['tokens'][1]} tokens), median of {result['repeat']}:")
    for name in ("savefig_s", "inline_s", "background_held_s", "background_drain_s"):
        print(f"  {name:20s} {result[name]:8.3f}")


if __name__ == "__main__":
    finish(parse_args(), run, print_table)
