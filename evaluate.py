"""Evaluate a trained run with sacreBLEU / chrF, or translate any file or stdin (README, journey 2).

    python evaluate.py --workdir runs/de_en --split test --beam_size 5
    python evaluate.py --workdir runs/de_en --source talk.de [--reference talk.en]
    cat talk.de | python evaluate.py --workdir runs/de_en --source - > talk.en
    python evaluate.py --workdir runs/de_en --ensemble runs/de_en_2,runs/de_en_3
    python evaluate.py --workdir runs/de_en_seeds     # the parent of `train.py --seeds N`

Flags (defaults in brackets):
  --workdir            a training run directory (required, but for --seed_results)
  --split              valid | test of the configured dataset [test, unless --source];
                       train: every training pair as read, empty lines included (the
                       text a distillation teacher translates: docs/training.md)
  --source, --reference  any text file (plain or gzip; `-` = stdin) instead of --split;
                       without --reference only translations are written
  --checkpoint         best | last | STEP [best; `last` with --average_last]. `best` is the
                       step with the highest validation BLEU, or the lowest validation
                       loss for a run with train.patience_metric=loss (orbax metrics, or
                       the `best_step` the training loop records when none are stored)
  --average_last N     average the parameters of the N most recent saved checkpoints up
                       to and including --checkpoint's step [0 = off]
  --beam_size          1 = greedy [the config's eval.beam_size]
  --length_penalty     GNMT alpha of beam search [the config's eval.length_penalty]
  --batch_size         sentences per batch [the config's eval.batch_size]
  --compat_lc_tok      also report BLEU on lowercased, Moses-tokenized text (sacremoses,
                       then sacreBLEU tokenize="none"): the metric of the Multi30k literature.
                       A run trained with data.text_protocol=lc_norm_tok always scores
                       that way, against the official lc.norm.tok references as they are
                       (--source/--reference files are raw text, put into the protocol)
  --save_attention N   record the attention maps of the returned hypotheses of the first
                       N sentences [0]
  --contributions      with --save_attention: also the norm-based maps and ALTI+ source /
                       target contributions (models/contributions.py) in the map file
  --max_sentences N    only the first N lines of the input [0 = all]
  --ensemble W2[,W3..] decode --workdir and these runs as one ensemble (models/ensemble.py:
                       the mean of their log-probabilities at each step; maps of the
                       first); they must share its tokenizer and direction [none]
  --name               output name [see below]
  --seed_results F1,.. --output OUT.json  summarize stored per-seed results (below)

Outputs, in `<workdir>/eval/` (each written atomically, so a failed or interrupted run
never leaves a half file over a good one):
  <name>.hyp.txt        written as soon as decoding ends, before any attention map is
                        recorded (a failed or interrupted map recording leaves it on disk);
                        one detokenized line per input line, same order; an empty input
                        line gives an empty line (the model is not run on it), long
                        lines are translated in full (nothing is dropped or truncated)
  <name>.json           written last, once everything else succeeded: name, workdir,
                        split, source, reference, source_lang, target_lang,
                        text_protocol (data/protocol.py: "raw", or "lc_norm_tok" whose
                        hypotheses and scores are lowercased Moses-tokenised text and
                        whose bleu is also bleu_lc_tok), num_sentences, num_empty, checkpoint_step,
                        checkpoint {requested, steps, averaged}, decoding {beam_size,
                        decode, length_penalty, batch_size, bucket_step, max_length},
                        bleu, bleu_signature, bleu_text, bleu_details {precisions, bp,
                        ratio, hyp_len, ref_len}, chrf, chrf_signature, chrf_text (scores
                        are null without a reference), with --compat_lc_tok bleu_lc_tok,
                        bleu_lc_tok_signature, bleu_lc_tok_preprocessing,
                        bleu_lc_tok_text; with --ensemble: ensemble (the member workdirs,
                        --workdir first), checkpoint.member_steps; with eval.detokenize
                        (lc_norm_tok runs): bleu_detok, bleu_detok_signature,
                        bleu_detok_text, bleu_detok_note (lowercase output against the
                        raw references: not comparable with a cased BLEU); files {hyp,
                        json[, detok_hyp][, attention]}; timing {load_seconds, decode_seconds, compile_seconds,
                        sentences_translated, target_tokens, sentences_per_sec,
                        target_tokens_per_sec[, attention_seconds,
                        attention_record_seconds, attention_preview_seconds]}; devices; time
  <name>.detok.hyp.txt  with eval.detokenize (lc_norm_tok runs): the hypotheses Moses-
                        detokenised (sacremoses), still lowercase
  <name>.attention.npz  with --save_attention: an attention map file (README) (decode "greedy" or
                        "beam"), recorded in batches of sentences of similar length (a
                        very long sentence costs only its own size); plus PNG previews
                        `<name>.attention.ex<I>.cross.*.png` of the first 8 of those
                        sentences, except those over 150 source or target tokens (a
                        one-line notice on stderr says so: see the .npz or its --html)
From Python, with the flags as keyword options (no flags are parsed):

    from evaluate import evaluate
    result = evaluate("runs/de_en", split="test", beam_size=1)   # the JSON below, as a dict

The default `<name>` is `<base>.step<S>.<decode>`: base = the split, the source file's
name without `.gz` / `.txt` (`talk.de`), or `stdin`; S = the checkpoint step (averaged:
`avg<N>-step<S>`, S the newest); decode = `greedy` or `beam<K>`, e.g.
`test.step20000.beam5`; an ensemble of M runs adds `.ens<M>` before the decode part, and
a `--length_penalty` given (beam search only) adds `.lp<P>` after it
(`valid.avg10-step8000.beam5.lp1.5`), so readings at several penalties do not overwrite one
another.

A `--workdir` that is the parent of `train.py --seeds N` runs (`seed<k>/` folders with a
config.json, none of its own) evaluates every seed run with the same options (each
writes its own `seed<k>/eval/` files, as above), then writes `<workdir>/eval/<name>.json`:
the mean over seeds of bleu and bleu_lc_tok (with --compat_lc_tok), then their sample
standard deviations bleu_std, bleu_lc_tok_std, chrf and chrf_std, per_seed {score:
[values]}, workdirs (the seed runs), the scores' signatures (bleu_signature,
bleu_lc_tok_signature, bleu_lc_tok_preprocessing, chrf_signature; the seeds must agree
on them), name, workdir, num_seeds, split, source, reference,
checkpoint_steps (per seed), decoding, files {json, seeds}, time. `<name>` is the seeds'
own name, with the requested checkpoint (`best`, `last`) when their steps differ.
With `best` or `last`, every seed run must have finished training (a seed still
training would be averaged with the others as it stands); `--checkpoint STEP` reads
the same step of each, finished or not.
Seeds whose runs are no longer side by side (trained in other sessions or on other
machines) are summarized from their stored results, without decoding:

    python evaluate.py --seed_results results/multi30k_de_en_seed1.json,results/multi30k_de_en_seed2.json,results/multi30k_de_en_seed3.json \\
        --output results/multi30k_de_en.json

writes the same summary to `--output` (its name is the file's stem, its workdir the
seed runs' common parent, else null). The files must be scored results of different
runs that share the direction, split, source, reference, number of sentences, beam
size, length penalty, checkpoint rule and number of averaged checkpoints, and the
scores they carry.

stdout gets `BLEU = ...` with the sacreBLEU signature, chrF, the number of sentences
and the decoding speed. With `--source -` stdout gets the translations instead (one
line per input line) and the summary goes to stderr. A progress bar runs on stderr.

Bad input (no checkpoint, damaged checkpoint, missing or non-UTF-8 file, mismatched
line counts, a tokenizer that does not fit the checkpoint, ensemble members with another
tokenizer, an --ensemble member that is --workdir itself or given twice, stdin for seed
runs, an unfinished seed run) gives one `error: ...` line on stderr and exit code 2,
before anything is written: no eval/ folder appears until every check has passed and
every checkpoint has been read. Input files are checked before JAX is even imported, so
such errors come back in about a second.

Writing into `<workdir>/eval/`, evaluate.py holds the workdir's lock, shared
(common/workdir_lock.py): evaluations of one run go side by side, but a run that is
being trained (train.py holds it) is refused in one line naming the training, and a
training does not start while an evaluation writes. Runs that are only read (the
--ensemble members) are not locked.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import time
from pathlib import Path

from absl import flags
from absl import logging as absl_logging

from common import cli
from common.errors import UserError
from common.files import prepare_output_folder, write_atomic
from common.workdir_lock import evaluation_locks
from configs import resolved
from evaluation import seeds
from evaluation.inputs import output_base, read_inputs
from evaluation.loading import check_ensemble, checkpoint_dir, load_params, load_tokenizer

FLAGS = flags.FLAGS
EVAL_DIR = "eval"


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """The options of `evaluate`, named and defaulted like the flags (module docstring);
    None takes the run's config value."""

    split: str | None = None
    source: str | None = None
    reference: str | None = None
    checkpoint: str | None = None
    average_last: int = 0
    beam_size: int | None = None
    length_penalty: float | None = None
    batch_size: int | None = None
    compat_lc_tok: bool = False
    save_attention: int = 0
    contributions: bool = False
    max_sentences: int = 0
    name: str | None = None
    ensemble: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A list from the flag or from Python, or one comma-separated string.
        members = self.ensemble.split(",") if isinstance(self.ensemble, str) else self.ensemble
        object.__setattr__(self, "ensemble", tuple(str(w) for w in members if str(w)))
        minimums = {"beam_size": 1, "batch_size": 1, "average_last": 0, "save_attention": 0,
                    "max_sentences": 0}
        for key, low in minimums.items():
            value = getattr(self, key)
            if value is not None and value < low:
                raise UserError(f"--{key} must be at least {low}, got {value}")
        if self.contributions and not self.save_attention:
            raise UserError("--contributions only applies with --save_attention N")
        if self.length_penalty is not None and self.length_penalty < 0:
            raise UserError(f"--length_penalty must be >= 0, got {self.length_penalty}")
        if self.split not in (None, "valid", "test", "train"):
            raise UserError(f"--split must be valid, test or train, got {self.split!r}")
        which = self.checkpoint
        if which is not None and which not in ("best", "last") and not which.isdigit():
            raise UserError(f"--checkpoint must be best, last or a step number, got {which!r}")
        if self.name is not None:
            check_name(self.name)


