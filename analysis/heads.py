"""Which heads matter and what they do: importance, a pruning curve and the roles of every
head of every attention kind of a trained run.

    python -m attention.heads --workdir runs/de_en [--split valid] [--checkpoint best]
        [--beam_size 1] [--max_sentences 0] [--gold_pairs P --gold G] [--out DIR]

For each head of encoder_self, decoder_self and cross (heads.json keys, [layers][heads]):
  importance       increase of the validation loss when that head alone is masked;
  importance_bleu  BLEU drop when that head alone is masked (greedy by default);
  importance_grad  Michel et al. 2019: mean over sentences of |dL/d mask| at mask = 1
                   (one backward pass; L the sentence's mean token loss);
  confidence, entropy, previous, same, next, eos, punctuation, rare (analysis/head_stats.py);
  norm_share       the head's share of its layer's norm-based attention, sum of
                   ||alpha f(x)|| (Kobayashi et al. 2020, models/contributions.py) over
                   every valid query-key pair of every sentence, over the same for all
                   heads of the layer (each layer's heads sum to 1);
  gold_agreement   cross only, with --gold: 1 - AER of that head's word alignments.
`pruning_curve` is BLEU as heads are removed in one global order of `importance` (most
important last), 0 heads first; `prunable_heads` the most heads removed for <= 0.5 BLEU.
Masks are batched (several masked copies of a batch decode together). `--over_training`
adds entropy/confidence per head at every step whose maps the run saved.
Writes <out>/heads.json, importance.png, importance_bleu.png, importance_grad.png,
pruning_curve.png (and over_training.png); default out: <workdir>/eval/heads/.
From Python: `analyze_heads(workdir, **options) -> dict`, the heads.json content.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import ml_collections
import numpy as np
from absl import flags
from absl import logging as absl_logging

from alignment.links import aer, extract_alignment, read_talp
from analysis.head_stats import HeadStats, is_punctuation, rarest_flags
from attention.mapfile import load_maps
from common import cli
from common.errors import UserError
from common.files import prepare_output_folder, require_file, write_atomic
from common.workdir_lock import evaluation_locks
from configs import resolved
from data.tokenizer import PAD_ID

KINDS = ("encoder_self", "decoder_self", "cross")
CURVE_STRIDE = 4  # pruning-curve points every 4 heads, then refined where BLEU falls 0.5


def _dims(model) -> dict[str, tuple[int, int]]:
    c = model.config
    return {"encoder_self": (c.num_encoder_layers, c.num_heads),
            "decoder_self": (c.num_decoder_layers, c.num_heads),
            "cross": (c.num_decoder_layers, c.num_heads)}


def _mask(dims: dict, removed=()) -> dict[str, np.ndarray]:
    """{kind: float32 [L, H]} of ones, with the (kind, layer, head) in `removed` set to 0."""
    mask = {k: np.ones(d, np.float32) for k, d in dims.items()}
    for kind, layer, head in removed:
        mask[kind][layer, head] = 0.0
    return mask


class MaskedEval:
    """Validation loss and BLEU of one run under head masks (jitted once per batch shape).

    Decoding runs `masks_per_batch` masks x `decode_batch_size` sentences per call: on a
    2-core CPU 8 x 8 decoded 16 masks of 256 sentences in 8.2 s, 1 x 128 (the usual
    evaluation batch) in 39.9 s: a damaged model's long outputs hold a large batch's
    loop, and the small calls' arrays stay in cache (bench/README.md).
    """

    def __init__(self, model, tokenizer, sources: list[str], targets: list[str], *,
                 batch_size: int, bucket_step: int, beam_size: int, length_penalty: float,
                 masks_per_batch: int = 8, decode_batch_size: int = 8):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from data.batching import eval_batches
        from training.step import batch_loss, token_losses

        self.graphdef, self.state = nnx.split(model)
        self.tokenizer, self.targets = tokenizer, targets
        self.src_ids = tokenizer.encode_source(sources)
        self.tgt_ids = tokenizer.encode_target(targets)
        self.decode = dict(beam_size=beam_size, length_penalty=length_penalty)
        self.masks_per_batch = masks_per_batch
        self.src_batches = list(eval_batches(self.src_ids, batch_size=decode_batch_size,
                                             bucket_step=bucket_step))
        self.pair_batches = [b for b, _ in eval_batches(self.src_ids, self.tgt_ids,
                                                        batch_size=batch_size,
                                                        bucket_step=bucket_step)]
        for b in self.pair_batches:
            b.pop("num_tokens")

        def loss_sums(state, batch, head_mask):
            _, sums = batch_loss(nnx.merge(self.graphdef, state), batch, 0.0, head_mask=head_mask)
            return sums["nll_sum"], sums["tokens"]

        def sentence_loss_total(row_masks, state, batch):
            model = nnx.merge(self.graphdef, state)
            logits, _ = model(batch["src"], batch["tgt_in"], head_mask=row_masks)
            _, nll = token_losses(logits, batch["tgt_out"], 0.0)
            weights = (batch["tgt_out"] != PAD_ID).astype(nll.dtype)
            per_sentence = (nll * weights).sum(1) / jnp.maximum(weights.sum(1), 1.0)
            return per_sentence.sum()

        self._loss = jax.jit(loss_sums)
        self._row_grad = jax.jit(jax.grad(sentence_loss_total))

    def loss(self, mask: dict) -> float:
        """Mean token NLL of the validation pairs with `mask` ({kind: [L, H]})."""
        total = tokens = 0.0
        for batch in self.pair_batches:
            nll, n = self._loss(self.state, batch, mask)
            total, tokens = total + float(nll), tokens + float(n)
        return total / max(tokens, 1.0)

    def grad_importance(self, dims: dict) -> dict[str, np.ndarray]:
        """Michel et al.: mean over sentences of |d sentence loss / d head mask|, [L, H]."""
        sums = {k: np.zeros(d) for k, d in dims.items()}
        for batch in self.pair_batches:
            rows = batch["src"].shape[0]
            ones = {k: np.ones((d[0], rows, d[1]), np.float32) for k, d in dims.items()}
            grads = self._row_grad(ones, self.state, batch)
            real = np.asarray(batch["src"] != PAD_ID).any(axis=1)  # filler rows: no loss
            for k in dims:
                sums[k] += np.abs(np.asarray(grads[k]))[:, real].sum(axis=1)
        return {k: v / len(self.src_ids) for k, v in sums.items()}

    def bleu(self, masks: list[dict]) -> list[float]:
        """Corpus BLEU of the decoded validation sources under each mask. The masks go
        `masks_per_batch` at a time: the batch is repeated, row r decoded with its mask."""
        from sacrebleu.metrics import BLEU

        from data.batching import restore_order
        from evaluation.corpus import clean_line
        from models.translate import to_token_lists, translate_split

        m = self.masks_per_batch
        hyps = [[] for _ in masks]
        for start in range(0, len(masks), m):
            chunk = masks[start:start + m]
            chunk = chunk + [chunk[-1]] * (m - len(chunk))  # fixed shapes: no recompiles
            stacked = {k: np.stack([c[k] for c in chunk], axis=1) for k in chunk[0]}  # [L, M, H]
            outputs, orders = [[] for _ in chunk], []
            for batch, indices in self.src_batches:
                rows = batch["src"].shape[0]
                head_mask = {k: np.repeat(v, rows, axis=1) for k, v in stacked.items()}
                result = translate_split(self.graphdef, self.state, np.tile(batch["src"], (m, 1)),
                                         head_mask=head_mask, **self.decode)
                ids = to_token_lists(result)
                for i in range(len(chunk)):
                    outputs[i].append(ids[i * rows:(i + 1) * rows])
                orders.append(indices)
            for i in range(min(m, len(masks) - start)):
                ordered = restore_order(outputs[i], orders, len(self.src_ids))
                hyps[start + i] = [clean_line(t) for t in self.tokenizer.decode_target(ordered)]
        return [BLEU().corpus_score(h, [self.targets]).score for h in hyps]


def prunable_heads(curve: dict[int, float], base_bleu: float, tolerance: float = 0.5) -> int:
    """The most heads removed (curve: {heads removed: BLEU}) before the first point that
    loses more than `tolerance` BLEU."""
    prunable = 0
    for n in sorted(curve):
        if curve[n] < base_bleu - tolerance:
            break
        prunable = n
    return prunable


def role_stats(model, tokenizer, src_ids, tgt_ids, counts: dict, batch_size: int) -> dict:
    """{kind: {metric: [L][H]}} of analysis/head_stats.py on teacher-forced maps, and each
    head's `norm_share` (module docstring)."""
    from models.translate import record_maps

    dims = _dims(model)
    stats = {k: HeadStats(*dims[k], positional=k != "cross") for k in KINDS}
    norm_mass = {k: np.zeros(dims[k], np.float64) for k in KINDS}
    for start in range(0, len(src_ids), batch_size):
        src, tgt = src_ids[start:start + batch_size], tgt_ids[start:start + batch_size]
        maps = record_maps(model, tokenizer, src, tgt, contributions=True)
        for kind in KINDS:  # zero outside the lengths: the sum is over valid pairs
            norm_mass[kind] += maps.weights(kind, "norm").sum(axis=(0, 3, 4), dtype=np.float64)
        s_len, t_len = maps.source_tokens.shape[1], maps.target_tokens.shape[1]
        src_pad = np.array([s + [0] * (s_len - len(s)) for s in src])
        tgt_pad = np.array([[2, *t] + [0] * (t_len - len(t) - 1) for t in tgt])
        src_flags = {"eos": maps.source_tokens == "</s>", "rare": rarest_flags(src_pad, counts["src"]),
                     "punctuation": np.vectorize(is_punctuation)(maps.source_tokens)}
        tgt_flags = {"eos": maps.target_tokens == "<s>", "rare": rarest_flags(tgt_pad, counts["tgt"]),
                     "punctuation": np.vectorize(is_punctuation)(maps.target_tokens)}
        s_valid = np.arange(s_len)[None] < maps.source_lengths[:, None]
        t_valid = np.arange(t_len)[None] < maps.target_lengths[:, None]
        for kind, queries, keys in (("encoder_self", s_valid, src_flags),
                                    ("decoder_self", t_valid, tgt_flags),
                                    ("cross", t_valid, src_flags)):
            stats[kind].add(np.moveaxis(getattr(maps, kind), 1, 0), queries, keys)
    return {k: {**stats[k].result(),
                "norm_share": (norm_mass[k] / np.maximum(norm_mass[k].sum(1, keepdims=True),
                                                         1e-30)).tolist()}
            for k in KINDS}


