"""Word-alignment peers side by side: eflomal (and fast_align) against
attnmt's cross-attention links, on the same gold pairs, scored in the same run.

    python bench/alignment_peers.py [--pairs P] [--gold G] [--workdir W
        [--reverse_workdir W2]] [--fast_align BIN] [--eflomal_stages] [--json OUT]

The statistical aligners learn from the bitext attnmt learns from: the training split
of the run's corpus (`--workdir`'s config.json; else configs/multi30k_de_en.py: the
29,000 Multi30k train pairs, raw) followed by the N gold pairs without their links, all
Moses-tokenized (sacremoses; the gold pairs are tokenized already and kept as they are,
so the word indices stay the gold's) and lowercased; a run that repeated the gold pairs
in its training text (configs/align_de_en.py: 10 times) also gets the peers' rows on
exactly that text ("(pairs xK)"). eflomal (`pip install eflomal`,
the `bench` extra; `eflomal.Aligner(model=3)` = `eflomal-align -m 3`, IBM1 + HMM +
fertility) aligns that file in both directions; with `--fast_align` a clab/fast_align
binary does too (`-d -o -v`, and `-r`): no maintained pip build of it exists (the one
found, systran-align, last released in January 2023, has no wheel past Python 3.11 and
returns only its own symmetrised links). Building it takes seconds:
`git clone https://github.com/clab/fast_align && cd fast_align && g++ -O2 -std=c++11
-fopenmp -I. -Isrc -o fast_align src/fast_align.cc src/ttables.cc`. The last N lines of each output are the gold
pairs' links; both directions are combined with attnmt's `symmetrize` and scored with
its `alignment_scores`. With `--workdir` (and `--reverse_workdir`) the same table gets
attnmt's rows from `attention.align.align` with the run's stored (`--select`) or
default settings, computed in this run. `--eflomal_stages` adds eflomal's first stages
on the usual text ("eflomal -m 1", IBM model 1 alone; "eflomal -m 2", + the HMM): what
each of its models adds, beside attnmt's lexical table and prior.

Columns: AER / precision / recall (percent) on all N pairs, on the first 100 (the dev
split that chooses attnmt's settings) and on the others. Statistical aligners sample
(eflomal) or depend on the corpus order, so figures move a little between runs.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish  # noqa: E402

GOLD_DIR = REPO.parent / "shared" / "data" / "alignment" / "de-en"
DEV = 100  # alignment.aligner.DEV_SENTENCES, without importing absl/JAX before the checks


def machine() -> str:
    """CPU model and core count, in words."""
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 platform.processor()) if Path("/proc/cpuinfo").is_file() else platform.processor()
    return f"{model}, {len(os.sched_getaffinity(0))} cores usable ({platform.system()})"


def training_bitext(workdir: Path | None, src_lang: str, tgt_lang: str,
                    limit: int = 0) -> tuple[list, list, str]:
    """The raw training pairs of the run's corpus (or Multi30k), source side `src_lang`;
    the first `limit` only when > 0 (quick checks)."""
    from configs import resolved
    from data.corpora import load_corpus

    if workdir is None:
        from configs.multi30k_de_en import get_config

        data = get_config().data
    else:
        data = resolved.load_config_json(workdir).data
    data.source_lang, data.target_lang = src_lang, tgt_lang
    sources, targets = load_corpus(data, "train")
    if limit > 0:
        sources, targets = sources[:limit], targets[:limit]
    return sources, targets, f"{data.dataset} train {src_lang}-{tgt_lang}"


def strip_copies(train_src: list[str], train_tgt: list[str], sources: list[str],
                 targets: list[str]) -> tuple[list[str], list[str], int]:
    """The training pairs without the copies of (sources, targets) they end with (a run
    that trained on the pairs to align, configs/align_de_en.py), and how many there were."""
    n, copies = len(sources), 0
    while n and len(train_src) >= n and (train_src[-n:], train_tgt[-n:]) == (sources, targets):
        train_src, train_tgt, copies = train_src[:-n], train_tgt[:-n], copies + 1
    return train_src, train_tgt, copies


def read_links(path: Path, last: int) -> list[list[tuple[int, int]]]:
    from alignment.links import read_pharaoh

    links = read_pharaoh(path)
    return links[len(links) - last:]


def run_eflomal(src: list[str], tgt: list[str], folder: Path, last: int,
                model: int = 3) -> tuple:
    """eflomal -m `model` both directions: (forward links, reverse links, seconds)."""
    from alignment.teacher_links import eflomal_links

    start = time.perf_counter()
    forward, reverse = eflomal_links(src, tgt, folder, model)
    seconds = time.perf_counter() - start
    return forward[len(forward) - last:], reverse[len(reverse) - last:], seconds


def run_fast_align(binary: Path, src: list[str], tgt: list[str], folder: Path, last: int) -> tuple:
    """fast_align -d -o -v, forward and -r: (forward links, reverse links, seconds)."""
    joint = folder / "bitext.src-tgt"
    joint.write_text("".join(f"{s} ||| {t}\n" for s, t in zip(src, tgt, strict=True)),
                     encoding="utf-8")
    start, out = time.perf_counter(), []
    for name, extra in (("fwd", []), ("rev", ["-r"])):
        with open(folder / f"fast_align.{name}", "w") as f:
            subprocess.run([str(binary), "-i", str(joint), "-d", "-o", "-v", *extra], stdout=f,
                           stderr=subprocess.DEVNULL, check=True)
        out.append(read_links(folder / f"fast_align.{name}", last))
    return out[0], out[1], time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    from common.errors import UserError

    try:
        import eflomal  # noqa: F401
    except ImportError:
        raise UserError("eflomal is not installed: pip install -e '.[bench]' "
                        "(or pip install eflomal)") from None
    if args.fast_align and not os.access(args.fast_align, os.X_OK):
        raise UserError(f"--fast_align {args.fast_align}: not an executable file")
    from alignment.aligner import align, split_scores
    from alignment.links import (
        HEADS_AND_STUDENT_LAYER,
        JOINT_HEADS_LAYER,
        REVERSE_HEAD_LAYER,
        SYMMETRIZE,
        read_gold,
        read_pairs,
        symmetrize,
    )
    from alignment.teacher_links import moses_lowercase

    sources, targets = read_pairs(args.pairs)
    golds = read_gold(args.gold, sources, targets)
    n = len(sources)
    start = time.perf_counter()
    train_src, train_tgt, corpus = training_bitext(args.workdir, args.src_lang, args.tgt_lang,
                                                   args.max_train_pairs)
    train_src, train_tgt, copies = strip_copies(train_src, train_tgt, sources, targets)
    if copies:
        corpus += f" (its {copies} cop{'y' if copies == 1 else 'ies'} of the gold pairs: once, at the end)"
    src = moses_lowercase(train_src, args.src_lang) + [s.lower() for s in sources]
    tgt = moses_lowercase(train_tgt, args.tgt_lang) + [t.lower() for t in targets]
    prepare_s = time.perf_counter() - start
    rows, timing = [], {"bitext_prepare_s": prepare_s}

    def add(method: str, links: list, **extra) -> None:
        rows.append({"method": method, **split_scores(links, golds, DEV), **extra})

    peers = [("eflomal", run_eflomal)]
    if args.fast_align:
        peers.append(("fast_align", lambda *a: run_fast_align(args.fast_align, *a)))
    # The peers on the usual protocol's text (the pairs once) and, when the run repeated
    # them, on exactly the run's text as well.
    texts = {"": (src, tgt)}
    if copies > 1:
        extra = copies - 1
        texts[f" (pairs x{copies})"] = (src + src[-n:] * extra, tgt + tgt[-n:] * extra)
    runs = list(itertools.product(peers, texts.items()))
    if args.eflomal_stages:
        runs += [((f"eflomal -m {model}", functools.partial(run_eflomal, model=model)),
                  ("", texts[""])) for model in (1, 2)]
    with tempfile.TemporaryDirectory() as tmp:
        for (name, runner), (label, (peer_src, peer_tgt)) in runs:
            fwd, rev, seconds = runner(peer_src, peer_tgt, Path(tmp), n)
            timing[f"{name}{label}_s"] = seconds
            add(f"{name}{label} fwd", fwd)
            add(f"{name}{label} rev", rev)
            for method in SYMMETRIZE:
                add(f"{name}{label} {method}", [symmetrize(f, r, method)
                                                for f, r in zip(fwd, rev, strict=True)])
    if args.workdir:
        start = time.perf_counter()
        fwd = align(args.workdir, sources, targets, symmetrize_with="none")
        name = {JOINT_HEADS_LAYER: "attnmt joint (the two heads)",
                HEADS_AND_STUDENT_LAYER: "attnmt heads and student"}.get(
                    fwd["settings"]["layer"], "attnmt fwd")
        add(name, fwd["links"],
            settings=fwd["settings"])
        if args.reverse_workdir:
            rev = align(args.reverse_workdir, targets, sources, symmetrize_with="none")
            add("attnmt rev", [[(i, j) for j, i in links] for links in rev["links"]],
                settings=rev["settings"])
        # The stored (or, with a reverse run, grow-diag-final-and) symmetrisation: of the
        # two runs, of the run's two heads, or of one map's rows and columns.
        both = align(args.workdir, sources, targets, reverse_workdir=args.reverse_workdir)
        if both["settings"]["symmetrize"] != "none":
            reverse = both["settings"]["reverse"]
            what = ("" if reverse and reverse["layer"] != REVERSE_HEAD_LAYER
                    else " (the two heads)" if reverse else " (rows with columns)")
            add(f"attnmt {both['settings']['symmetrize']}{what}", both["links"],
                settings=both["settings"])
        timing["attnmt_s"] = time.perf_counter() - start
    from importlib.metadata import version

    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(),
            "pairs": str(args.pairs), "gold": str(args.gold), "gold_pairs": n, "dev_pairs": DEV,
            "bitext": {"corpus": corpus, "train_pairs": len(train_src), "gold_pairs": n,
                       "gold_copies_in_run": copies,
                       "tokenizer": "sacremoses MosesTokenizer (escape=False); gold pairs as "
                                    "given", "lowercased": True},
            "eflomal": {"version": version("eflomal"), "model": 3},
            "fast_align": {"binary": str(args.fast_align), "options": "-d -o -v (and -r)"}
            if args.fast_align else None,
            "workdir": str(args.workdir) if args.workdir else None,
            "reverse_workdir": str(args.reverse_workdir) if args.reverse_workdir else None,
            "timing": timing, "rows": rows}


def print_table(result: dict) -> None:
    """One row per method: AER / P / R on all pairs, the dev pairs and the others."""
    n, dev = result["gold_pairs"], result["dev_pairs"]
    parts = [("all", f"all {n}"), ("dev", f"first {dev}"), ("test", f"other {n - dev}")]
    width = max(len(r["method"]) for r in result["rows"])
    print(f"{'':<{width}}  " + "  ".join(f"{title:^20}" for _, title in parts))
    print(f"{'method':<{width}}  " + "  ".join(f"{'AER':>6} {'P':>6} {'R':>6}" for _ in parts))
    for row in result["rows"]:
        cells = [" ".join(f"{100 * row[p][k]:6.1f}" for k in ("aer", "precision", "recall"))
                 if p in row else f"{'-':^20}" for p, _ in parts]
        print(f"{row['method']:<{width}}  " + "  ".join(cells))
    timing = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in result["timing"].items())
    print(f"bitext: {result['bitext']['train_pairs']} {result['bitext']['corpus']} pairs + "
          f"{n} gold pairs; time: {timing}; {result['machine']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=GOLD_DIR / "test.de-en",
                        help="gold 'src ||| tgt' pairs [../shared/.../test.de-en]")
    parser.add_argument("--gold", type=Path, default=GOLD_DIR / "gold.talp",
                        help="their TALP links [../shared/.../gold.talp]")
    parser.add_argument("--src_lang", default="de", help="the pairs' source language [de]")
    parser.add_argument("--tgt_lang", default="en", help="the pairs' target language [en]")
    parser.add_argument("--workdir", type=Path, help="an attnmt run src->tgt: its rows, and its "
                        "training corpus for the peers")
    parser.add_argument("--reverse_workdir", type=Path, help="an attnmt run tgt->src")
    parser.add_argument("--fast_align", type=Path, help="a clab/fast_align binary (optional)")
    parser.add_argument("--eflomal_stages", action="store_true",
                        help="also eflomal -m 1 (IBM1) and -m 2 (+HMM) on the usual text")
    parser.add_argument("--max_train_pairs", type=int, default=0,
                        help="only the first N training pairs (quick checks) [0 = all]")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.reverse_workdir and not args.workdir:
        parser.error("--reverse_workdir needs --workdir")
    return args


def main(argv: list[str] | None = None) -> dict:
    return finish(parse_args(argv), run, print_table)


if __name__ == "__main__":
    main()
