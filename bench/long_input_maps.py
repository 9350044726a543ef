"""evaluate.py with attention maps on an input that holds one very long line.

    python bench/long_input_maps.py --workdir W [--lines 1000] [--long_tokens 600]
        [--beam_size 4] [--save_attention 10] [--long_index 3] [--checkpoint best]
        [--json OUT]

The user report behind it: `evaluate.py --beam_size 4 --save_attention 10` on a file
with one 600-token line wrote a ~300 MB map file, took 10 s to a minute per PNG preview
and had written no hypothesis file after 400 s.

The source file (`<workdir>/eval/<name>.source.txt`) is `--lines` lines: the run's
validation then test sources (cycled when there are fewer), with line `--long_index`
(within the first `--save_attention`, so its maps are recorded) replaced by a line of
at least `--long_tokens` source tokens (SentencePiece pieces with `</s>`, as the model
sees them), made of those sentences repeated. It runs `evaluate.evaluate(workdir,
source=..., beam_size=..., save_attention=..., name=...)` in this process, as the
command line would, and reports:
  * `hyp_file_s`: seconds from the call until `<name>.hyp.txt` exists (a thread polls
    for it every 10 ms); `load_s`, `decode_s`: evaluate's timing.load_seconds and
    timing.decode_seconds (the stages before the hypotheses are written);
  * `attention_s` (= `attention_record_s` recording and writing the maps +
    `attention_preview_s` the PNG previews), `total_s`: the whole call;
  * `npz_mb`: the map file's size; `valid_float32_mb`: the float32 size of the valid
    regions, sum over examples of 4 * H * (L_enc * S_i^2 + L_dec * (T_i^2 + T_i * S_i));
    the map file should be no larger (padding to the longest is zeros and compresses away);
  * `previews`, `previews_skipped`: PNGs written and examples skipped (too long to draw);
  * `peak_rss_mb`: this process's peak resident memory.
Sizes are MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish  # noqa: E402


def long_line(sentences: list[str], tokenizer, tokens: int) -> str:
    """`sentences` repeated, cut to the fewest words that reach `tokens` source tokens."""
    words = [w for s in sentences for w in s.split()]
    if not words:
        raise ValueError("no source text to build the long line from")
    picked: list[str] = []
    for word in itertools.cycle(words):  # a word adds >= 1 piece: this ends
        picked.append(word)
        checked = len(picked) % 20 == 0 or len(picked) >= tokens  # encode every 20 words
        if checked and len(tokenizer.encode_source([" ".join(picked)])[0]) >= tokens:
            break
    while len(tokenizer.encode_source([" ".join(picked[:-1])])[0]) >= tokens:
        picked.pop()  # back off the last block of 20 to the exact word
    return " ".join(picked)


def build_source(workdir: Path, lines: int, long_tokens: int, long_index: int,
                 path: Path) -> dict:
    """Writes the source file; returns facts about it (lengths in source tokens)."""
    from configs import resolved
    from data.corpora import load_corpus
    from evaluation.loading import load_tokenizer

    cfg = resolved.load_config_json(workdir)
    tokenizer = load_tokenizer(workdir, cfg)
    pool = [s for split in ("valid", "test") for s in load_corpus(cfg.data, split)[0] if s]
    text = list(itertools.islice(itertools.cycle(pool), lines))
    text[long_index] = long_line(pool, tokenizer, long_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    lengths = [len(ids) for ids in tokenizer.encode_source(text)]
    return {"source_file": str(path), "lines": lines, "long_index": long_index,
            "long_line_tokens": lengths[long_index], "long_line_words": len(text[long_index].split()),
            "other_lines_max_tokens": max(lengths[:long_index] + lengths[long_index + 1:],
                                          default=0)}


def wait_for(path: Path, start: float, found: dict, stop: threading.Event) -> None:
    """Polls for `path`; records found["seconds"] since `start` when it appears."""
    while not stop.is_set():
        if path.exists():
            found["seconds"] = time.perf_counter() - start
            return
        time.sleep(0.01)


def valid_bytes(maps) -> int:
    """float32 bytes of the valid regions of every example of a map file."""
    import numpy as np

    s, t = maps.source_lengths.astype(np.int64), maps.target_lengths.astype(np.int64)
    l_enc, l_dec = maps.num_layers("encoder_self"), maps.num_layers("cross")
    return 4 * maps.num_heads * int((l_enc * s * s + l_dec * (t * t + t * s)).sum())


def run(args: argparse.Namespace) -> dict:
    """Builds the input, runs evaluate in-process; returns the JSON result."""
    from attention.mapfile import load_maps
    from bench.train_throughput import peak_rss_mb
    from evaluate import EVAL_DIR, evaluate
    from evaluation.corpus import MAX_PREVIEW_EXAMPLES

    workdir = Path(args.workdir)
    out_dir = workdir / EVAL_DIR
    facts = build_source(workdir, args.lines, args.long_tokens, args.long_index,
                         out_dir / f"{args.name}.source.txt")
    stem = f"{args.name}.attention"
    for stale in [out_dir / f"{args.name}.hyp.txt", *out_dir.glob(f"{stem}.ex*.png")]:
        stale.unlink(missing_ok=True)  # the watcher and the preview count see this run's
    hyp_path, found, stop = out_dir / f"{args.name}.hyp.txt", {}, threading.Event()
    start = time.perf_counter()
    watcher = threading.Thread(target=wait_for, args=(hyp_path, start, found, stop), daemon=True)
    watcher.start()
    try:
        result = evaluate(workdir, source=facts["source_file"], beam_size=args.beam_size,
                          save_attention=args.save_attention, name=args.name,
                          checkpoint=args.checkpoint, batch_size=args.batch_size)
    finally:
        total = time.perf_counter() - start
        stop.set()
        watcher.join()
    timing = result["timing"]
    maps = load_maps(result["files"]["attention"])
    previews = sorted(p.name for p in out_dir.glob(f"{stem}.ex*.png"))
    drawn = {int(name[len(stem) + 3:].split(".")[0]) for name in previews}
    shown = min(maps.num_examples, MAX_PREVIEW_EXAMPLES)
    return {
        "workdir": str(workdir),
        "checkpoint_step": result["checkpoint_step"],
        **facts,
        "beam_size": args.beam_size,
        "save_attention": args.save_attention,
        "batch_size": result["decoding"]["batch_size"],
        "hyp_file_s": found.get("seconds"),
        "load_s": timing["load_seconds"],
        "decode_s": timing["decode_seconds"],
        "decode_compile_s": timing["compile_seconds"],
        "attention_s": timing.get("attention_seconds"),
        "attention_record_s": timing.get("attention_record_seconds"),
        "attention_preview_s": timing.get("attention_preview_seconds"),
        "total_s": total,
        "npz_mb": os.path.getsize(result["files"]["attention"]) / 1e6,
        "valid_float32_mb": valid_bytes(maps) / 1e6,
        "map_shapes": {kind: list(maps.weights(kind).shape)
                       for kind in ("encoder_self", "decoder_self", "cross")},
        "map_source_lengths": maps.source_lengths.tolist(),
        "map_target_lengths": maps.target_lengths.tolist(),
        "previews": len(previews),
        "previews_skipped": sorted(set(range(shown)) - drawn),
        "peak_rss_mb": peak_rss_mb(),
        "files": result["files"],
    }


def print_table(result: dict) -> None:
    """The headline figures as an aligned two-column table."""
    def sec(value) -> str:
        return "n/a" if value is None else f"{value:.1f} s"

    rows = [
        ("run", f"{result['workdir']} (step {result['checkpoint_step']})"),
        ("input", f"{result['lines']} lines; line {result['long_index']}: "
                  f"{result['long_line_tokens']} tokens ({result['long_line_words']} words); "
                  f"others <= {result['other_lines_max_tokens']} tokens"),
        ("decoding", f"beam {result['beam_size']}, batch {result['batch_size']}, "
                     f"maps of the first {result['save_attention']}"),
        ("hyp file written after", sec(result["hyp_file_s"])),
        ("  load + decode", f"{sec(result['load_s'])} + {sec(result['decode_s'])}"),
        ("attention maps", f"{sec(result['attention_s'])} (record + save "
                           f"{sec(result['attention_record_s'])}, previews "
                           f"{sec(result['attention_preview_s'])})"),
        ("total", sec(result["total_s"])),
        ("map file", f"{result['npz_mb']:.2f} MB (valid regions, float32: "
                     f"{result['valid_float32_mb']:.2f} MB)"),
        ("previews", f"{result['previews']} PNGs, examples skipped: "
                     f"{result['previews_skipped'] or 'none'}"),
        ("peak RSS", f"{result['peak_rss_mb']:.0f} MiB"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a trained run directory")
    parser.add_argument("--lines", type=int, default=1000, help="input lines [1000]")
    parser.add_argument("--long_tokens", type=int, default=600,
                        help="source tokens of the long line [600]")
    parser.add_argument("--long_index", type=int, default=3,
                        help="its line number, 0-based, within --save_attention [3]")
    parser.add_argument("--beam_size", type=int, default=4, help="[4]")
    parser.add_argument("--save_attention", type=int, default=10,
                        help="maps of the first N lines [10]")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="sentences per batch [the config's eval.batch_size]")
    parser.add_argument("--checkpoint", default=None, help="best | last | STEP [best]")
    parser.add_argument("--name", default="long_input_maps",
                        help="evaluate's output name in <workdir>/eval/ [long_input_maps]")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.lines < 1 or args.long_tokens < 1 or args.beam_size < 1 or args.save_attention < 1:
        parser.error("--lines, --long_tokens, --beam_size and --save_attention must be >= 1")
    if not 0 <= args.long_index < min(args.lines, args.save_attention):
        parser.error("--long_index must be within the first --save_attention lines")
    return args


def main(argv: list[str] | None = None) -> dict:
    return finish(parse_args(argv), run, print_table)


if __name__ == "__main__":
    main()