def gold_agreement(model, tokenizer, pairs: Path, gold: Path, batch_size: int) -> list:
    """[L][H]: 1 - AER of each cross-attention head's word alignments on the gold pairs
    (the prediction row, heads alone; `alignment.links.extract_alignment`)."""
    from alignment.links import read_pairs
    from models.translate import record_maps

    sources, targets = read_pairs(pairs)
    golds = read_talp(gold)
    if len(golds) != len(sources):
        raise UserError(f"{gold} has {len(golds)} lines but {pairs} has {len(sources)}")
    layers, heads = _dims(model)["cross"]
    links = {(lay, h): [] for lay in range(layers) for h in range(heads)}
    for start in range(0, len(sources), batch_size):
        maps = record_maps(model, tokenizer, tokenizer.encode_source(sources[start:start + batch_size]),
                           tokenizer.encode_target(targets[start:start + batch_size]))
        for i in range(maps.num_examples):
            for (lay, h), out in links.items():
                out.append(extract_alignment(maps, i, layers=[lay], heads=[h], words=True))
    return [[1.0 - aer(links[(lay, h)], golds) for h in range(heads)] for lay in range(layers)]


def over_training(workdir: Path) -> list[dict]:
    """Entropy and confidence per head at every step whose teacher-forced maps were saved."""
    steps = []
    for path in sorted((workdir / "attention").glob("valid_step*_teacher_forced.npz")):
        maps = load_maps(path)
        entry = {"step": int(maps.step)}
        for kind in KINDS:
            arr = np.moveaxis(getattr(maps, kind), 1, 0)  # [L, N, H, Tq, Tk]
            lengths = maps.source_lengths if kind == "encoder_self" else maps.target_lengths
            valid = np.arange(arr.shape[-2])[None] < lengths[:, None]
            flags = {r: np.zeros((arr.shape[1], arr.shape[-1]), bool)
                     for r in ("eos", "punctuation", "rare")}
            stats = HeadStats(arr.shape[0], arr.shape[2], positional=False)
            stats.add(arr, valid, flags)
            result = stats.result()
            entry[kind] = {"entropy": result["entropy"], "confidence": result["confidence"],
                           "entropy_mean": float(np.mean(result["entropy"])),
                           "confidence_mean": float(np.mean(result["confidence"]))}
        steps.append(entry)
    return steps


