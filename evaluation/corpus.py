"""Translate a corpus, score it, record its attention maps: what evaluate.py and the
validation inside train.py share, so a validation BLEU equals evaluate.py's on that split.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from attention.heatmaps import preview_pngs
from attention.mapfile import save_maps
from data.batching import eval_batches
from data.protocol import RAW, protocol_of
from evaluation.previews import PreviewDrawer
from evaluation.scoring import score
from models.translate import record_maps, record_maps_grouped, translate_ids
from training.compilation import CompileTimer
from training.metrics_log import MetricsLog

MAX_PREVIEW_EXAMPLES = 8  # PNG previews for at most this many of the saved maps


def clean_line(text: str) -> str:
    """A hypothesis as one file line: no line breaks, no surrounding whitespace (so the
    scores computed here equal sacreBLEU run on the written file)."""
    return text.replace("\r", " ").replace("\n", " ").strip()


def translate_lines(model, tokenizer, sources: list[str], *, beam_size: int,
                    length_penalty: float, batch_size: int, bucket_step: int,
                    progress: bool = False) -> tuple[list[str], dict]:
    """Translates every line (an empty line gives an empty line without running the model).

    Returns (hypotheses in input order, timing dict: decode_seconds, compile_seconds,
    sentences_translated, target_tokens, sentences_per_sec, target_tokens_per_sec).
    """
    todo = [i for i, s in enumerate(sources) if s]
    hyps = [""] * len(sources)
    start = time.perf_counter()
    target_tokens = 0
    with CompileTimer() as compile_timer:
        if todo:
            ids = translate_ids(model, tokenizer.encode_source([sources[i] for i in todo]),
                                beam_size=beam_size, length_penalty=length_penalty,
                                batch_size=batch_size, bucket_step=bucket_step, progress=progress)
            target_tokens = sum(len(h) for h in ids)
            for i, text in zip(todo, tokenizer.decode_target(ids), strict=True):
                hyps[i] = clean_line(text)
    seconds = time.perf_counter() - start
    return hyps, {
        "decode_seconds": seconds,
        "compile_seconds": compile_timer.seconds,
        "sentences_translated": len(todo),
        "target_tokens": target_tokens,
        "sentences_per_sec": len(todo) / max(seconds, 1e-9),
        "target_tokens_per_sec": target_tokens / max(seconds, 1e-9),
    }


def summary_lines(result: dict) -> list[str]:
    """What evaluate.py prints of its result (its JSON): scores with signatures,
    sentences and speed."""
    lines = []
    if result.get("bleu") is not None:
        lines += [result["bleu_text"], f"  signature: {result['bleu_signature']}",
                  result["chrf_text"], f"  signature: {result['chrf_signature']}"]
        if result.get("text_protocol", RAW) != RAW:
            lines.append(f"  (scored as written, in data.text_protocol="
                         f"{result['text_protocol']}: the Multi30k literature's metric)")
        elif "bleu_lc_tok" in result:
            lines += [f"lowercased Moses-tokenized (compat) {result['bleu_lc_tok_text']}",
                      f"  signature: {result['bleu_lc_tok_signature']} (after "
                      f"{result['bleu_lc_tok_preprocessing']})"]
        if "bleu_detok" in result:
            lines += [f"detokenised {result['bleu_detok_text']}",
                      f"  signature: {result['bleu_detok_signature']} "
                      f"({result['bleu_detok_note']})"]
    t, d = result["timing"], result["decoding"]
    steps = result["checkpoint"]["steps"]
    ckpt = (f"step {steps[0]}" if len(steps) == 1
            else f"average of steps {', '.join(map(str, steps))}")
    if result.get("ensemble"):
        ckpt += f" (ensemble of {len(result['ensemble'])} runs: maps of the first)"
    lines.append(
        f"{result['num_sentences']} sentences ({result['num_empty']} empty), {ckpt}, "
        f"{d['decode']}{'' if d['beam_size'] == 1 else ' ' + str(d['beam_size'])}: "
        f"{t['decode_seconds']:.1f} s decoding, {t['sentences_per_sec']:.1f} sentences/s, "
        f"{t['target_tokens_per_sec']:.0f} target tokens/s ({t['compile_seconds']:.1f} s of it "
        f"compiling)")
    lines.append(f"wrote {result['files']['hyp']}" + (
        f" and {result['files']['attention']}" if result["files"].get("attention") else ""))
    return lines


def save_attention(model, tokenizer, sources: list[str], n: int, *, beam_size: int,
                   length_penalty: float, batch_size: int, step: int, out_dir: Path,
                   stem: str, progress: bool = False,
                   contributions: bool = False) -> tuple[Path, dict]:
    """Records the maps of the decoded hypotheses of the first `n` sentences and writes
    `<stem>.npz` plus PNG previews of the first few into `out_dir`.

    The maps are decoded in batches of sentences of similar length
    (`models.translate.record_maps_grouped`), so a very long sentence costs its own
    size, not N times it, and the weight buffers stay small. The file holds N examples
    in input order ([N, L, H, S, S] etc., padded to the longest: the padding is zeros,
    which `np.savez_compressed` stores in next to nothing). Previews skip sentences too
    long to draw quickly (`attention.heatmaps.preview_pngs`). `contributions` adds the
    norm-based maps and ALTI+ (models/contributions.py) to the file.

    Returns (path of the map file, timing {"attention_record_seconds",
    "attention_preview_seconds"}).
    """
    start = time.perf_counter()
    maps = record_maps_grouped(model, tokenizer, tokenizer.encode_source(sources[:n]),
                               beam_size=beam_size, length_penalty=length_penalty, step=step,
                               batch_size=batch_size, progress=progress,
                               contributions=contributions)
    path = save_maps(out_dir / f"{stem}.npz", maps)
    recorded = time.perf_counter()
    k = min(maps.num_examples, MAX_PREVIEW_EXAMPLES)
    preview = dataclasses.replace(maps, **{
        f.name: getattr(maps, f.name)[:k] for f in dataclasses.fields(maps)
        if f.name not in ("step", "decode") and getattr(maps, f.name) is not None})
    preview_pngs(preview, out_dir, stem)
    return path, {"attention_record_seconds": recorded - start,
                  "attention_preview_seconds": time.perf_counter() - recorded}


def validation_split(cfg, valid: tuple[list[str], list[str]]) -> tuple[list[str], list[str]]:
    """The (sources, targets) `validate` reads: all of them, or the first
    `eval.max_sentences`."""
    sources, targets = valid
    if cfg.eval.max_sentences:
        return sources[: cfg.eval.max_sentences], targets[: cfg.eval.max_sentences]
    return sources, targets


def validate(cfg, graphdef: nnx.GraphDef, params: dict, eval_step, tokenizer,
             valid: tuple[list[str], list[str]], step: int, log: MetricsLog,
             workdir: Path, previews: PreviewDrawer) -> dict[str, float | None]:
    """Validation loss, BLEU and chrF of the configured decoder, logged at `step`, and the
    attention maps of the first `attention_maps.num_examples` sentences (with
    `attention_maps.previews`, their PNG and TensorBoard previews handed to `previews`,
    which may draw them later). With `eval.decode` off, the teacher-forced loss alone (no
    decoding, BLEU or maps; the event says decode "none" and has no bleu). The event also
    says where the validation's wall time went: `seconds_loss`, `seconds_decode` (decoding
    and scoring), `seconds_maps` (recording and writing the maps, handing them to
    `previews`).
    Returns {"loss": label-smoothed loss per target token, "bleu": BLEU or None}."""
    start = time.perf_counter()
    sources, targets = validation_split(cfg, valid)
    totals = {"loss_sum": 0.0, "nll_sum": 0.0, "tokens": 0.0}
    for batch, _ in eval_batches(tokenizer.encode_source(sources), tokenizer.encode_target(targets),
                                 batch_size=cfg.eval.batch_size, bucket_step=cfg.data.bucket_step):
        batch.pop("num_tokens")
        for key, value in eval_step(params, batch).items():
            totals[key] += float(value)
    tokens = max(totals["tokens"], 1.0)
    losses = {"loss": totals["loss_sum"] / tokens, "nll": totals["nll_sum"] / tokens,
              "ppl": float(np.exp(totals["nll_sum"] / tokens))}
    seconds = {"seconds_loss": round(time.perf_counter() - start, 4)}
    if not cfg.eval.get("decode", True):
        log.write(step, "valid", **losses, decode="none", num_sentences=len(sources), **seconds)
        return {"loss": losses["loss"], "bleu": None}
    start = time.perf_counter()
    model = nnx.merge(graphdef, params)
    hyps, _ = translate_lines(model, tokenizer, sources, beam_size=cfg.eval.beam_size,
                              length_penalty=cfg.eval.length_penalty,
                              batch_size=cfg.eval.batch_size, bucket_step=cfg.data.bucket_step)
    protocol = protocol_of(cfg.data)
    scores = score(hyps, list(targets), text_protocol=protocol)
    seconds["seconds_decode"] = round(time.perf_counter() - start, 4)
    start = time.perf_counter()
    n = cfg.attention_maps.num_examples
    if cfg.attention_maps.enabled and n > 0 and jax.process_index() == 0:
        src_ids = tokenizer.encode_source(valid[0][:n])
        for target_ids in (tokenizer.encode_target(valid[1][:n]), None):  # forced, decoded
            maps = record_maps(model, tokenizer, src_ids, target_ids, beam_size=cfg.eval.beam_size,
                               length_penalty=cfg.eval.length_penalty, step=step,
                               contributions=cfg.attention_maps.get("contributions", False))
            stem = f"valid_step{step:07d}_{maps.decode}"
            map_file = save_maps(workdir / "attention" / f"{stem}.npz", maps)
            if cfg.attention_maps.previews:
                previews.submit(maps, map_file)
    seconds["seconds_maps"] = round(time.perf_counter() - start, 4)
    log.write(step, "valid", **losses, bleu=scores["bleu"], chrf=scores["chrf"],
              decode="greedy" if cfg.eval.beam_size == 1 else "beam", num_sentences=len(sources),
              **({} if protocol == RAW else {"text_protocol": protocol}), **seconds)
    return {"loss": losses["loss"], "bleu": scores["bleu"]}
