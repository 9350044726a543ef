"""Decoding speed of a trained run: greedy or beam search over a whole test set.

    python bench/decode_speed.py --workdir W [--beam_size 5] [--split test]
        [--batch_size 128] [--checkpoint best] [--length_penalty 0.6] [--json OUT]

Loads the run exactly as evaluate.py does (`evaluation.loading.load_tokenizer`,
`evaluation.loading.load_params`: config.json, tokenizer, orbax checkpoint) and translates the
split of the run's dataset (Multi30k test = test_2016_flickr, 1,000 sentences) with
`evaluation.corpus.translate_lines` (evaluate.py's), i.e.
`models.translate.translate_ids`: length-sorted batches of `--batch_size` sentences,
one jitted search per batch (`--beam_size 1` = greedy). The timed span is end to end:
SentencePiece encoding, batching, search, detokenisation.

The whole set is translated twice in the same process:
  * `first_pass_s`: includes compiling every (batch shape, max_length) program;
  * `decode_s`: the second pass, steady state (everything already compiled);
  * `compile_s` = first_pass_s - decode_s; `compile_s_jax_events` = JAX's compile events
    of the first pass, `recompile_s_jax_events` those of the second pass (0 = nothing
    recompiled).
  sentences_per_sec and target_tokens_per_sec (generated tokens without eos) come from
  the second pass; both passes must produce identical output (`same_output_both_passes`).

`mfu` is null: decoding is latency-bound and its work depends on how long each batch
runs before its early exit. `mfu_approx` is a lower-bound sketch, forward matmuls only:
    F = 2 * P_src * N_src + 2 * P_tgt * beam_size * sum_i (len_i + 1)
with P_src / P_tgt from `bench.flops.count_matmul_params` (the decoder weights
and the tied output projection run once per hypothesis and step; len_i + 1 counts the
eos step), attention and padded / finished rows not counted; divided by the decode
time and the matmul peak of the model's dtype measured in this run.

Memory: `peak_rss_mb` = ru_maxrss after both passes (before the matmul peak is measured).
BLEU (sacreBLEU, cased detokenized) and the lowercased Moses-tokenized BLEU of the
Multi30k literature are reported as a sanity check that the model decodes properly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish, load_run  # noqa: E402
from bench.flops import count_matmul_params  # noqa: E402
from bench.matmul_peak import DEFAULT_SIZES, device_info, measure_peaks, parse_sizes  # noqa: E402
from bench.train_throughput import device_peak_mb, peak_rss_mb  # noqa: E402


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns the JSON result."""
    import jax

    from evaluation.corpus import translate_lines
    from evaluation.scoring import score

    cfg, tokenizer, loaded, sources, references = load_run(
        args.workdir, args.checkpoint, args.split, args.max_sentences)
    batch_size = args.batch_size or int(cfg.eval.batch_size)

    passes = []
    for _ in range(2):
        hyps, timing = translate_lines(
            loaded.model, tokenizer, sources, beam_size=args.beam_size,
            length_penalty=args.length_penalty, batch_size=batch_size,
            bucket_step=int(cfg.data.bucket_step))
        passes.append((hyps, timing))
    rss_mb, dev_mb = peak_rss_mb(), device_peak_mb()
    (first_hyps, first), (hyps, steady) = passes

    peaks = measure_peaks(args.peak_sizes, args.peak_repeats)
    dtype = str(cfg.model.dtype)
    peak = peaks.get(dtype)
    counter = count_matmul_params(loaded.model)
    src_tokens = sum(len(ids) for ids in tokenizer.encode_source([s for s in sources if s]))
    decoder_steps = steady["target_tokens"] + steady["sentences_translated"]
    approx_flops = (2.0 * counter.src_params * src_tokens
                    + 2.0 * counter.tgt_params * args.beam_size * decoder_steps)
    seconds = steady["decode_seconds"]
    scores = score(hyps, references, compat_lc_tok=True, target_lang=cfg.data.target_lang)
    return {
        "workdir": str(args.workdir),
        "checkpoint_step": loaded.steps[-1],
        "split": args.split,
        "dataset": f"{cfg.data.dataset} {cfg.data.source_lang}-{cfg.data.target_lang}",
        "num_sentences": len(sources),
        "beam_size": args.beam_size,
        "decode": "greedy" if args.beam_size == 1 else "beam",
        "length_penalty": args.length_penalty,
        "batch_size": batch_size,
        "model": {k: cfg.model[k] for k in ("d_model", "num_encoder_layers",
                                            "num_decoder_layers", "num_heads", "d_ff", "dtype")},
        "sentences_per_sec": steady["sentences_per_sec"],
        "target_tokens_per_sec": steady["target_tokens_per_sec"],
        "target_tokens": steady["target_tokens"],
        "source_tokens": src_tokens,
        "decode_s": seconds,
        "first_pass_s": first["decode_seconds"],
        "compile_s": first["decode_seconds"] - seconds,
        "compile_s_jax_events": first["compile_seconds"],
        "recompile_s_jax_events": steady["compile_seconds"],
        "same_output_both_passes": first_hyps == hyps,
        "mfu": None,
        "mfu_approx": approx_flops / seconds / 1e9 / peak if peak else None,
        "mfu_approx_formula": "2 * P_src * N_src + 2 * P_tgt * beam_size * sum_i (len_i + 1)",
        "matmul_params_src": counter.src_params,
        "matmul_params_tgt": counter.tgt_params,
        "peak_gflops": peak,
        "peak_dtype": dtype,
        "peak_gflops_f32": peaks.get("float32"),
        "peak_gflops_bf16": peaks.get("bfloat16"),
        "peak_sizes": list(args.peak_sizes),
        "peak_rss_mb": rss_mb,
        "device_peak_mb": dev_mb,
        "bleu": scores["bleu"],
        "bleu_signature": scores["bleu_signature"],
        "bleu_lc_tok": scores["bleu_lc_tok"],
        "chrf": scores["chrf"],
        "compilation_cache": jax.config.jax_compilation_cache_dir,
        **device_info(),
    }