def analyze_heads(workdir: str | Path, *, split: str = "valid", checkpoint: str = "best",
                  beam_size: int = 1, max_sentences: int = 0, batch_size: int = 0,
                  gold_pairs: str | None = None, gold: str | None = None,
                  over_steps: bool = False, out: str | None = None) -> dict:
    """Everything in the module docstring; writes `<out>/heads.json` and the figures."""
    from data.corpora import load_corpus
    from evaluation.loading import load_params, load_tokenizer
    from training.compilation import enable_compilation_cache

    workdir = Path(workdir)
    if (gold_pairs is None) != (gold is None):
        raise UserError("--gold_pairs and --gold go together")
    for path in (gold_pairs, gold):
        if path is not None:
            require_file(path)
    cfg = resolved.load_config_json(workdir)
    tokenizer = load_tokenizer(workdir, cfg)
    sources, targets = load_corpus(cfg.data, split)
    if max_sentences:
        sources, targets = sources[:max_sentences], targets[:max_sentences]
    enable_compilation_cache()
    loaded = load_params(workdir, checkpoint, cfg=cfg, tokenizer=tokenizer)
    # Into the run's own eval/ (the default): never while it trains (common/workdir_lock.py);
    # taken once every check has passed, so a refused command leaves the workdir untouched.
    with (evaluation_locks([workdir], purpose="head analysis") if out is None
          else contextlib.nullcontext()):
        return _measure_heads(workdir, cfg, tokenizer, loaded, sources, targets, split=split,
                              beam_size=beam_size, batch_size=batch_size, gold_pairs=gold_pairs,
                              gold=gold, over_steps=over_steps, out=out)


