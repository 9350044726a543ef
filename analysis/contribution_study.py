"""Do the attention measures agree, and does ALTI+'s source share say anything about a
translation? A study of one run over a corpus (docs/contributions.md).

    python -m analysis.contribution_study --workdir pretrained/de_en_cpu --split test \\
        --beam_size 5 [--checkpoint best] [--average_last N] [--length_penalty A]
        [--source F --reference F] [--max_sentences N] [--reinit_seed N]
        [--gold_pairs P --gold G] [--json OUT.json] [--figures DIR] [--lowest 10]

Decodes every source as evaluate.py does (`models.translate.translate_ids`: the config's
or the given beam size and length penalty, the checkpoint or the mean of the last N),
then teacher-forces each hypothesis through the model and reads, per sentence with S
source pieces (its `</s>` included) and T target steps (the rows fed `<s>` and each
hypothesis piece; row t predicts piece t+1, the last one `</s>`):
  * weights [L, H, T, S]: the cross-attention weights;
  * norm [L, H, T, S]: the norm-based maps ||alpha f(x)|| (Kobayashi et al. 2020);
  * alti [T, S]: ALTI+'s source contributions of the whole model (Ferrando et al. 2022);
  * source share [T]: the row sums of alti (models/contributions.py).

**Source share as a signal.** The sentence's share is the mean of its T steps' source
shares. Its Spearman and Pearson correlations (scipy.stats) with sacreBLEU's
`sentence_bleu` and `sentence_chrf` of the hypothesis against its reference, the same
Spearman correlations with the number of target steps held fixed (a longer hypothesis
has more prefix to draw on: `partial_rank_correlation`), and the `--lowest` sentences by
share (Ferrando et al. 2022's hallucination check).

**Agreement of the measures.** Spearman's rank correlation of two maps of one sentence
over all its T x S cells, each map's rows first normalised to sum 1 (a row of the
weights already does; a norm-based row sums to the step's total norm and an ALTI+ row to
its source share, which would otherwise rank whole rows above others: the comparison
is of *where* each step looks, its amount is the source share's business). Compared:
  weights_vs_norm            per decoder layer and head ([L, H] per sentence);
  weights_vs_norm_last       the last layer's maps, heads averaged (then normalised);
  weights_vs_alti_last       the same weights against ALTI+ (the whole model's map);
  norm_vs_alti_last          the last layer's norm-based map against ALTI+;
  *_mean                     the same with the maps averaged over layers and heads.
A sentence whose maps are constant (S = 1) has no rank correlation and is left out
(counted in `n`).

`--reinit_seed N` runs the same study on the same architecture with fresh random
parameters (`evaluation.loading.reinitialised`): Adebayo et al. 2018's model
randomisation check. `--gold_pairs P --gold G` adds the AER of the diagonal reading
(`diagonal_links`: target word j linked to source word floor((j + 1/2) m / n) of m
source and n target words), the floor any alignment reading should clear.

Writes `--json` (default `<workdir>/eval/contribution_study.<base>.json`, base the split
or the source file's stem) and two PNG figures in `--figures` (default the JSON's
folder), `<json stem>_share.png` (share against sentence chrF and BLEU, the lowest
marked) and `<json stem>_agreement.png` (the mean weights-vs-norm correlation per layer
and head, and each pair's distribution over sentences). JSON schema:

    {"workdir", "split", "source", "reference", "num_sentences",
     "checkpoint": {"requested", "steps", "reinit_seed"},
     "decoding": {"beam_size", "length_penalty", "batch_size"},
     "scores": {"bleu", "chrf", "bleu_signature", "chrf_signature"},   # corpus, cased
     "source_share": {"mean", "std", "min", "max",                     # over sentences
                      "correlations": {"bleu" | "chrf" | "target_steps": {"spearman",
                                       "spearman_p", "pearson", "pearson_p", "n"}},
                      "partial_given_target_steps": {"bleu", "chrf"},
                      "lowest": [{"index", "source", "hypothesis", "reference",
                                  "share", "bleu", "chrf"}, ...]},     # lowest share first
     "agreement": {"method": str,
                   "per_head": {"weights_vs_norm": {"mean": [L][H], "std": [L][H]}},
                   "pairs": {PAIR: {"mean", "std", "median", "q10", "q90", "n"}}},
     "per_sentence": {"share", "bleu", "chrf", "target_steps", "source_pieces",
                      PAIR...: [N] (null where undefined)},
     "diagonal_baseline": {"pairs", "gold", "scores": {"all", "dev", "test"}},  # with --gold
     "figures": [paths], "seconds": {...}}

From Python: `study(workdir, **options) -> dict` (the JSON).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from absl import flags
from absl import logging as absl_logging

from common import cli
from common.errors import UserError
from common.files import prepare_output_folder, require_file, write_atomic
from common.workdir_lock import evaluation_locks
from configs import resolved

PAIRS = ("weights_vs_norm_last", "weights_vs_alti_last", "norm_vs_alti_last",
         "weights_vs_norm_mean", "weights_vs_alti_mean", "norm_vs_alti_mean")
AGREEMENT_METHOD = ("Spearman rank correlation over a sentence's T x S cells (T target steps, "
                    "S source pieces with </s>), each map's rows normalised to sum 1 first; "
                    "_last: last decoder layer, heads averaged; _mean: layers and heads "
                    "averaged; alti: ALTI+ source contributions of the whole model")
LENGTH_MULTIPLE = 8  # teacher-forced batches pad S and T to this: few compilations
DIGITS = 5  # per-sentence figures in the JSON are rounded to this many decimals


# ----------------------------------------------------------------------- measures


def sentence_share(source_share: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
    """Each sentence's mean source share over its valid target steps.

    source_share: float [N, T] (ALTI+ source share per step, anything past a sentence's
    length ignored); target_lengths: int [N], each >= 1. Returns float64 [N].
    """
    share = np.asarray(source_share, np.float64)
    lengths = np.asarray(target_lengths)
    if share.ndim != 2 or lengths.shape != share.shape[:1]:
        raise ValueError(f"source_share must be [N, T] and target_lengths [N], got "
                         f"{share.shape} and {lengths.shape}")
    if (lengths < 1).any() or (lengths > share.shape[1]).any():
        raise ValueError("every target length must be in 1..T")
    valid = np.arange(share.shape[1])[None, :] < lengths[:, None]
    return np.where(valid, share, 0.0).sum(1) / lengths


def rank_correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation of `a` and `b` over their last axis (average ranks
    for ties), for every leading index: a, b float [..., K] -> float64 [...]; NaN where
    either side is constant (K = 1 included)."""
    from scipy.stats import rankdata

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra, rb = ra - ra.mean(-1, keepdims=True), rb - rb.mean(-1, keepdims=True)
    denominator = np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (ra * rb).sum(-1) / denominator, np.nan)