FLAG_HELP = {
    "split": "valid | test | train: a split of the configured dataset (default test, unless "
             "--source is given); train is every training pair as read, the text a "
             "distillation teacher translates.",
    "source": "Source text file to translate (plain or gzip); '-' reads stdin.",
    "reference": "Reference translations of --source (optional; '-' reads stdin).",
    "checkpoint": "best | last | a step number (default best; last with --average_last).",
    "average_last": "Average the parameters of the N most recent saved checkpoints up to "
                    "--checkpoint (0 = off).",
    "beam_size": "Beam size; 1 = greedy (default: config eval.beam_size).",
    "length_penalty": "GNMT length penalty alpha for beam search (default: config "
                      "eval.length_penalty).",
    "batch_size": "Sentences per batch (default: config eval.batch_size).",
    "compat_lc_tok": "Also report BLEU on lowercased, Moses-tokenized text (the Multi30k "
                     "literature's metric).",
    "save_attention": "Save attention maps of the first N sentences.",
    "contributions": "With --save_attention: also norm-based maps and ALTI+ contributions.",
    "max_sentences": "Only the first N input lines (0 = all).",
    "name": "Output name in <workdir>/eval/ (default <split|source stem>.step<S>."
            "<greedy|beamK>).",
    "ensemble": "Other runs decoded with --workdir as one ensemble (mean of the models' "
                "log-probabilities; same tokenizer).",
}