def _measure_heads(workdir: Path, cfg: ml_collections.ConfigDict, tokenizer, loaded,
                   sources: list[str], targets: list[str], *, split: str, beam_size: int,
                   batch_size: int, gold_pairs: str | None, gold: str | None, over_steps: bool,
                   out: str | None) -> dict:
    """`analyze_heads`'s measurements and files, once its checks have passed."""
    from analysis import head_figures

    # Created only now that the checkpoint has loaded: a refused command leaves no folder.
    out_dir = prepare_output_folder(Path(out) if out else workdir / "eval" / "heads")
    model, dims = loaded.model, _dims(loaded.model)
    batch_size = batch_size or int(cfg.eval.batch_size)
    start = time.perf_counter()
    evaluator = MaskedEval(model, tokenizer, sources, targets, batch_size=batch_size,
                           bucket_step=int(cfg.data.bucket_step), beam_size=beam_size,
                           length_penalty=float(cfg.eval.length_penalty))
    seconds = {}  # per stage, for the cost figures in bench/README.md
    every_head = [(k, lay, h) for k in KINDS for lay in range(dims[k][0]) for h in range(dims[k][1])]
    base_loss = evaluator.loss(_mask(dims))
    single = [_mask(dims, [head]) for head in every_head]
    loss_up = [evaluator.loss(m) - base_loss for m in single]
    bleus = evaluator.bleu([_mask(dims)] + single)
    base_bleu, bleu_drop = bleus[0], [bleus[0] - b for b in bleus[1:]]
    grads = evaluator.grad_importance(dims)
    seconds["importance"] = time.perf_counter() - start

    # Pruning: remove heads least important first; coarse points, then refine the step
    # where BLEU falls by more than 0.5 so `prunable_heads` is exact.
    order = [every_head[i] for i in np.argsort(loss_up, kind="stable")]
    points = sorted({*range(0, len(order) + 1, CURVE_STRIDE), len(order)})
    curve = dict(zip(points, evaluator.bleu([_mask(dims, order[:n]) for n in points]), strict=True))
    last_ok = prunable_heads(curve, base_bleu)
    refine = list(range(last_ok + 1, min(last_ok + CURVE_STRIDE, len(order) + 1)))
    curve.update(zip(refine, evaluator.bleu([_mask(dims, order[:n]) for n in refine]), strict=True))
    prunable = prunable_heads(curve, base_bleu)
    seconds["pruning"] = time.perf_counter() - start - seconds["importance"]

    counts = {"src": np.bincount(np.concatenate(evaluator.src_ids), minlength=tokenizer.source_vocab_size),
              "tgt": np.bincount(np.concatenate([t for t in evaluator.tgt_ids if t] or [[0]]),
                                 minlength=tokenizer.target_vocab_size)}
    mark = time.perf_counter()
    roles = role_stats(model, tokenizer, evaluator.src_ids, evaluator.tgt_ids, counts, batch_size)
    seconds["roles"] = time.perf_counter() - mark
    result: dict = {"workdir": str(workdir), "split": split, "num_sentences": len(sources),
                    "checkpoint_steps": loaded.steps, "decode": "greedy" if beam_size == 1
                    else f"beam{beam_size}", "base_loss": base_loss, "base_bleu": base_bleu}
    index = {head: i for i, head in enumerate(every_head)}
    for kind in KINDS:
        layers, heads = dims[kind]

        def grid(values, kind=kind, layers=layers, heads=heads):
            return [[float(values[index[(kind, lay, h)]]) for h in range(heads)]
                    for lay in range(layers)]

        result[kind] = {"importance": grid(loss_up), "importance_bleu": grid(bleu_drop),
                        "importance_grad": grads[kind].tolist(), **roles[kind]}
    if gold is not None:
        mark = time.perf_counter()
        result["cross"]["gold_agreement"] = gold_agreement(model, tokenizer, Path(gold_pairs),
                                                           Path(gold), batch_size)
        seconds["gold_agreement"] = time.perf_counter() - mark
    result["pruning_order"] = [list(h) for h in order]
    result["pruning_curve"] = [{"heads_removed": n, "bleu": curve[n]} for n in sorted(curve)]
    result["prunable_heads"] = prunable
    if over_steps:
        result["over_training"] = over_training(workdir)
    result["seconds"] = {"total": time.perf_counter() - start, **seconds}

    write_atomic(out_dir / "heads.json", json.dumps(result, indent=1) + "\n")
    for metric in ("importance", "importance_bleu", "importance_grad"):
        head_figures.metric_heatmaps(result, metric, out_dir / f"{metric}.png")
    head_figures.pruning_curve(result["pruning_curve"], base_bleu, out_dir / "pruning_curve.png")
    if over_steps and result["over_training"]:
        head_figures.over_training(result["over_training"], out_dir / "over_training.png")
    return result


