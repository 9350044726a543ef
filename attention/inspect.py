"""Inspect a saved attention map file (SPEC §4.6).

    python -m attention.inspect FILE.npz [--example I] [--kind cross|encoder_self|decoder_self]
        [--layer L|mean] [--head H|mean] [--out fig.png] [--grid] [--html out.html]
        [--align [--gold gold.talp] [--words] [--shift] [--layers 2,3] [--heads mean]
         [--keep-eos]]

Without --out / --html / --align it writes `<stem>.ex<I>.<kind>.<layer>.<head>.png`
beside FILE and prints its path. --grid draws all heads of --layer in one PNG.
--html writes the self-contained viewer of the whole file. --align prints one Pharaoh
line (`i-j`, 0-indexed source-target) per example (or just --example); --gold scores
them against the first N lines of a TALP file and prints `AER = x.xxxx (N sentences)`.
Layers and heads are 0-indexed (negative counts from the end). With --align the paths
of written files go to stderr so stdout holds only alignments.

Bad input gives one `error: ...` line on stderr, exit status 2, and no file written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from attention.alignment import aer, extract_alignment, format_pharaoh, read_talp
from attention.mapfile import KINDS, AttentionMaps, MapFormatError, load_maps, validate_maps
from attention.plotting import plot_head_grid, plot_heatmap, png_name
from attention.viewer import write_html


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of argparse's usage block
        raise UsageError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    """The command line of §4.6 (argparse errors become one-line UsageErrors)."""
    p = _Parser(prog="python -m attention.inspect",
                description="Render, view and score the attention maps of a §4.5 .npz file.")
    p.add_argument("file", help="attention map file (.npz)")
    p.add_argument("--example", type=int, default=None,
                   help="example index (default 0; with --align: all examples)")
    p.add_argument("--kind", choices=KINDS, default="cross")
    p.add_argument("--layer", default="mean", help="layer index or 'mean' (default)")
    p.add_argument("--head", default="mean", help="head index or 'mean' (default)")
    p.add_argument("--out", help="PNG path for the heatmap (or the head grid with --grid)")
    p.add_argument("--grid", action="store_true", help="plot all heads of --layer in a grid")
    p.add_argument("--html", help="write the self-contained HTML viewer here")
    p.add_argument("--align", action="store_true", help="print Pharaoh alignments")
    p.add_argument("--gold", help="TALP gold file (1-indexed i-j sure, ipj possible): print AER")
    p.add_argument("--words", action="store_true", help="merge pieces into words")
    p.add_argument("--shift", action="store_true",
                   help="read the row where the target word is the decoder input (Chen et al. 2020)")
    p.add_argument("--layers", help="layers to average for --align: '2,3', '-2' or 'mean' "
                                    "(default: --layer)")
    p.add_argument("--heads", help="heads to average for --align (default: --head)")
    p.add_argument("--keep-eos", action="store_true",
                   help="let </s> win the argmax (such target tokens stay unaligned)")
    return p


def _one(value: str, size: int, flag: str, what: str) -> int | str:
    """'mean' or an index in [-size, size) -> 'mean' or a non-negative index."""
    if value == "mean":
        return "mean"
    try:
        index = int(value)
    except ValueError:
        raise UsageError(f"{flag} must be an integer or 'mean', got {value!r}") from None
    if not -size <= index < size:
        raise UsageError(f"{flag} {index} out of range: {what} (0..{size - 1}) or 'mean'")
    return index % size


def _many(value: str, size: int, flag: str, what: str) -> list[int] | str:
    """'mean' or a comma list of indices -> 'mean' or non-negative indices."""
    if value == "mean":
        return "mean"
    return [int(_one(v.strip(), size, flag, what)) for v in value.split(",")]


def _check_example(maps: AttentionMaps, example: int, name: str) -> None:
    n = maps.num_examples
    if not 0 <= example < n:
        raise UsageError(f"--example {example} out of range: {name} has {n} examples (0..{n - 1})")


def run(args: argparse.Namespace) -> list[str]:
    """Validate everything, then write files; returns stdout lines. Raises UsageError."""
    align_only = [f for f, on in (("--gold", args.gold), ("--words", args.words),
                                  ("--shift", args.shift), ("--layers", args.layers),
                                  ("--heads", args.heads), ("--keep-eos", args.keep_eos)) if on]
    if align_only and not args.align:
        raise UsageError(f"{align_only[0]} only applies with --align")
    path = Path(args.file)
    maps = load_maps(path)
    try:
        validate_maps(maps)
    except MapFormatError as e:  # its message names the array, not the file
        raise MapFormatError(f"{path}: {e}") from None
    name = path.name
    n_layers, n_heads = maps.num_layers(args.kind), maps.num_heads
    layer = _one(args.layer, n_layers, "--layer", f"{args.kind} has {n_layers} layers")
    head = _one(args.head, n_heads, "--head", f"the model has {n_heads} heads")
    example = 0 if args.example is None else args.example
    _check_example(maps, example, name)

    lines: list[str] = []
    if args.align:
        n_cross = maps.num_layers("cross")
        layers = _many(args.layers or args.layer, n_cross, "--layers",
                       f"cross has {n_cross} layers")
        heads = _many(args.heads or args.head, n_heads, "--heads", f"the model has {n_heads} heads")
        examples = list(range(maps.num_examples)) if args.example is None else [example]
        hyps = [extract_alignment(maps, i, layers=layers, heads=heads, shift=args.shift,
                                  skip_eos=not args.keep_eos, words=args.words)
                for i in examples]
        lines += [format_pharaoh(h) for h in hyps]
        if args.gold:
            try:
                gold = read_talp(args.gold)
            except (OSError, UnicodeDecodeError) as e:
                raise UsageError(f"cannot read --gold {args.gold}: {e.strerror or e}") from None
            if len(gold) < examples[-1] + 1:
                raise UsageError(f"--gold {args.gold} has {len(gold)} lines but the maps need "
                                 f"{examples[-1] + 1} (example i is scored against line i + 1)")
            lines.append(f"AER = {aer(hyps, [gold[i] for i in examples]):.4f} "
                         f"({len(examples)} sentences)")

    written = []
    if args.html:
        written.append(write_html(maps, args.html, title=f"Attention maps: {name}"))
    if args.out or args.grid or not (args.html or args.align):
        if args.grid:
            out = args.out or path.with_name(
                f"{path.stem}.ex{example}.{args.kind}.{layer}.heads.png")
            written.append(plot_head_grid(maps, example, args.kind, layer, out))
        else:
            out = args.out or path.with_name(png_name(path.stem, example, args.kind, layer, head))
            written.append(plot_heatmap(maps, example, args.kind, layer, head, out))
    for w in written:
        print(w, file=sys.stderr if args.align else sys.stdout)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on `argv` (default sys.argv[1:]); returns the exit status (0 or 2)."""
    try:
        lines = run(build_parser().parse_args(argv))
    except (UsageError, MapFormatError, ValueError, OSError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