def define_flags() -> None:
    """Defines the command-line flags, one per `EvalOptions` field (only when run as a
    script, so that importing this module never clashes with other flags)."""
    flags.DEFINE_string("workdir", None, "Training run directory (config.json, tokenizer/, "
                        "checkpoints/).")
    define = {"str": flags.DEFINE_string, "int": flags.DEFINE_integer,
              "float": flags.DEFINE_float, "bool": flags.DEFINE_bool,
              "tuple[str, ...]": flags.DEFINE_list}
    for field in dataclasses.fields(EvalOptions):
        kind = str(field.type).split(" |")[0]  # "int | None" -> "int"
        define[kind](field.name, field.default, FLAG_HELP[field.name])
    flags.DEFINE_list("seed_results", [], "Summarize these stored evaluate.py JSON files of "
                      "one recipe's seeds into --output, instead of evaluating a --workdir.")
    flags.DEFINE_string("output", None, "The summary file of --seed_results (.json).")


# --------------------------------------------------------------------------- outputs


def checkpoint_label(steps: list[int]) -> str:
    """`step<S>`, or `avg<N>-step<S>` for the mean of N checkpoints up to step S."""
    return f"step{steps[-1]}" if len(steps) == 1 else f"avg{len(steps)}-step{steps[-1]}"