def row_normalised(maps: np.ndarray) -> np.ndarray:
    """Each row (last axis) divided by its sum: float [..., T, S] -> float64 [..., T, S];
    a row summing to 0 stays 0."""
    maps = np.asarray(maps, np.float64)
    sums = maps.sum(-1, keepdims=True)
    return np.divide(maps, sums, out=np.zeros_like(maps), where=sums > 0)


def measure_agreement(weights: np.ndarray, norm: np.ndarray, alti: np.ndarray) -> dict:
    """The agreement of one sentence's maps (module docstring).

    weights, norm: float [L, H, T, S] (cross-attention weights, norm-based maps);
    alti: float [T, S] (ALTI+ source contributions). Returns {"weights_vs_norm":
    float64 [L, H], and each of PAIRS: a float (NaN where a map is constant)}.
    """
    weights, norm, alti = (np.asarray(x, np.float64) for x in (weights, norm, alti))
    if weights.shape != norm.shape or weights.ndim != 4 or alti.shape != weights.shape[2:]:
        raise ValueError(f"weights and norm must be [L, H, T, S] and alti [T, S], got "
                         f"{weights.shape}, {norm.shape}, {alti.shape}")
    layers, heads = weights.shape[:2]
    w, n = row_normalised(weights), row_normalised(norm)
    flat = (layers, heads, -1)
    out: dict = {"weights_vs_norm": rank_correlation(w.reshape(flat), n.reshape(flat))}
    a = row_normalised(alti).ravel()
    readings = {"last": (weights[-1].mean(0), norm[-1].mean(0)),
                "mean": (weights.mean((0, 1)), norm.mean((0, 1)))}
    for name, (w_map, n_map) in readings.items():
        w_map, n_map = row_normalised(w_map).ravel(), row_normalised(n_map).ravel()
        out[f"weights_vs_norm_{name}"] = float(rank_correlation(w_map, n_map))
        out[f"weights_vs_alti_{name}"] = float(rank_correlation(w_map, a))
        out[f"norm_vs_alti_{name}"] = float(rank_correlation(n_map, a))
    return out