def table(result: dict) -> list[str]:
    """The terminal summary: one line per head, then the pruning result."""
    lines = [f"{result['num_sentences']} sentences, {result['decode']}: loss "
             f"{result['base_loss']:.3f}, BLEU {result['base_bleu']:.2f}",
             f"{'kind':<13}{'layer':>6}{'head':>5}{'d loss':>9}{'d BLEU':>8}{'|grad|':>8}"
             f"{'conf':>6}{'prev':>6}{'same':>6}{'next':>6}{'eos':>6}{'punct':>6}{'rare':>6}"]
    for kind in KINDS:
        k = result[kind]
        for lay, row in enumerate(k["importance"]):
            for h in range(len(row)):
                def cell(m, k=k, lay=lay, h=h):
                    return f"{k[m][lay][h]:6.2f}" if k.get(m) is not None else f"{'-':>6}"

                lines.append(f"{kind:<13}{lay:>6}{h:>5}{k['importance'][lay][h]:9.3f}"
                             f"{k['importance_bleu'][lay][h]:8.2f}{k['importance_grad'][lay][h]:8.3f}"
                             + "".join(cell(m) for m in ("confidence", "previous", "same", "next",
                                                         "eos", "punctuation", "rare")))
    lines.append(f"{result['prunable_heads']} of {len(result['pruning_order'])} heads can be "
                 f"removed for <= 0.5 BLEU; seconds: "
                 + ", ".join(f"{k} {v:.0f}" for k, v in result["seconds"].items()))
    return lines


def define_flags() -> None:
    """The flags (only when run as a command: importing never adds global flags)."""
    flags.DEFINE_string("workdir", None, "Training run directory.")
    flags.DEFINE_enum("split", "valid", ["valid", "test"], "Split of the configured dataset.")
    flags.DEFINE_string("checkpoint", "best", "best | last | a step number.")
    flags.DEFINE_integer("beam_size", 1, "1 = greedy decoding for the BLEU figures.")
    flags.DEFINE_integer("max_sentences", 0, "Only the first N sentences (0 = all).")
    flags.DEFINE_integer("batch_size", 0, "Sentences per batch (0 = the config's).")
    flags.DEFINE_string("gold_pairs", None, "'src ||| tgt' pairs for gold agreement.")
    flags.DEFINE_string("gold", None, "TALP gold alignments of --gold_pairs.")
    flags.DEFINE_bool("over_training", False, "Also head statistics at every saved step.")
    flags.DEFINE_string("out", None, "Output folder (default <workdir>/eval/heads).")


def main(argv) -> None:
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO lines on every restore
    if not f.workdir:
        raise UserError("--workdir is required")
    if f.beam_size < 1:
        raise UserError(f"--beam_size must be at least 1, got {f.beam_size}")
    result = analyze_heads(f.workdir, split=f.split, checkpoint=f.checkpoint, beam_size=f.beam_size,
                           max_sentences=f.max_sentences, batch_size=f.batch_size,
                           gold_pairs=f.gold_pairs, gold=f.gold, over_steps=f.over_training,
                           out=f.out)
    print("\n".join(table(result)))
    sys.stdout.flush()