def default_name(base: str, checkpoint: str, beam_size: int, members: int = 1,
                 length_penalty: float | None = None) -> str:
    """`<base>.<checkpoint>[.ens<M>].<greedy|beamK>[.lp<P>]` (M: the models of an ensemble;
    P: a `--length_penalty` given on the command line, so that readings of one checkpoint
    at several penalties sit side by side instead of overwriting one another; greedy
    decoding has no penalty)."""
    ensemble = f".ens{members}" if members > 1 else ""
    decode = "greedy" if beam_size == 1 else f"beam{beam_size}"
    penalty = f".lp{length_penalty}" if length_penalty is not None and beam_size > 1 else ""
    return f"{base}.{checkpoint}{ensemble}.{decode}{penalty}"


def check_name(name: str) -> str:
    """`--name` as given, if it is a plain file name: outputs never land outside eval/."""
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise UserError(f"--name {name!r}: must be a plain file name (no '/')")
    return name


# ------------------------------------------------------------------------------ main


def evaluate(workdir: str | Path, **options) -> dict:
    """The whole evaluation of a run; returns the result JSON (module docstring), also
    written to `<workdir>/eval/`. `options` are `EvalOptions` fields, named like the flags.

    Raises UserError for bad input before anything is written, and when a training holds
    the workdir (common/workdir_lock.py: evaluate.py writes there beside other
    evaluations, never into a run being trained).
    """
    workdir, opts = Path(workdir), EvalOptions(**options)
    seed_runs = seeds.seed_runs_of(workdir)
    if seed_runs:
        return evaluate_seeds(workdir, seed_runs, opts)
    run = prepare(workdir, opts)
    check_output_folder(workdir / EVAL_DIR)
    with evaluation_locks([workdir]):
        return decode_and_write(run, prepare_output_folder(workdir / EVAL_DIR))


def check_output_folder(folder: Path) -> None:
    """Refuses a `folder` that a file is in the way of, before the lock is taken (taking
    it touches the workdir) and without creating anything."""
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                raise UserError(f"{path} is a file, not a folder")
            return


@dataclasses.dataclass
class Prepared:
    """An evaluation whose every check has passed (`prepare`): inputs read, models loaded."""

    workdir: Path
    opts: EvalOptions
    members: list[Path]  # --workdir, then the --ensemble runs
    cfg: object  # the config of --workdir (ml_collections.ConfigDict)
    inputs: object  # evaluation.inputs.Inputs
    tokenizer: object
    runs: list  # evaluation.loading.LoadedParams, one per member
    model: object  # the model, or the ensemble of the members' models
    name: str
    beam_size: int
    batch_size: int
    length_penalty: float
    load_seconds: float


def check_ensemble_members(workdir: Path, ensemble: tuple[str, ...]) -> list[Path]:
    """[--workdir, *--ensemble], refusing a member that is --workdir itself or given
    twice (the same folder once paths are resolved): the ensemble of a model with itself
    decodes that one model at twice the cost."""
    members = [workdir, *map(Path, ensemble)]
    seen: dict[Path, Path] = {}
    for member in members:
        real = member.resolve()
        if real in seen:
            what = "--workdir itself" if seen[real] == workdir else f"given twice ({seen[real]})"
            raise UserError(f"--ensemble {member} is {what}: an ensemble of one model with "
                            "itself decodes that model alone, at twice the cost")
        seen[real] = member
    return members


def detokenizes(cfg) -> bool:
    """Whether the run's config asks for Moses-detokenised output too (`eval.detokenize`,
    under a tokenised `data.text_protocol` only: configs/validation.py)."""
    from data.protocol import RAW, protocol_of

    return bool(cfg.eval.get("detokenize", False)) and protocol_of(cfg.data) != RAW