def correlations(x: Sequence[float], y: Sequence[float]) -> dict:
    """Spearman and Pearson correlations of two [N] series (scipy.stats), NaN pairs left
    out: {"spearman", "spearman_p", "pearson", "pearson_p", "n"} (None where undefined:
    fewer than 3 pairs or a constant series)."""
    from scipy.stats import pearsonr, spearmanr

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    out: dict = {"spearman": None, "spearman_p": None, "pearson": None, "pearson_p": None,
                 "n": int(keep.sum())}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    s, p = spearmanr(x, y)
    r, q = pearsonr(x, y)
    out.update(spearman=float(s), spearman_p=float(p), pearson=float(r), pearson_p=float(q))
    return out


def partial_rank_correlation(x: Sequence[float], y: Sequence[float],
                             control: Sequence[float]) -> float | None:
    """Spearman's correlation of two [N] series with a third held fixed: the Pearson
    correlation of the ranks of x and of y, each with its least-squares line on the ranks
    of `control` taken out. None with fewer than 4 values or a constant residual."""
    from scipy.stats import rankdata

    x, y, z = (rankdata(np.asarray(v, np.float64)) for v in (x, y, control))
    if len(x) < 4:
        return None
    design = np.column_stack([z, np.ones_like(z)])
    rx, ry = (v - design @ np.linalg.lstsq(design, v, rcond=None)[0] for v in (x, y))
    denominator = np.sqrt((rx**2).sum() * (ry**2).sum())
    return None if denominator <= 1e-12 * len(x) else float((rx * ry).sum() / denominator)


def distribution(values: Sequence[float]) -> dict:
    """{"mean", "std", "median", "q10", "q90", "n"} of the non-NaN values (None if none)."""
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return {"mean": None, "std": None, "median": None, "q10": None, "q90": None, "n": 0}
    q10, median, q90 = np.quantile(v, [0.1, 0.5, 0.9])
    return {"mean": float(v.mean()), "std": float(v.std()), "median": float(median),
            "q10": float(q10), "q90": float(q90), "n": int(len(v))}


def sentence_scores(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list, list]:
    """sacreBLEU's `sentence_bleu` and `sentence_chrf` of each hypothesis against its
    reference: two [N] lists of floats (0-100)."""
    from sacrebleu import sentence_bleu, sentence_chrf

    pairs = list(zip(hypotheses, references, strict=True))
    return ([sentence_bleu(h, [r]).score for h, r in pairs],
            [sentence_chrf(h, [r]).score for h, r in pairs])


def diagonal_links(source_words: int, target_words: int) -> list[tuple[int, int]]:
    """The diagonal reading of a pair of m source and n target words: target word j
    linked to source word floor((j + 1/2) m / n) (0-indexed (i, j) links, one per target
    word; none when a side is empty)."""
    if source_words < 1 or target_words < 1:
        return []
    return [(min(source_words - 1, int((j + 0.5) * source_words / target_words)), j)
            for j in range(target_words)]


