"""Training throughput and model-FLOPs utilisation (MFU) of the real train step.

    python bench/train_throughput.py --size tiny|base [--steps 20] [--warmup 3]
        [--batch_tokens 4096] [--synthetic] [--vocab_size 8000] [--dtype float32]
        [--rdrop_alpha A] [--pack_length L] [--cpu_devices N] [--json OUT]
    python bench/train_throughput.py --config configs/multi30k_de_en.py [--pack_length L]
        [--all_shapes] [--cpu_devices N] [--json OUT]

The model, optimizer and step are set up as train.py sets them up, by `training.step`
(`create_train_state` on `make_mesh()`, `make_train_step`): the same jitted full step
(forward, backward, AdamW update, non-finite guard), with the same `shard_batch` call
per step. Model sizes:

    tiny  d_model 128, 4+4 layers, 4 heads, d_ff 256   (configs/multi30k_de_en_cpu.py)
    base  d_model 512, 6+6 layers, 8 heads, d_ff 2048  (Vaswani et al. 2017 "base")

Everything else (dropout 0.2, label smoothing, pre-LN, tied embeddings, AdamW, clipping)
is configs/multi30k_de_en_cpu.py; `--dtype bfloat16` sets model.dtype (parameters stay f32).
`--config FILE` takes a recipe as it is instead (its model, vocabulary, buckets and
batch_tokens; flags given change it, `--size` then applies its preset).

Batches (host numpy, built before timing; `num_tokens` not used):
  * default: the project's own pipeline on Multi30k de->en: a SentencePiece model of
    `--vocab_size` trained once into `--cache_dir` (`data.tokenizer.load_or_train_tokenizer`),
    `encode_for_training`, then train.py's batcher (`data.packing.make_batcher`): padded
    length buckets, or with `--pack_length L` every batch one packed shape (epoch 0 order);
  * `--synthetic`: the standard comparison batches (`synthetic_batches`): source and
    target lengths each round(N(16, 6)) clipped to [4, 40], ids uniform in [4, vocab),
    pairs added to a batch while n_sentences * max(longest source, longest target)
    <= batch_tokens, each side padded to its own batch maximum (no bucketing),
    numpy default_rng(0). Without buckets almost every batch has a new shape, so
    almost every batch compiles once (reported in `distinct_shapes` / `compile_s`).
    With `--pack_length L` their pairs, in order, are packed as train.py packs
    (`pack_in_order`: data/packing.py's rows and plan, without its shuffle).

Timing:
  1. first call per distinct batch shape (over the warm-up and measured batches; with
     `--all_shapes`, one batch of every shape of the Multi30k epoch 0, i.e. every train
     program a run compiles), each synced with `jax.block_until_ready`: `first_call_s`
     per shape;
  2. `--warmup` steps, synced once at the end;
  3. `--steps` measured steps with `jax.block_until_ready` only after the last one:
     `step_time_s` = elapsed / steps.
  `compile_s` = sum over distinct shapes of (first-call time - step_time_s);
  `compile_s_jax_events` = JAX's own compile-time events during phase 1 (tracing,
  lowering, XLA compilation). `compilations_after_warmup` counts the train step's jit
  cache entries added in phases 2-3 (0 means no recompilation). `epoch0` (Multi30k):
  the batches of the whole first epoch, their target tokens per batch and the share of
  positions holding tokens per side (`src_fill`, `tgt_fill`).
  No persistent compilation cache is enabled here (unless JAX_COMPILATION_CACHE_DIR is
  set in the environment: then `compilation_cache` names it and compile_s is load time).

FLOP formula: bench/flops.py (model FLOPs of one training step on non-pad tokens).
`xla_flops_check` compares it on padded lengths with XLA's HLO cost analysis of the
lowered step for the first measured batch (the ratio is slightly above 1: XLA also
counts element-wise work).

MFU:
  mfu        = sum of F_step over the measured steps / their wall time / peak, with
               peak = the measured matmul peak (bench/matmul_peak.py, this run) of the
               compute dtype (float32 unless --dtype bfloat16);
  mfu_padded = the same formula on padded lengths (every row S_i = S, T_i = T: the
               work the hardware actually does), so mfu / mfu_padded = padding cost.

Memory: `peak_rss_mb` = ru_maxrss of this process after training (before the matmul
peak is measured); `device_peak_mb` = the device allocator's peak where it reports one
(GPU), else null.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish  # noqa: E402
from bench.flops import FLOP_FORMULA, FlopCounter, count_matmul_params, pair_lengths  # noqa: E402
from bench.matmul_peak import DEFAULT_SIZES, device_info, measure_peaks, parse_sizes  # noqa: E402
from bench.synthetic import synthetic_batches  # noqa: E402

SIZES = {
    "tiny": {"d_model": 128, "num_encoder_layers": 4, "num_decoder_layers": 4, "num_heads": 4,
             "d_ff": 256},
    "base": {"d_model": 512, "num_encoder_layers": 6, "num_decoder_layers": 6, "num_heads": 8,
             "d_ff": 2048},
}
Batch = dict[str, np.ndarray]


# --------------------------------------------------------------------------- batches


def multi30k_batches(cfg, num_batches: int, cache_dir: Path, batch_multiple: int):
    """The first `num_batches` batches of epoch 0 of the training pipeline (train.py's
    `make_batcher`: padded buckets, or packed rows with `data.pack_length`).

    Returns (batches, vocabulary size, the batcher).
    """
    from data.corpora import load_corpus
    from data.packing import make_batcher
    from data.tokenizer import encode_for_training, load_or_train_tokenizer

    sources, targets = load_corpus(cfg.data, "train")
    name = f"tokenizer-{cfg.data.source_lang}-{cfg.data.target_lang}-v{cfg.data.vocab_size}"
    if cfg.data.spm_model_type != "unigram":  # the first tokenizers here were unigram ones
        name += f"-{cfg.data.spm_model_type}"
    tokenizer = load_or_train_tokenizer(cache_dir / name, cfg.data, lambda: (sources, targets))
    src_ids, tgt_ids, _ = encode_for_training(tokenizer, sources, targets, cfg.data.max_length,
                                              cfg.data.long_pairs)
    batcher = make_batcher(src_ids, tgt_ids, cfg.train.batch_tokens, cfg.data.max_length,
                           pack_length=cfg.data.pack_length, bucket_step=cfg.data.bucket_step,
                           batch_multiple=batch_multiple, seed=cfg.train.seed)
    batches = []
    for _, _, batch in batcher.iterate():
        batch.pop("num_tokens")
        batches.append(batch)
        if len(batches) == num_batches:
            break
    return batches, tokenizer.target_vocab_size, batcher


def batching_ms(batcher, batches: int, epoch: int = 1) -> float:
    """Host milliseconds per batch of `batcher` (train.py's input thread): its plan of a
    not yet planned `epoch`, shared over that epoch's batches, plus making `batches` of
    them."""
    start = time.perf_counter()
    count = batcher.epoch_length(epoch)
    plan_s = time.perf_counter() - start
    start = time.perf_counter()
    for index in range(min(batches, count)):
        batcher.batch(epoch, index)
    return (plan_s / count + (time.perf_counter() - start) / min(batches, count)) * 1e3


def shape_batches(batcher) -> list[Batch]:
    """One batch of every shape of `batcher`'s epoch 0 (its first of that shape): what a
    run compiles the train step for."""
    from data.batching import TrainBatcher

    indices = [0]
    if isinstance(batcher, TrainBatcher):  # padded: the first batch of each bucket
        first: dict[int, int] = {}
        for index, (length, _) in enumerate(batcher.epoch_plan(0)):
            first.setdefault(length, index)
        indices = sorted(first.values())
    batches = [batcher.batch(0, i) for i in indices]
    for batch in batches:
        batch.pop("num_tokens")
    return batches


def epoch_stats(batcher, epoch: int = 0) -> dict:
    """Batches of `epoch`, their mean target tokens (what one update learns from) and the
    share of positions that hold tokens, per side, over the whole epoch."""
    from data.batching import TrainBatcher

    count = batcher.epoch_length(epoch)
    src_len = batcher.source_ids.lengths
    tgt_len = batcher.target_ids.lengths + 1  # [bos] + ids in, ids + [eos] out
    if isinstance(batcher, TrainBatcher):
        plan = batcher.epoch_plan(epoch)
        positions = sum(batcher.batch_sizes[length] * length for length, _ in plan)
        pairs = np.concatenate([rows for _, rows in plan])
    else:
        positions = count * batcher.rows * batcher.length
        pairs = np.concatenate([p[:, 0] for p in batcher.epoch_plan(epoch)])
    src, tgt = int(src_len[pairs].sum()), int(tgt_len[pairs].sum())
    return {"batches": count, "tgt_tokens_per_batch": tgt / count,
            "src_tokens_per_batch": src / count, "src_fill": src / positions,
            "tgt_fill": tgt / positions, "shapes": [list(s) for s in batcher.shapes()]}


def pack_in_order(batches: list[Batch], batch_tokens: int, pack_length: int,
                  batch_multiple: int) -> list[Batch]:
    """The pairs of padded synthetic `batches`, in their order, packed as train.py packs
    (`PackedBatcher`'s rows and `plan_rows`, not its shuffle); every packed batch but the
    last, partial one. A pair keeps its positions: target ids t_1..t_T become
    [bos] t_1..t_{T-1} in and t_1..t_{T-1} [eos] out (the synthetic tgt_in; tgt_out's last
    id is eos), so the FLOP count is the padded batches'."""
    from data.packing import PackedBatcher, packed_batch, plan_rows

    sources, targets = [], []
    for batch in batches:
        for src, tgt_out, tgt_in in zip(batch["src"], batch["tgt_out"], batch["tgt_in"],
                                        strict=True):
            n = int(np.count_nonzero(tgt_out))
            if n:
                sources.append(src[src != 0])
                targets.append(tgt_in[1:n])
    batcher = PackedBatcher(sources, targets, batch_tokens, pack_length,
                            batch_multiple=batch_multiple)
    plan = plan_rows(batcher.src_lengths, batcher.tgt_lengths, np.arange(len(sources)),
                     batcher.rows, batcher.length)
    packed = [packed_batch(batcher.source_ids, batcher.target_ids, p, batcher.rows,
                           batcher.length) for p in plan[:-1]]
    for batch in packed:
        batch.pop("num_tokens")
    return packed


# ------------------------------------------------------------------------------ run


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def device_peak_mb() -> float | None:
    """The first device allocator's peak bytes in use, in MiB (None where not reported)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / (1024 * 1024)


def xla_flops_check(train_step, state, batch: Batch, counter: FlopCounter, mesh) -> dict | None:
    """XLA's FLOP count of the train step for one batch shape (HLO cost analysis of the
    lowered program, no compilation) next to the formula on the same padded shape."""
    from training.distributed import shard_batch

    try:
        cost = train_step.lower(state, shard_batch(batch, mesh)).cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        xla = float(cost["flops"])
    except Exception as err:  # noqa: BLE001 - a diagnostic, never fatal
        print(f"train_throughput: no XLA cost analysis ({type(err).__name__}: {err})",
              file=sys.stderr)
        return None
    padded = counter.batch_flops(batch)[1]
    return {"shape": "x".join(map(str, shape_of(batch))), "xla_flops": xla,
            "formula_padded_flops": padded, "ratio": xla / padded}


def make_config(args: argparse.Namespace):
    """configs/multi30k_de_en_cpu.py (or `--config`'s recipe) with the model size,
    vocabulary, budget, packing and dtype set."""
    from bench import load_config_file
    from configs import multi30k_de_en_cpu

    if args.config:
        cfg = load_config_file(args.config)
    else:
        cfg = multi30k_de_en_cpu.get_config()
        # The benchmark's own batch, as every recorded figure was measured: padded length
        # buckets of 4,096 tokens (the CPU recipe itself packs since), unless flags say.
        cfg.data.pack_length, cfg.train.batch_tokens = 0, 4096
        cfg.train.cpu_devices = 0  # and on JAX's one CPU device
    for key, value in SIZES[args.size].items() if args.size else ():
        cfg.model[key] = value
    for key in ("d_model", "num_heads", "d_ff"):
        if getattr(args, key) is not None:
            cfg.model[key] = getattr(args, key)
    if args.layers is not None:
        cfg.model.num_encoder_layers = cfg.model.num_decoder_layers = args.layers
    for key in ("attention_impl", "embedding_grad"):
        if getattr(args, key, None):
            cfg.model[key] = getattr(args, key)
    cfg.model.dtype = args.dtype
    if args.vocab_size is not None:
        cfg.data.vocab_size = args.vocab_size
    if args.batch_tokens is not None:
        cfg.train.batch_tokens = args.batch_tokens
    if args.pack_length is not None:
        cfg.data.pack_length = args.pack_length
    cfg.train.rdrop_alpha = args.rdrop_alpha
    if args.cpu_devices is not None:
        cfg.train.cpu_devices = args.cpu_devices
    return cfg


def shape_of(batch: Batch) -> tuple[int, ...]:
    return (*batch["src"].shape, batch["tgt_out"].shape[1])


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns the JSON result."""
    import jax
    from flax import nnx

    from common.errors import UserError
    from data.batching import padding_fraction
    from training.compilation import CompileTimer
    from training.distributed import make_mesh, shard_batch, use_cpu_devices
    from training.step import create_train_state, make_train_step

    cfg = make_config(args)
    use_cpu_devices(cfg.train.cpu_devices)  # as train.py: before JAX starts
    mesh = make_mesh()
    total = args.warmup + args.steps
    batch_tokens, pack_length = cfg.train.batch_tokens, cfg.data.pack_length
    possible_shapes, epoch0, compile_batches = None, None, []
    if args.synthetic:
        vocab = cfg.data.vocab_size
        # Packed rows hold about twice the pairs of these half-padding batches.
        batches = synthetic_batches(3 * total if pack_length else total, batch_tokens, vocab,
                                    batch_multiple=mesh.size)
        unpacked_padding = padding_fraction(batches[args.warmup:total])
        pack_start = time.perf_counter()  # train.py packs in its input thread
        if pack_length:
            batches = pack_in_order(batches, batch_tokens, pack_length, mesh.size)[:total]
        pack_ms = (time.perf_counter() - pack_start) / len(batches) * 1e3
    else:
        batches, vocab, batcher = multi30k_batches(cfg, total, args.cache_dir, mesh.size)
        possible_shapes, epoch0 = len(batcher.shapes()), epoch_stats(batcher)
        pack_ms = batching_ms(batcher, total)
        compile_batches = shape_batches(batcher) if args.all_shapes else []
        unpacked_padding = padding_fraction(batches[args.warmup:])
        if pack_length:  # the same recipe's padded batches, for their padding
            padded = cfg.copy_and_resolve_references()
            padded.data.pack_length = 0
            unpacked_padding = padding_fraction(
                multi30k_batches(padded, total, args.cache_dir, mesh.size)[0][args.warmup:])
    if len(batches) < total:
        raise UserError(f"{len(batches)} batches, fewer than --warmup + --steps = {total}")
    warm, measured = batches[:args.warmup], batches[args.warmup:]

    graphdef, state = create_train_state(cfg, vocab, vocab, mesh)
    counter = count_matmul_params(nnx.merge(graphdef, state["params"]))
    params = sum(x.size for x in jax.tree.leaves(state["params"]))
    train_step = make_train_step(graphdef, cfg.train)

    # 1. First call per distinct shape (compilation), each synced.
    first_call: dict[tuple[int, ...], float] = {}
    with CompileTimer() as compile_timer:
        for batch in compile_batches + batches:
            shape = shape_of(batch)
            if shape in first_call:
                continue
            start = time.perf_counter()
            state, metrics = train_step(state, shard_batch(batch, mesh))
            jax.block_until_ready((state, metrics))
            first_call[shape] = time.perf_counter() - start
    compiled = train_step._cache_size()

    # 2. Warm-up, synced once.
    for batch in warm:
        state, metrics = train_step(state, shard_batch(batch, mesh))
    jax.block_until_ready(state)

    # 3. Measured steps, synced once at the end.
    start = time.perf_counter()
    for batch in measured:
        state, metrics = train_step(state, shard_batch(batch, mesh))
    jax.block_until_ready((state, metrics))
    elapsed = time.perf_counter() - start
    recompiled = train_step._cache_size() - compiled
    rss_mb, dev_mb = peak_rss_mb(), device_peak_mb()
    nonfinite_step = int(state["nonfinite_step"])
    flops_check = xla_flops_check(train_step, state, measured[0], counter, mesh)

    peaks = measure_peaks(args.peak_sizes, args.peak_repeats)
    peak = peaks.get(args.dtype)

    step_time = elapsed / len(measured)
    flops = [counter.batch_flops(b) for b in measured]
    model_flops = sum(f for f, _ in flops)
    padded_flops = sum(f for _, f in flops)
    tgt_tokens = sum(int(np.count_nonzero(b["tgt_out"])) for b in measured)
    src_tokens = sum(int(np.count_nonzero(b["src"])) for b in measured)
    model_gflops_per_sec = model_flops / elapsed / 1e9
    return {
        "size": args.size or "config",
        "synthetic": args.synthetic,
        "model": {k: cfg.model[k] for k in ("d_model", "num_encoder_layers",
                                            "num_decoder_layers", "num_heads", "d_ff",
                                            "dropout", "dtype", "share_embeddings",
                                            "attention_impl", "embedding_grad")},
        "vocab_size": vocab,
        "config": str(args.config) if args.config else None,
        "batch_tokens": batch_tokens,
        "rdrop_alpha": args.rdrop_alpha,
        "steps": len(measured),
        "warmup": args.warmup,
        "tokens_per_sec": tgt_tokens / elapsed,
        "src_tgt_tokens_per_sec": (src_tokens + tgt_tokens) / elapsed,
        "sentences_per_sec": sum(int(np.count_nonzero(pair_lengths(b)[0])) for b in measured) / elapsed,
        "step_time_s": step_time,
        "mean_tgt_tokens_per_step": tgt_tokens / len(measured),
        "mean_src_tokens_per_step": src_tokens / len(measured),
        "mean_model_gflops_per_step": model_flops / len(measured) / 1e9,
        "model_gflops_per_sec": model_gflops_per_sec,
        "padded_gflops_per_sec": padded_flops / elapsed / 1e9,
        "peak_gflops": peak,
        "peak_dtype": args.dtype,
        "peak_gflops_f32": peaks.get("float32"),
        "peak_gflops_bf16": peaks.get("bfloat16"),
        "peak_sizes": list(args.peak_sizes),
        "mfu": model_gflops_per_sec / peak if peak else None,
        "mfu_padded": padded_flops / elapsed / 1e9 / peak if peak else None,
        "compile_s": sum(max(0.0, t - step_time) for t in first_call.values()),
        "compile_s_jax_events": compile_timer.seconds,
        "first_call_s": {"x".join(map(str, k)): v for k, v in first_call.items()},
        "distinct_shapes": len(first_call),
        "possible_bucket_shapes": possible_shapes,
        "all_shapes": bool(args.all_shapes and not args.synthetic),
        "train_programs": train_step._cache_size(),
        "epoch0": epoch0,
        "compilations_after_warmup": recompiled,
        "padding_fraction": padding_fraction(measured),
        "padding_fraction_unpacked": unpacked_padding,
        "pack_length": pack_length,
        "pack_ms_per_batch": pack_ms if pack_length else None,
        "params": int(params),
        "matmul_params": counter.matmul_params,
        "matmul_params_src": counter.src_params,
        "matmul_params_tgt": counter.tgt_params,
        "flop_formula": FLOP_FORMULA,
        "xla_flops_check": flops_check,
        "nonfinite_step": nonfinite_step,
        "peak_rss_mb": rss_mb,
        "device_peak_mb": dev_mb,
        "compilation_cache": jax.config.jax_compilation_cache_dir,
        **device_info(),
    }


def print_table(result: dict) -> None:
    """The headline figures as an aligned two-column table."""
    def fmt(value, spec: str = ".4g") -> str:
        return "n/a" if value is None else format(value, spec)

    rows = [
        ("model", f"{result['size']} ({result['model']['d_model']}d, "
                  f"{result['model']['num_encoder_layers']}+{result['model']['num_decoder_layers']}"
                  f" layers, {result['model']['dtype']})"),
        ("batches", ("synthetic" if result["synthetic"] else "Multi30k")
         + (f", packed into rows of {result['pack_length']}" if result["pack_length"] else "")),
        ("device", f"{result['device']} x{result['device_count']}"),
        ("params / matmul params", f"{result['params']:,} / {result['matmul_params']:,}"),
        ("target tokens/s (non-pad)", fmt(result["tokens_per_sec"], ",.0f")),
        ("src+tgt tokens/s (non-pad)", fmt(result["src_tgt_tokens_per_sec"], ",.0f")),
        ("step time", f"{fmt(result['step_time_s'] * 1e3, '.1f')} ms"),
        ("padding fraction", f"{fmt(result['padding_fraction'], '.3f')} (before packing "
                             f"{fmt(result['padding_fraction_unpacked'], '.3f')})"),
        ("model GFLOP/s", fmt(result["model_gflops_per_sec"], ".1f")),
        (f"matmul peak {result['peak_dtype']} GFLOP/s", fmt(result["peak_gflops"], ".1f")),
        ("MFU (non-pad / padded)", f"{fmt(result['mfu'], '.1%')} / "
                                   f"{fmt(result['mfu_padded'], '.1%')}"),
        ("compile (first calls - step)", f"{fmt(result['compile_s'], '.1f')} s over "
                                         f"{result['distinct_shapes']} shapes"),
        ("compile (JAX events)", f"{fmt(result['compile_s_jax_events'], '.1f')} s"),
        ("compilations after warm-up", str(result["compilations_after_warmup"])),
        ("peak RSS", f"{fmt(result['peak_rss_mb'], '.0f')} MiB"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES),
                        help="model preset (required without --config)")
    parser.add_argument("--config", type=Path, help="a recipe to take as it is (configs/*.py) "
                        "instead of the CPU recipe with a --size preset")
    parser.add_argument("--all_shapes", action="store_true",
                        help="compile one Multi30k batch of every shape of epoch 0 first: "
                        "every train program a run compiles")
    parser.add_argument("--steps", type=int, default=20, help="measured steps [20]")
    parser.add_argument("--warmup", type=int, default=3,
                        help="steps after the first calls, before measuring [3]")
    parser.add_argument("--batch_tokens", type=int, help="[4096, or the --config's]")
    parser.add_argument("--synthetic", action="store_true",
                        help="standard comparison batches instead of Multi30k")
    parser.add_argument("--vocab_size", type=int, help="[8000, or the --config's]")
    parser.add_argument("--pack_length", type=int, default=None,
                        help="pack pairs into rows this long, 0 = off [0, or the --config's]")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="model compute dtype; MFU is against this dtype's peak [float32]")
    parser.add_argument("--d_model", type=int, help="override the size's d_model")
    parser.add_argument("--num_heads", type=int, help="override the size's heads")
    parser.add_argument("--d_ff", type=int, help="override the size's d_ff")
    parser.add_argument("--layers", type=int, help="override encoder and decoder layers")
    parser.add_argument("--attention_impl", choices=("auto", "xla", "cudnn"),
                        help="override model.attention_impl [auto]")
    parser.add_argument("--embedding_grad", choices=("auto", "scatter", "one_hot"),
                        help="override model.embedding_grad [auto]")
    parser.add_argument("--peak_sizes", type=parse_sizes, default=DEFAULT_SIZES,
                        help="matmul sizes for the peak [1024,2048,4096]")
    parser.add_argument("--peak_repeats", type=int, default=5, help="[5]")
    parser.add_argument("--cache_dir", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                        / "attnmt" / "bench",
                        help="where the Multi30k tokenizer is trained once [~/.cache/attnmt/bench]")
    parser.add_argument("--rdrop_alpha", type=float, default=0.0,
                        help="train.rdrop_alpha (R-Drop: two passes per batch; the FLOP count "
                        "and MFU still count one) [0]")
    parser.add_argument("--cpu_devices", type=int, default=None,
                        help="train.cpu_devices: the host CPU as N JAX devices, each batch "
                        "split over them [the --config's; 0 without --config]")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.cpu_devices is not None and args.cpu_devices < 0:
        parser.error("--cpu_devices must be >= 0")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if args.config is None:
        if args.size is None:
            parser.error("give --size or --config")
        args.batch_tokens = args.batch_tokens or 4096
        args.vocab_size = args.vocab_size or 8000
    return args


def main(argv: list[str] | None = None) -> dict:
    return finish(parse_args(argv), run, print_table)


if __name__ == "__main__":
    main()