def prepare(workdir: Path, opts: EvalOptions) -> Prepared:
    """Every check of an evaluation (inputs, configs, tokenizers, the ensemble, the
    checkpoints, read in full), with nothing written. UserError for bad input."""
    members = check_ensemble_members(workdir, opts.ensemble)  # the first one's maps are recorded
    cfgs = [resolved.load_config_json(w) for w in members]
    cfg = cfgs[0]
    inputs = read_inputs(cfg, opts.split, opts.source, opts.reference, opts.max_sentences,
                         raw_references=detokenizes(cfg))
    tokenizers = [load_tokenizer(w, c) for w, c in zip(members, cfgs, strict=True)]
    tokenizer = tokenizers[0]
    if len(members) > 1:
        check_ensemble(members, cfgs, tokenizers)
    for member in members:
        checkpoint_dir(member)
    beam_size = opts.beam_size or int(cfg.eval.beam_size)

    # JAX is imported only now: bad input files are reported in about a second.
    from models.ensemble import Ensemble
    from training.compilation import enable_compilation_cache

    enable_compilation_cache()
    load_start = time.perf_counter()
    # Loading restores every array: a truncated or damaged checkpoint is refused here.
    runs = [load_params(w, opts.checkpoint, opts.average_last, cfg=c, tokenizer=t)
            for w, c, t in zip(members, cfgs, tokenizers, strict=True)]
    # One model is decoded as itself: the ensemble wrapper only when there are several.
    model = runs[0].model if len(runs) == 1 else Ensemble([run.model for run in runs])
    load_seconds = time.perf_counter() - load_start
    name = opts.name or default_name(inputs.base, checkpoint_label(runs[0].steps), beam_size,
                                     len(members), opts.length_penalty)
    return Prepared(
        workdir=workdir, opts=opts, members=members, cfg=cfg, inputs=inputs,
        tokenizer=tokenizer, runs=runs, model=model, name=name, beam_size=beam_size,
        batch_size=opts.batch_size or int(cfg.eval.batch_size),
        length_penalty=(opts.length_penalty if opts.length_penalty is not None
                        else float(cfg.eval.length_penalty)),
        load_seconds=load_seconds)


