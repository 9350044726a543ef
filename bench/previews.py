"""What validation's attention previews cost the training loop (evaluation/previews.py).

    python -m bench.previews [--examples 4] [--source 22] [--target 20] [--layers 4]
        [--heads 4] [--repeat 3] [--json OUT]

One validation's maps of `--examples` sentences (random attention rows of the given
lengths and shape: the previews' cost depends on the tokens drawn, not on the weights),
their previews drawn four ways, each `--repeat` times (the median is reported):

  * `savefig_s`: each preview saved with matplotlib's `Figure.savefig` and the all-layer
    mean drawn a second time for TensorBoard, as validation drew them before
    `attention.heatmaps.render` (savefig lays a constrained figure out and draws it again);
  * `inline_s`: `PreviewDrawer(background=False).submit`: each figure drawn once, its pixels
    written as the PNG and logged to TensorBoard, on the training thread;
  * `thread_held_s` / `thread_drain_s`: `draw_previews` on a thread of this process, as
    train.py drew them before the drawing process: the time the caller is held, and the
    wait for the thread to finish;
  * `process_held_s` / `process_drain_s`: `PreviewDrawer().submit`, what train.py does:
    the map file handed to the drawing process (evaluation/preview_worker.py), and the
    wait for it at `close` (a new drawer each repeat: its process's start included).

And what the drawing does to a loop that dispatches a step at a time, as train.py does
on an accelerator: a micro step (a jitted update of 128 arrays of 64 x 64: dispatch-bound,
like a small model's step on a fast device), each step waited for, its mean wall time
alone (`loop_alone_ms`), while a thread draws (`loop_beside_thread_ms`) and while the
drawing process draws (`loop_beside_process_ms`). A drawing thread holds the GIL the
dispatch needs; a process does not.

The defaults are the recipes' validation maps (4 examples, Transformer-tiny: 4 decoder
layers, 4 heads) at Multi30k's typical sentence lengths in subword tokens.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import threading
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


def micro_step():
    """A dispatch-bound jitted step and its state: 128 arrays of 64 x 64, each updated."""
    import jax
    import jax.numpy as jnp

    state = {f"w{i}": jnp.full((64, 64), 1.0 + i, jnp.float32) for i in range(128)}
    step = jax.jit(lambda tree: jax.tree.map(lambda w: w * 0.999 + 1e-3, tree), donate_argnums=0)
    return step, jax.block_until_ready(step(state))


def loop_ms(step, state, busy, min_steps: int = 50) -> tuple[float, dict]:
    """Mean ms of `step`, each waited for, while `busy()` holds (and at least
    `min_steps`); returns it and the state after."""
    import jax

    times = []
    while busy() or len(times) < min_steps:
        start = time.perf_counter()
        state = jax.block_until_ready(step(state))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.fmean(times), state


def run(args: argparse.Namespace) -> dict:
    from attention.mapfile import save_maps
    from bench.matmul_peak import host_cpu
    from evaluation.previews import PreviewDrawer, draw_previews
    from training.metrics_log import MetricsLog

    maps = random_maps(args)
    names = ("savefig_s", "inline_s", "thread_held_s", "thread_drain_s", "process_held_s",
             "process_drain_s", "loop_alone_ms", "loop_beside_thread_ms", "loop_beside_process_ms")
    times: dict[str, list[float]] = {name: [] for name in names}
    step, state = micro_step()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        log = MetricsLog(out_dir, 0)
        map_file = save_maps(out_dir / "valid.npz", maps)
        savefig_previews(maps, out_dir, log)  # warm-up: fonts, colormaps, imports
        for _ in range(args.repeat):
            start = time.perf_counter()
            savefig_previews(maps, out_dir, log)
            times["savefig_s"].append(time.perf_counter() - start)

            inline = PreviewDrawer(log, background=False)
            start = time.perf_counter()
            inline.submit(maps, out_dir / "inline.npz")
            times["inline_s"].append(time.perf_counter() - start)

            end = time.perf_counter() + 2.0
            ms, state = loop_ms(step, state, lambda end=end: time.perf_counter() < end)
            times["loop_alone_ms"].append(ms)

            start = time.perf_counter()
            thread = threading.Thread(target=draw_previews, args=(maps, map_file, log))
            thread.start()
            held = time.perf_counter()
            ms, state = loop_ms(step, state, thread.is_alive)
            thread.join()
            times["thread_held_s"].append(held - start)
            times["thread_drain_s"].append(time.perf_counter() - held)
            times["loop_beside_thread_ms"].append(ms)

            drawer = PreviewDrawer(log)
            start = time.perf_counter()
            drawer.submit(maps, map_file)
            held = time.perf_counter()
            ms, state = loop_ms(step, state, lambda drawer=drawer: drawer.pending > 0)
            drawer.close()
            drawer.raise_error()
            times["process_held_s"].append(held - start)
            times["process_drain_s"].append(time.perf_counter() - held)
            times["loop_beside_process_ms"].append(ms)
        figures = len(list(out_dir.glob("inline.*.png")))
        log.close()
    result = {name: round(statistics.median(values), 4) for name, values in times.items()}
    return {**result, "figures": figures, "examples": args.examples,
            "tokens": [args.target, args.source], "layers": args.layers, "heads": args.heads,
            "repeat": args.repeat, "runs": times, "machine": host_cpu(), "time": time.time()}


def print_table(result: dict) -> None:
    print(f"{result['figures']} previews of {result['examples']} examples "
          f"({result['tokens'][0]} x {result['tokens'][1]} tokens), median of {result['repeat']}:")
    for name in result["runs"]:
        print(f"  {name:24s} {result[name]:8.3f}")


if __name__ == "__main__":
    finish(parse_args(), run, print_table)
