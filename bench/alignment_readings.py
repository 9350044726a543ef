"""Fixed readings of the alignment heads over a run's checkpoints: how a
recipe's alignments move with training, one table row per (run, checkpoint).

    python bench/alignment_readings.py --workdir W [--workdir W2 ...] [--steps 500,1000]
        [--pairs P] [--gold G] [--json OUT]

Each checkpoint is forced-decoded once and read seven fixed ways (`READINGS`, the
columns of docs/alignment.md's tables); the figures are AER on *all* gold pairs. This is
exploration, not the protocol: the settings are fixed in advance, nothing is chosen on
these figures (`python -m attention.align --select` chooses on the first 100 pairs).
Runs need both heads (alignment.reverse) for the reverse and joint columns and
alignment.student for the student's; a missing head's columns read "-".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish  # noqa: E402
from bench.alignment_peers import GOLD_DIR, machine  # noqa: E402

# (column title, layer, threshold (None = argmax), word map, prior weight W)
READINGS = (
    ("forward head, argmax, W = 1, pieces", "alignment", None, False, 1.0),
    ("forward head, word map, W = 0.5, threshold 0.5", "alignment", 0.5, True, 0.5),
    ("reverse head, the same", "alignment_reverse", 0.5, True, 0.5),
    ("joint, word map, W = 0.5, threshold 0.3", "alignment_joint", 0.3, True, 0.5),
    ("student, word map, threshold 0.3", "alignment_student", 0.3, True, None),
    ("student joint, word map, threshold 0.3", "alignment_student_joint", 0.3, True, None),
    ("heads and student, word map, W = 0.5, threshold 0.3", "alignment_heads_student", 0.3,
     True, 0.5),
)


def run(args: argparse.Namespace) -> dict:
    from alignment.forced import Recorded
    from alignment.links import alignment_scores, read_gold, read_pairs
    from evaluation.loading import kept_steps
    from training.compilation import enable_compilation_cache

    enable_compilation_cache()
    sources, targets = read_pairs(args.pairs)
    golds = read_gold(args.gold, sources, targets)
    rows = []
    for workdir in args.workdir:
        kept = kept_steps(workdir)
        steps = [s for s in kept if not args.steps or s in args.steps]
        if args.steps and len(steps) < len(args.steps):
            missing = sorted(set(args.steps) - set(kept))
            print(f"{workdir}: no checkpoint of step(s) {missing} (kept: {kept})",
                  file=sys.stderr)
        for step in steps:
            start = time.perf_counter()
            rec = Recorded(workdir, str(step), sources, targets)
            cells = {}
            for title, layer, threshold, words, weight in READINGS:
                if layer not in rec.head_layers:
                    continue
                links = rec.links(layer, False, threshold, prior_weight=weight, words=words)
                cells[title] = alignment_scores(links, golds)
            rows.append({"workdir": str(workdir), "step": step, "readings": cells,
                         "seconds": round(time.perf_counter() - start, 1)})
            print(f"{workdir} step {step}: done in {rows[-1]['seconds']} s", file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(),
            "pairs": str(args.pairs), "gold": str(args.gold), "gold_pairs": len(golds),
            "columns": [r[0] for r in READINGS], "rows": rows}


def print_table(result: dict) -> None:
    """A markdown table: AER on all pairs per reading."""
    print("| run, step | " + " | ".join(result["columns"]) + " |")
    print("|---" * (len(result["columns"]) + 1) + "|")
    for row in result["rows"]:
        cells = [f"{100 * row['readings'][c]['aer']:.1f}" if c in row["readings"] else "-"
                 for c in result["columns"]]
        print(f"| {Path(row['workdir']).name}, {row['step']:,} | " + " | ".join(cells) + " |")
    print(f"AER on all {result['gold_pairs']} gold pairs; {result['machine']}, {result['date']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, action="append", required=True,
                        help="a run with an alignment head (repeat for several)")
    parser.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",")],
                        help="only these kept checkpoints, e.g. 500,1000 [all kept]")
    parser.add_argument("--pairs", type=Path, default=GOLD_DIR / "test.de-en",
                        help="gold 'src ||| tgt' pairs [../shared/.../test.de-en]")
    parser.add_argument("--gold", type=Path, default=GOLD_DIR / "gold.talp",
                        help="their TALP links [../shared/.../gold.talp]")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    return finish(parse_args(argv), run, print_table)


if __name__ == "__main__":
    main()