def decode_and_write(run: Prepared, out_dir: Path) -> dict:
    """Decodes a prepared evaluation, writes its files into `out_dir`; returns the result."""
    import jax

    from data.protocol import detokenize, protocol_of
    from evaluation.corpus import save_attention, summary_lines, translate_lines
    from evaluation.scoring import score, score_detokenized

    cfg, opts, inputs, tokenizer, name = run.cfg, run.opts, run.inputs, run.tokenizer, run.name
    beam_size, batch_size, length_penalty = run.beam_size, run.batch_size, run.length_penalty
    loaded, bucket_step = run.runs[0], int(cfg.data.bucket_step)
    if cfg.model.positions == "learned":
        longest = max(len(s) for s in tokenizer.encode_source(inputs.sources))
        if 1.5 * longest + 10 > cfg.model.max_positions:
            print(f"warning: the longest source has {longest} tokens; translations longer "
                  f"than model.max_positions={cfg.model.max_positions} learned positions "
                  "degrade", file=sys.stderr)

    hyps, timing = translate_lines(run.model, tokenizer, inputs.sources, beam_size=beam_size,
                                   length_penalty=length_penalty, batch_size=batch_size,
                                   bucket_step=bucket_step, progress=True)
    timing["load_seconds"] = run.load_seconds
    files = {"hyp": str(out_dir / f"{name}.hyp.txt"), "json": str(out_dir / f"{name}.json")}
    # The translations are written the moment decoding ends: recording maps may take
    # long (or fail, or be interrupted) and must never hold them back.
    write_atomic(Path(files["hyp"]), "".join(h + "\n" for h in hyps))
    shown = hyps
    if detokenizes(cfg):  # the protocol's text made readable (still lowercase)
        shown = detokenize(hyps, cfg.data.target_lang)
        files["detok_hyp"] = str(out_dir / f"{name}.detok.hyp.txt")
        write_atomic(Path(files["detok_hyp"]), "".join(h + "\n" for h in shown))
    if inputs.source_name == "<stdin>":
        sys.stdout.write("".join(h + "\n" for h in shown))
        sys.stdout.flush()
    result = {
        "name": name,
        "workdir": str(run.workdir),
        "split": inputs.split,
        "source": inputs.source_name,
        "reference": inputs.reference_name,
        "source_lang": cfg.data.source_lang,
        "target_lang": cfg.data.target_lang,
        "text_protocol": protocol_of(cfg.data),
        "num_sentences": len(inputs.sources),
        "num_empty": len(inputs.sources) - timing["sentences_translated"],
        "checkpoint_step": loaded.steps[-1],
        "checkpoint": {"requested": loaded.requested, "steps": loaded.steps,
                       "averaged": len(loaded.steps) > 1},
        "decoding": {"beam_size": beam_size, "decode": "greedy" if beam_size == 1 else "beam",
                     "length_penalty": length_penalty, "batch_size": batch_size,
                     "bucket_step": bucket_step,
                     "max_length": "ceil(1.5 * source tokens + 10), per batch"},
        "bleu": None,
        "chrf": None,
    }
    if len(run.members) > 1:
        result["ensemble"] = [str(w) for w in run.members]
        result["checkpoint"]["member_steps"] = [member.steps for member in run.runs]
    if inputs.references is not None:
        result.update(score(hyps, inputs.references, compat_lc_tok=opts.compat_lc_tok,
                            target_lang=cfg.data.target_lang,
                            text_protocol=protocol_of(cfg.data)))
    if inputs.raw_references is not None and "detok_hyp" in files:
        result.update(score_detokenized(shown, inputs.raw_references))
    if opts.save_attention:
        start = time.perf_counter()
        path, attention_timing = save_attention(
            run.model, tokenizer, inputs.sources, opts.save_attention, beam_size=beam_size,
            length_penalty=length_penalty, batch_size=batch_size, step=loaded.steps[-1],
            out_dir=out_dir, stem=f"{name}.attention", progress=True,
            contributions=opts.contributions)
        timing["attention_seconds"] = time.perf_counter() - start
        timing.update(attention_timing)
        files["attention"] = str(path)
    result.update(files=files, timing=timing,
                  devices=f"{jax.default_backend()} x{jax.device_count()}", time=time.time())
    # Last: the JSON names the map file and its timing.
    write_atomic(Path(files["json"]), json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    summary = sys.stderr if inputs.source_name == "<stdin>" else sys.stdout
    print("\n".join(summary_lines(result)), file=summary, flush=True)
    return result


def evaluate_seeds(parent: Path, runs: list[Path], opts: EvalOptions) -> dict:
    """`evaluate` of every seed run under `parent` with the same options, then their
    scores over seeds (evaluation/seeds.py) in `<parent>/eval/<name>.json` (module docstring);
    returns that summary. Every run is checked, and its checkpoints loaded, before any is
    evaluated (so the seeds' models are in memory together)."""
    if opts.ensemble:
        raise UserError(f"--ensemble takes training workdirs; {parent} is a parent of seed runs")
    if "-" in (opts.source, opts.reference):
        raise UserError(f"{parent} holds {len(runs)} seed runs: stdin ('-') can be read only "
                        "once, give --source a file")
    seeds.check_seed_runs(runs, opts.checkpoint)  # each whole (and done), or none evaluated
    prepared = [prepare(run, opts) for run in runs]
    for folder in (parent, *runs):
        check_output_folder(folder / EVAL_DIR)
    with evaluation_locks([parent, *runs]):
        out_dir = prepare_output_folder(parent / EVAL_DIR)
        results = [decode_and_write(run, prepare_output_folder(run.workdir / EVAL_DIR))
                   for run in prepared]
        first = results[0]
        if len({tuple(r["checkpoint"]["steps"]) for r in results}) == 1:
            label = checkpoint_label(first["checkpoint"]["steps"])
        else:  # e.g. each seed's own best step
            averaged = f"avg{opts.average_last}-" if opts.average_last else ""
            label = averaged + first["checkpoint"]["requested"]
        name = opts.name or default_name(output_base(opts.split, opts.source), label,
                                         first["decoding"]["beam_size"],
                                         length_penalty=opts.length_penalty)
        summary = seeds.summary_record(results, name=name, workdir=str(parent),
                                       json_path=out_dir / f"{name}.json",
                                       seed_files=[r["files"]["json"] for r in results])
        write_atomic(out_dir / f"{name}.json",
                     json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    print("\n".join(seeds.summary_lines(summary)), flush=True)
    return summary


def _quiet_coroutines(unraisable) -> None:
    if not inspect.iscoroutine(unraisable.object):
        sys.__unraisablehook__(unraisable)


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO/WARNING chatter
        # A failed orbax restore leaves async read coroutines behind whose exceptions
        # Python would print at exit ("Exception ignored in: <coroutine ...>"), after
        # our one-line error. They carry nothing the error line does not say.
        sys.unraisablehook = _quiet_coroutines
    if FLAGS.seed_results or FLAGS.output:
        if FLAGS.workdir or not (FLAGS.seed_results and FLAGS.output):
            raise UserError("--seed_results and --output go together, without --workdir")
        summary = seeds.summarize_files(FLAGS.seed_results, FLAGS.output)
        print("\n".join(seeds.summary_lines(summary)), flush=True)
        return
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    evaluate(FLAGS.workdir, **{f.name: FLAGS[f.name].value
                               for f in dataclasses.fields(EvalOptions)})


if __name__ == "__main__":
    define_flags()
    cli.run(main)
