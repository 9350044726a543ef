"""Word alignment of any bitext with a trained model's cross-attention.

    python -m attention.align --workdir W (--pairs FILE | --source F --target F)
        [--gold gold.talp] [--reverse_workdir W2]
        [--symmetrize grow-diag-final-and|intersect|union|none]
        [--layer L|mean|alignment|alignment_reverse|alignment_joint|
                 alignment_student|alignment_student_joint|alignment_heads_student]
        [--heads mean|0,2]
        [--[no]shift] [--[no]words] [--threshold argmax|X] [--prior_weight W]
        [--checkpoint best|last|STEP] [--select] [--plot PNG [--plot_pair K]]
        [--measure weights|norm|alti] [--reinit_seed N]

stdout: one Pharaoh line per input pair, in order, nothing dropped: 0-indexed `i-j`
links between the i-th source and j-th target word of the given whitespace words
(`src ||| tgt`; the source side is the model's source language). Each pair is
teacher-forced through the model; each word is encoded on its own (SentencePiece
splits at whitespace anyway), so its pieces are known and always merged back into it.
A pair longer than `max_tokens` pieces on a side (1024, or the learned positions) is
cut into proportional consecutive chunks, aligned chunk by chunk: still one line.

How links are read (`alignment.links.links_from_rows`): the cross-attention of
decoder layer `--layer` (or the mean of all), averaged over `--heads`; the row where a
target piece is predicted, or with `--shift` where it is the decoder input (Chen et al.
2020); argmax, or every source piece with a weight >= `--threshold`. A model trained
with the `alignment` config group (alignment/head.py) also offers `--layer alignment`:
its posterior p(source piece | x, y), which sees the target piece itself (no shift
applies): the mixture's, or with `alignment.jumps` the HMM's forward-backward
marginals, which see the whole target; it is the default for such a model.
`--prior_weight W` (0 to 1, default 1) raises the head's prior attention (its
transitions) to W in that posterior: 0 reads the lexical table alone (IBM model 1's
reading), for a prior that has not learned where to look yet
(`alignment.forced.head_posterior`).
A run with the reverse twin (`alignment.reverse`) also offers `--layer
alignment_reverse` and `--layer alignment_joint`: the geometric mean of the two heads'
posteriors, a link where both directions agree (Liang et al. 2006's posterior decoding;
`alignment.forced.joint_posterior`). A run with `alignment.student` also
offers `--layer alignment_student` and `--layer alignment_student_joint`: the
context-aware layer taught by the two heads or by an outside aligner's links
(alignment/student.py), its scores normalised over the source pieces, or the
geometric mean of that and their normalisation over the target pieces (no prior, so no
`--prior_weight`); and `--layer alignment_heads_student`, the mean of the heads' and the
student's joint readings (the recipe's reading when the student was taught links).
`--measure` picks what a decoder layer's map is (models/contributions.py): the
attention `weights` (default), the `norm`-based maps ||alpha f(x)|| (Kobayashi et al.
2020), or `alti`, ALTI+'s contributions of each source piece to each target step
(Ferrando et al. 2022; the whole model's: every --layer and --heads reads the same);
`--select` chooses the other settings on that measure and stores it with them.
`--reinit_seed N` reads every run with fresh random parameters of the same architecture
(`evaluation.loading.reinitialised`, seed N; the checkpoint is still read and checked):
the model-randomisation sanity check (Adebayo et al. 2018). A `--select` with it stores
its choice apart, in `<workdir>/eval/alignment.reinit<N>.json` (which a later
`--reinit_seed N` reads), never in place of the trained parameters' settings.
`--words` merges the map into words first (a target word's piece rows averaged, a
source word's piece columns summed) and reads that, instead of merging the pieces' links.
`--reverse_workdir` adds a model of the opposite direction (its links are transposed)
and `--symmetrize` combines both (`alignment.links.symmetrize`, atools' order);
without a reverse model, `--symmetrize` combines one map's argmax rows with its columns
(each source word's most likely target word: the map read the other way).

`--gold F` (TALP, 1-indexed, sure `i-j` / possible `ipj`) only scores: stderr gets
`AER: x precision: p recall: r` (percent, all pairs), then the same for the first
`--dev_sentences` (100) pairs and the others, and the settings. `--select` (needs
--gold) tries every saved checkpoint x layer (each, mean, each head with each of
PRIOR_WEIGHTS) x shift x piece or word map x threshold (argmax and THRESHOLDS) and the
argmax rows with the columns (each symmetrisation) on the first 100 pairs alone, with a
reverse model (or head) also the symmetrisations of each direction's best 5, keeps the
lowest dev AER and stores it in `<workdir>/eval/alignment.json`. A flag not given takes
that stored value, else the built-in default (best checkpoint; the joint reading of a
run with both heads, as word maps, threshold 0.3, prior weight 0.25
(`alignment.aligner.JOINT_READING`); else the head, or else the penultimate layer, argmax;
heads mean, no shift; grow-diag-final-and with a reverse model): the bare command
reproduces the figures. `--plot PNG` also draws one pair
(`--plot_pair`, default 0) as a word-level map of what the links were read from, with
its links and, with `--gold`, its gold links on it.
From Python: `align(workdir, sources, targets, golds=...) -> dict` and `select(...)`
(alignment/aligner.py, importable from here too).
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from absl import flags
from absl import logging as absl_logging

from alignment.aligner import DEV_SENTENCES, align, select, split_scores
from alignment.links import (
    HEAD_LAYER,
    HEADS_AND_STUDENT_LAYER,
    JOINT_HEADS_LAYER,
    REVERSE_HEAD_LAYER,
    STUDENT_JOINT_LAYER,
    STUDENT_LAYER,
    SYMMETRIZE,
    format_pharaoh,
    read_gold,
    read_pairs,
    read_sides,
)
from alignment.settings import describe, parse_heads, parse_layer, parse_threshold, result_file
from common import cli
from common.errors import UserError
from common.files import prepare_output_folder

__all__ = ["DEV_SENTENCES", "align", "main", "select", "split_scores"]  # align/select: aligner.py

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    flags.DEFINE_string("workdir", None, "Trained run (config.json, tokenizer/, checkpoints/).")
    flags.DEFINE_string("pairs", None, "'src ||| tgt' lines of whitespace-tokenized words.")
    flags.DEFINE_string("source", None, "Source sentences, one per line (with --target).")
    flags.DEFINE_string("target", None, "Target sentences, one per line (with --source).")
    flags.DEFINE_string("gold", None, "Gold links (.talp) to score against; links unchanged.")
    flags.DEFINE_string("reverse_workdir", None, "A run of the opposite direction.")
    flags.DEFINE_enum("symmetrize", None, [*SYMMETRIZE, "none"], "How to combine directions "
                      "(without --reverse_workdir: the map's rows with its columns).")
    flags.DEFINE_string("layer", None, "Decoder layer (negative from the end), mean, or "
                        f"{HEAD_LAYER} (the model's alignment head), {REVERSE_HEAD_LAYER} "
                        f"(its reverse twin), {JOINT_HEADS_LAYER} (the two heads' agreement), "
                        f"{STUDENT_LAYER} / {STUDENT_JOINT_LAYER} (the alignment student: "
                        f"its rows / both ways) or {HEADS_AND_STUDENT_LAYER} (the mean of the "
                        "two joint readings).")
    flags.DEFINE_string("heads", None, "mean, or comma-separated head indices to average.")
    flags.DEFINE_bool("shift", None, "Read the row where the target word is the input.")
    flags.DEFINE_enum("measure", None, ["weights", "norm", "alti"], "What a decoder layer's "
                      "map is: attention weights, norm-based maps or ALTI+ source "
                      "contributions.")
    flags.DEFINE_bool("words", None, "Merge the map into words before reading it (else "
                      "each piece's links are merged).")
    flags.DEFINE_string("threshold", None, "argmax, or link every weight >= this number.")
    flags.DEFINE_float("prior_weight", None, "--layer alignment: the head's prior raised to "
                       "this (0 to 1) in its posterior; 0 = lexical table alone.")
    flags.DEFINE_string("checkpoint", None, "best | last | STEP (default: stored, else best).")
    flags.DEFINE_bool("select", False, "Choose the settings on the dev pairs and store them.")
    flags.DEFINE_integer("dev_sentences", DEV_SENTENCES, "Gold pairs that choose settings.")
    flags.DEFINE_integer("batch_size", 32, "Pairs per forced-decoding batch.")
    flags.DEFINE_string("plot", None, "Also draw pair --plot_pair's map with its links (and "
                        "the gold ones) into this PNG.")
    flags.DEFINE_integer("plot_pair", 0, "The pair --plot draws (0-indexed).")
    flags.DEFINE_integer("reinit_seed", None, "Read the runs with fresh random parameters "
                         "(this seed) in place of their checkpoints': a sanity check.")


# ----------------------------------------------------------------------- command line


def plot_pair(result: dict, sources: Sequence[str], targets: Sequence[str],
              golds: Sequence | None, pair: int, out: str) -> None:
    """PNG of pair `pair`: the forward reading's word matrix (the head's posterior or the
    layer's attention, `Recorded.word_matrix`) with the pair's final links (symmetrised,
    if so) as dots and its gold sure / possible links as squares."""
    from alignment.figures import alignment_figure
    from attention.heatmaps import save_png

    settings = result["settings"]
    matrix = result["recorded"].word_matrix(pair, settings["layer"], settings["shift"],
                                            prior_weight=settings["prior_weight"])
    sure, possible = golds[pair] if golds is not None else (None, None)
    fig = alignment_figure(matrix, targets[pair].split(), sources[pair].split(), sure=sure,
                           possible=possible, predicted=result["links"][pair],
                           title=textwrap.fill(f"pair {pair} · {describe(settings)}; "  # fits
                                               f"symmetrize {settings['symmetrize']}", 64),
                           xlabel="source words (</s> left out)", ylabel="target words")
    save_png(fig, out)


def score_lines(result: dict, dev: int, reinit_seed: int | None = None) -> list[str]:
    """stderr lines: AER / precision / recall in percent, all pairs first."""
    def line(name: str, s: dict) -> str:
        return (f"AER{name}: {100 * s['aer']:.2f} precision: {100 * s['precision']:.2f} "
                f"recall: {100 * s['recall']:.2f}")

    scores, settings = result["scores"], result["settings"]
    lines = [line("", scores["all"])]
    if "dev" in scores:
        lines += [line(f" first {dev}", scores["dev"]),
                  line(f" other {scores['test']['sentences']}", scores["test"])]
    one_map = settings["symmetrize"] != "none" and not settings["reverse"]
    lines.append(f"settings: {describe(settings)}; symmetrize {settings['symmetrize']}"
                 + (" (the map's argmax rows with its columns)" if one_map else "")
                 + (f"; reverse {settings['reverse']['workdir']}: {describe(settings['reverse'])}"
                    if settings["reverse"] else ""))
    if "grid" in result:
        lines.append(f"selected on the first {dev} pairs among {len(result['grid'])} settings, "
                     f"stored in <workdir>/{result_file(reinit_seed)}")
    return lines


def main(argv: list[str]) -> None:
    """absl main: checks the flags and files, aligns, prints links (and scores)."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = FLAGS
    if not f.workdir:
        raise UserError("--workdir is required")
    if bool(f.pairs) == bool(f.source or f.target) or bool(f.source) != bool(f.target):
        raise UserError("give --pairs FILE, or --source FILE and --target FILE")
    if f.select and not f.gold:
        raise UserError("--select needs --gold")
    if f.prior_weight is not None and not 0.0 <= f.prior_weight <= 1.0:
        raise UserError(f"--prior_weight must be in [0, 1], got {f.prior_weight:g}")
    if f.batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {f.batch_size}")
    if f.reinit_seed is not None and f.reinit_seed < 0:
        raise UserError(f"--reinit_seed must be >= 0, got {f.reinit_seed}")
    given = {"checkpoint": f.checkpoint, "shift": f.shift, "words": f.words,
             "layer": None if f.layer is None else parse_layer(f.layer),
             "heads": None if f.heads is None else parse_heads(f.heads),
             "threshold": None if f.threshold is None else parse_threshold(f.threshold),
             "prior_weight": f.prior_weight, "measure": f.measure}
    sources, targets = read_pairs(f.pairs) if f.pairs else read_sides(f.source, f.target)
    golds = read_gold(f.gold, sources, targets) if f.gold else None
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO lines on every restore
    from training.compilation import enable_compilation_cache

    enable_compilation_cache()
    if f.plot and not 0 <= f.plot_pair < len(sources):
        raise UserError(f"--plot_pair {f.plot_pair}: the input has pairs 0..{len(sources) - 1}")
    if f.plot:  # fail before the work, but after every check of the input: none leaves it
        prepare_output_folder(Path(f.plot).parent)
    options = dict(reverse_workdir=f.reverse_workdir, dev_sentences=f.dev_sentences,
                   batch_size=f.batch_size, keep_recorded=bool(f.plot), **given)
    options["reinit_seed"] = f.reinit_seed  # None: the checkpoints' parameters
    if f.select:
        inputs = {"pairs": f.pairs, "source": f.source, "target": f.target, "gold": f.gold}
        inputs = {k: v for k, v in inputs.items() if v}
        if f.reinit_seed is not None:
            inputs["reinit_seed"] = f.reinit_seed
        result = select(f.workdir, sources, targets, golds, inputs=inputs, **options)
    else:
        result = align(f.workdir, sources, targets, golds=golds, symmetrize_with=f.symmetrize,
                       **options)
    sys.stdout.write("".join(format_pharaoh(links) + "\n" for links in result["links"]))
    sys.stdout.flush()
    if f.plot:
        plot_pair(result, sources, targets, golds, f.plot_pair, f.plot)
    if golds is not None:
        dev = min(f.dev_sentences, len(sources)) if f.select else f.dev_sentences
        print("\n".join(score_lines(result, dev, f.reinit_seed)), file=sys.stderr)
    if f.reinit_seed is not None:
        print(f"parameters: re-initialised with seed {f.reinit_seed}, not the checkpoints'",
              file=sys.stderr)