def print_table(result: dict) -> None:
    """The headline figures as an aligned two-column table."""
    def fmt(value, spec: str = ".4g") -> str:
        return "n/a" if value is None else format(value, spec)

    decode = "greedy" if result["beam_size"] == 1 else f"beam {result['beam_size']}"
    rows = [
        ("run", f"{result['workdir']} (step {result['checkpoint_step']})"),
        ("data", f"{result['dataset']} {result['split']}, {result['num_sentences']} sentences"),
        ("decoding", f"{decode}, batch {result['batch_size']}"),
        ("device", f"{result['device']} x{result['device_count']}"),
        ("sentences/s", fmt(result["sentences_per_sec"], ",.1f")),
        ("target tokens/s", fmt(result["target_tokens_per_sec"], ",.0f")),
        ("decode time (2nd pass)", f"{fmt(result['decode_s'], '.2f')} s"),
        ("first pass", f"{fmt(result['first_pass_s'], '.2f')} s"),
        ("compile (1st - 2nd pass)", f"{fmt(result['compile_s'], '.2f')} s"),
        ("compile (JAX events)", f"{fmt(result['compile_s_jax_events'], '.2f')} s"),
        ("recompile in 2nd pass", f"{fmt(result['recompile_s_jax_events'], '.2f')} s"),
        ("approx. MFU", fmt(result["mfu_approx"], ".2%")),
        (f"matmul peak {result['peak_dtype']} GFLOP/s", fmt(result["peak_gflops"], ".1f")),
        ("peak RSS", f"{fmt(result['peak_rss_mb'], '.0f')} MiB"),
        ("BLEU (sacreBLEU / lc-tok)", f"{fmt(result['bleu'], '.2f')} / "
                                      f"{fmt(result['bleu_lc_tok'], '.2f')}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a trained run directory")
    parser.add_argument("--beam_size", type=int, default=5, help="1 = greedy [5]")
    parser.add_argument("--split", choices=("valid", "test"), default="test", help="[test]")
    parser.add_argument("--batch_size", type=int, default=128, help="sentences per batch [128]")
    parser.add_argument("--checkpoint", default=None,
                        help="best | last | STEP [best, as evaluate.py]")
    parser.add_argument("--length_penalty", type=float, default=0.6, help="GNMT alpha [0.6]")
    parser.add_argument("--max_sentences", type=int, default=0,
                        help="only the first N sentences (0 = all; for quick checks)")
    parser.add_argument("--peak_sizes", type=parse_sizes, default=DEFAULT_SIZES,
                        help="matmul sizes for the peak [1024,2048,4096]")
    parser.add_argument("--peak_repeats", type=int, default=5, help="[5]")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.beam_size < 1 or args.batch_size < 1 or args.max_sentences < 0:
        parser.error("--beam_size and --batch_size must be >= 1, --max_sentences >= 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    return finish(parse_args(argv), run, print_table)


if __name__ == "__main__":
    main()