def diagonal_baseline(pairs: str | Path, gold: str | Path, dev: int = 100) -> dict:
    """AER / precision / recall of `diagonal_links` on gold pairs: {"all", "dev" (the first
    `dev`), "test" (the others)} as `alignment.aligner.split_scores` gives them."""
    from alignment.aligner import split_scores
    from alignment.links import read_gold, read_pairs

    sources, targets = read_pairs(pairs)
    golds = read_gold(gold, sources, targets)
    links = [diagonal_links(len(s.split()), len(t.split())) for s, t in zip(sources, targets,
                                                                            strict=True)]
    return split_scores(links, golds, dev)


# ------------------------------------------------------------------ the model's maps


@functools.cache
def _measures_fn():
    """The jitted (graphdef [static], state, src [B, S], tgt_in [B, T]) -> (cross weights
    [L, B, H, T, S], norm_cross [B, L, H, T, S], alti_source [B, T, S], source_share
    [B, T]) of a teacher-forced batch (one function per process: its compilations are
    kept)."""
    import jax
    from flax import nnx

    from models.contributions import contributions

    @functools.partial(jax.jit, static_argnums=0)
    def fn(graphdef, state, src, tgt_in):
        model = nnx.merge(graphdef, state)
        _, weights = model(src, tgt_in, return_weights=True)
        c = contributions(model, src, tgt_in)
        return weights["cross"], c["norm_cross"], c["alti_source"], c["source_share"]

    return fn


def teacher_forced_maps(model, source_ids: Sequence[Sequence[int]],
                        target_ids: Sequence[Sequence[int]], batch_size: int = 32) -> list[dict]:
    """Each pair's maps from a teacher-forced pass of its target (the hypothesis).

    source_ids: N id lists ending in eos; target_ids: N id lists without specials.
    Batches of similar source length, S and T padded to a multiple of LENGTH_MULTIPLE and
    B to `batch_size` (rows repeated), so few shapes compile. Returns N dicts in input
    order, cut to the pair's S = len(source ids) and T = len(target ids) + 1:
    {"weights": float32 [L, H, T, S], "norm": float32 [L, H, T, S],
     "alti": float32 [T, S], "source_share": float32 [T]}.
    """
    import jax
    from flax import nnx

    from data.batching import make_batch

    def padded(n: int) -> int:
        return -(-n // LENGTH_MULTIPLE) * LENGTH_MULTIPLE

    fn = _measures_fn()
    graphdef, state = nnx.split(model)
    order = sorted(range(len(source_ids)), key=lambda i: (len(source_ids[i]), i))
    out: list[dict | None] = [None] * len(source_ids)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        filled = rows + [rows[0]] * (batch_size - len(rows))
        s_len = padded(max(len(source_ids[i]) for i in rows))
        t_len = padded(max(len(target_ids[i]) for i in rows) + 1)
        batch = make_batch(source_ids, target_ids, filled, batch_size, s_len, t_len)
        weights, norm, alti, share = jax.device_get(fn(graphdef, state, batch["src"],
                                                       batch["tgt_in"]))
        for r, i in enumerate(rows):
            s, t = len(source_ids[i]), len(target_ids[i]) + 1
            out[i] = {"weights": np.asarray(weights[:, r, :, :t, :s], np.float32),
                      "norm": np.asarray(norm[r, :, :, :t, :s], np.float32),
                      "alti": np.asarray(alti[r, :t, :s], np.float32),
                      "source_share": np.asarray(share[r, :t], np.float32)}
    return out


# ------------------------------------------------------------------------ the study


def _rounded(values) -> list:
    return [None if v is None or (isinstance(v, float) and math.isnan(v))
            else round(float(v), DIGITS) for v in values]


def study(workdir: str | Path, *, split: str | None = None, source: str | None = None,
          reference: str | None = None, checkpoint: str | None = None, average_last: int = 0,
          beam_size: int | None = None, length_penalty: float | None = None,
          batch_size: int = 0, max_sentences: int = 0, reinit_seed: int | None = None,
          gold_pairs: str | None = None, gold: str | None = None,
          json_path: str | None = None, figures: str | None = None,
          lowest: int = 10) -> dict:
    """Everything in the module docstring; writes the JSON and the figures, returns the
    JSON's content. Raises UserError on bad input before anything is written."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise UserError(f"--workdir {workdir}: no such folder")
    cfg = resolved.load_config_json(workdir)  # a missing or foreign workdir: refused here
    if (gold_pairs is None) != (gold is None):
        raise UserError("--gold_pairs and --gold go together")
    for path in (gold_pairs, gold):
        if path is not None:
            require_file(path)
    if beam_size is not None and beam_size < 1:
        raise UserError(f"--beam_size must be at least 1, got {beam_size}")
    if length_penalty is not None and length_penalty < 0:
        raise UserError(f"--length_penalty must be >= 0, got {length_penalty}")
    for name, value in (("batch_size", batch_size), ("max_sentences", max_sentences),
                        ("average_last", average_last), ("lowest", lowest)):
        if value < 0:
            raise UserError(f"--{name} must be >= 0, got {value}")
    if reinit_seed is not None and reinit_seed < 0:
        raise UserError(f"--reinit_seed must be >= 0, got {reinit_seed}")
    from evaluation.inputs import read_inputs

    inputs = read_inputs(cfg, split, source, reference, max_sentences)
    if inputs.references is None:
        raise UserError("the study scores each hypothesis: give --reference with --source")
    if json_path is None:
        json_path = str(workdir / "eval" / f"contribution_study.{inputs.base}.json")
    in_workdir = Path(json_path).resolve().is_relative_to(workdir.resolve())
    # Into the run's own folder: never while it trains (common/workdir_lock.py).
    with (evaluation_locks([workdir], purpose="contribution study") if in_workdir
          else contextlib.nullcontext()):
        return _study(workdir, cfg, inputs, checkpoint=checkpoint, average_last=average_last,
                      beam_size=beam_size, length_penalty=length_penalty,
                      batch_size=batch_size, reinit_seed=reinit_seed, gold_pairs=gold_pairs,
                      gold=gold, json_path=Path(json_path),
                      figures=Path(figures) if figures else Path(json_path).parent,
                      lowest=lowest)


def _study(workdir: Path, cfg, inputs, *, checkpoint, average_last, beam_size, length_penalty,
           batch_size, reinit_seed, gold_pairs, gold, json_path: Path, figures: Path,
           lowest: int) -> dict:
    """`study`'s work, once the inputs are read and checked."""
    from analysis import contribution_figures
    from evaluation.corpus import clean_line
    from evaluation.loading import load_params, load_tokenizer
    from evaluation.scoring import score
    from models.translate import translate_ids
    from training.compilation import enable_compilation_cache

    start = time.perf_counter()
    tokenizer = load_tokenizer(workdir, cfg)
    enable_compilation_cache()
    loaded = load_params(workdir, checkpoint, average_last, cfg=cfg, tokenizer=tokenizer,
                         reinit_seed=reinit_seed)
    # Only now that the run has loaded: a refused command leaves no folder behind.
    prepare_output_folder(json_path.parent)
    prepare_output_folder(figures)
    beam = beam_size or int(cfg.eval.beam_size)
    penalty = float(cfg.eval.length_penalty) if length_penalty is None else length_penalty
    decode_batch = batch_size or int(cfg.eval.batch_size)
    seconds = {"load": time.perf_counter() - start}

    mark = time.perf_counter()
    source_ids = tokenizer.encode_source(inputs.sources)
    hyp_ids = translate_ids(loaded.model, source_ids, beam_size=beam, length_penalty=penalty,
                            batch_size=decode_batch, bucket_step=int(cfg.data.bucket_step))
    hyps = [clean_line(t) for t in tokenizer.decode_target(hyp_ids)]
    seconds["decode"] = time.perf_counter() - mark

    mark = time.perf_counter()
    maps = teacher_forced_maps(loaded.model, source_ids, hyp_ids, batch_size=min(decode_batch, 32))
    seconds["measures"] = time.perf_counter() - mark

    mark = time.perf_counter()
    refs = list(inputs.references)
    bleu, chrf = sentence_scores(hyps, refs)
    corpus = score(hyps, refs)
    lengths = np.array([m["source_share"].shape[0] for m in maps])
    padded_share = np.zeros((len(maps), lengths.max()), np.float64)
    for i, m in enumerate(maps):
        padded_share[i, :lengths[i]] = m["source_share"]
    share = sentence_share(padded_share, lengths)
    agreement = [measure_agreement(m["weights"], m["norm"], m["alti"]) for m in maps]
    per_head = np.stack([a["weights_vs_norm"] for a in agreement])  # [N, L, H]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a head NaN in every sentence
        head_mean, head_std = np.nanmean(per_head, 0), np.nanstd(per_head, 0)
    ranked = np.argsort(share, kind="stable")[:lowest]
    result: dict = {
        "workdir": str(workdir), "split": inputs.split, "source": inputs.source_name,
        "reference": inputs.reference_name, "num_sentences": len(hyps),
        "checkpoint": {"requested": loaded.requested, "steps": loaded.steps,
                       "reinit_seed": loaded.reinit_seed},
        "decoding": {"beam_size": beam, "length_penalty": penalty, "batch_size": decode_batch},
        "scores": {k: corpus[k] for k in ("bleu", "chrf", "bleu_signature", "chrf_signature")},
        "source_share": {
            "mean": float(share.mean()), "std": float(share.std()),
            "min": float(share.min()), "max": float(share.max()),
            "correlations": {"bleu": correlations(share, bleu), "chrf": correlations(share, chrf),
                             "target_steps": correlations(share, lengths)},
            "partial_given_target_steps": {
                "bleu": partial_rank_correlation(share, bleu, lengths),
                "chrf": partial_rank_correlation(share, chrf, lengths)},
            "lowest": [{"index": int(i), "source": inputs.sources[i], "hypothesis": hyps[i],
                        "reference": refs[i], "share": float(share[i]), "bleu": bleu[i],
                        "chrf": chrf[i]} for i in ranked]},
        "agreement": {
            "method": AGREEMENT_METHOD,
            "per_head": {"weights_vs_norm": {"mean": head_mean.tolist(),
                                             "std": head_std.tolist()}},
            "pairs": {p: distribution([a[p] for a in agreement]) for p in PAIRS}},
        "per_sentence": {"share": _rounded(share), "bleu": _rounded(bleu),
                         "chrf": _rounded(chrf), "target_steps": lengths.tolist(),
                         "source_pieces": [len(s) for s in source_ids],
                         **{p: _rounded([a[p] for a in agreement]) for p in PAIRS}},
    }
    if gold is not None:
        result["diagonal_baseline"] = {"pairs": str(gold_pairs), "gold": str(gold),
                                       "scores": diagonal_baseline(gold_pairs, gold)}
    stem = json_path.name.removesuffix(".json")
    paths = [figures / f"{stem}_share.png", figures / f"{stem}_agreement.png"]
    title = (f"{workdir.name}, {inputs.split or Path(inputs.source_name).name}"
             + (f", re-initialised (seed {loaded.reinit_seed})" if loaded.reinit_seed is not None
                else f", step {loaded.steps[-1]}"))
    contribution_figures.share_scatter(result, paths[0], title)
    contribution_figures.agreement_figure(result, paths[1], title)
    result["figures"] = [str(p) for p in paths]
    seconds["analysis"] = time.perf_counter() - mark
    result["seconds"] = {"total": time.perf_counter() - start, **seconds}
    write_atomic(json_path, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return result


def summary(result: dict) -> list[str]:
    """The terminal summary of a study's result."""
    share, agree = result["source_share"], result["agreement"]["pairs"]
    c = share["correlations"]
    ckpt = result["checkpoint"]
    model = (f"re-initialised (seed {ckpt['reinit_seed']})" if ckpt["reinit_seed"] is not None
             else f"steps {ckpt['steps']}")
    lines = [f"{result['num_sentences']} sentences, {model}, beam "
             f"{result['decoding']['beam_size']}: BLEU {result['scores']['bleu']:.2f}, chrF "
             f"{result['scores']['chrf']:.2f}",
             f"source share: mean {share['mean']:.3f} (std {share['std']:.3f}, min "
             f"{share['min']:.3f}, max {share['max']:.3f})"]
    for metric in ("bleu", "chrf"):
        m = c[metric]
        if m["spearman"] is None:
            lines.append(f"  vs sentence {metric}: undefined")
        else:
            partial = share["partial_given_target_steps"][metric]
            lines.append(f"  vs sentence {metric}: Spearman {m['spearman']:+z.3f} (p "
                         f"{m['spearman_p']:.2g}), Pearson {m['pearson']:+z.3f} (p "
                         f"{m['pearson_p']:.2g})" + ("" if partial is None else
                                                     f", Spearman at fixed target steps "
                                                     f"{partial:+z.3f}"))
    lines.append("rank agreement (mean / median over sentences):")
    for pair, d in agree.items():
        lines.append(f"  {pair:<22}" + ("undefined" if d["mean"] is None else
                                         f"{d['mean']:+z.3f} / {d['median']:+z.3f} (n {d['n']})"))
    if "diagonal_baseline" in result:
        s = result["diagonal_baseline"]["scores"]["all"]
        lines.append(f"diagonal baseline: AER {100 * s['aer']:.2f} precision "
                     f"{100 * s['precision']:.2f} recall {100 * s['recall']:.2f}")
    lines.append("wrote " + ", ".join(result["figures"]))
    return lines


def define_flags() -> None:
    """The flags (only when run as a command: importing never adds global flags)."""
    flags.DEFINE_string("workdir", None, "Trained run (config.json, tokenizer/, checkpoints/).")
    flags.DEFINE_enum("split", None, ["valid", "test"], "Split of the configured dataset "
                      "(default test, unless --source).")
    flags.DEFINE_string("source", None, "Source text file instead of --split (with --reference).")
    flags.DEFINE_string("reference", None, "Reference translations of --source.")
    flags.DEFINE_string("checkpoint", None, "best | last | STEP (default best; last with "
                        "--average_last).")
    flags.DEFINE_integer("average_last", 0, "Average the N most recent checkpoints.")
    flags.DEFINE_integer("beam_size", None, "Beam size; 1 = greedy (default: config).")
    flags.DEFINE_float("length_penalty", None, "GNMT alpha (default: config).")
    flags.DEFINE_integer("batch_size", 0, "Sentences per decoding batch (0 = the config's).")
    flags.DEFINE_integer("max_sentences", 0, "Only the first N sentences (0 = all).")
    flags.DEFINE_integer("reinit_seed", None, "Fresh random parameters of the same "
                         "architecture (this seed) in place of the checkpoint's.")
    flags.DEFINE_string("gold_pairs", None, "'src ||| tgt' pairs: the diagonal baseline's AER.")
    flags.DEFINE_string("gold", None, "TALP gold links of --gold_pairs.")
    flags.DEFINE_string("json", None, "Output JSON (default <workdir>/eval/"
                        "contribution_study.<split or source stem>.json).")
    flags.DEFINE_string("figures", None, "Folder of the PNG figures (default: the JSON's).")
    flags.DEFINE_integer("lowest", 10, "How many lowest-share sentences to list.")


def main(argv: list[str]) -> None:
    """absl main: checks the flags, runs the study, prints its summary."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    if not f.workdir:
        raise UserError("--workdir is required")
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO lines on every restore
    result = study(f.workdir, split=f.split, source=f.source, reference=f.reference,
                   checkpoint=f.checkpoint, average_last=f.average_last, beam_size=f.beam_size,
                   length_penalty=f.length_penalty, batch_size=f.batch_size,
                   max_sentences=f.max_sentences, reinit_seed=f.reinit_seed,
                   gold_pairs=f.gold_pairs, gold=f.gold, json_path=f.json, figures=f.figures,
                   lowest=f.lowest)
    print("\n".join(summary(result)))
    sys.stdout.flush()


if __name__ == "__main__":
    define_flags()
    cli.run(main)
