"""Scores of a translated corpus: sacreBLEU BLEU and chrF with their signatures and the
Multi30k literature's lc-tok BLEU. What evaluate.py, train.py's validation and the
comparisons of stored hypotheses (evaluation/significance.py) share, so one text gets one
score wherever it is scored.

Light (no JAX): the comparison command imports it before anything heavy.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable

from sacrebleu.metrics import BLEU, CHRF

from data.protocol import RAW


def moses_lc_tok(lines: list[str], lang: str) -> list[str]:
    """Lowercased, Moses-tokenized text (sacremoses, no XML escaping)."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line.lower(), escape=False, return_str=True) for line in lines]


def lc_tok_as_written(lines: list[str]) -> list[str]:
    """Text already lowercased and Moses-tokenised (`data.text_protocol=lc_norm_tok`) in
    `moses_lc_tok`'s form: only Moses' XML escapes are undone ("d&apos; un" -> "d' un"),
    since `moses_lc_tok` does not escape. Tokenising it again would split it further."""
    return [html.unescape(line) for line in lines]


# The scores a comparison of hypotheses can resample (evaluation/significance.py), by the
# names they have in evaluate.py's JSON.
METRICS = ("bleu", "bleu_lc_tok", "chrf")


def metric_for(name: str, target_lang: str = "en") -> tuple[BLEU | CHRF,
                                                       Callable[[list[str]], list[str]]]:
    """The sacreBLEU metric that computes score `name` of raw text, and what it does to
    each side's lines first (applied to hypotheses and references alike).

    "bleu" and "chrf": sacreBLEU's defaults on the text as given (cased, 13a-tokenised BLEU);
    "bleu_lc_tok": BLEU without tokenisation of both sides lowercased and Moses-tokenised
    (`moses_lc_tok`), the metric of the Multi30k literature.
    """
    if name == "bleu":
        return BLEU(), _as_given
    if name == "chrf":
        return CHRF(), _as_given
    if name == "bleu_lc_tok":
        # force: the text is tokenised on purpose (sacreBLEU would warn on every call); it
        # changes neither the score nor the signature.
        return BLEU(tokenize="none", force=True), functools.partial(moses_lc_tok,
                                                                      lang=target_lang)
    raise ValueError(f"unknown metric {name!r}: one of {', '.join(METRICS)}")


def _as_given(lines: list[str]) -> list[str]:
    return lines


def score(hyps: list[str], refs: list[str], *, compat_lc_tok: bool = False,
          target_lang: str = "en", text_protocol: str = RAW) -> dict:
    """sacreBLEU BLEU and chrF, their signatures and BLEU's details, in `text_protocol`.

    "raw": BLEU and chrF on detokenized, cased text; with `compat_lc_tok` also BLEU on
    lowercased Moses-tokenized text (both sides lowercased and tokenized here).
    "lc_norm_tok" (data/protocol.py): hypotheses and references are already the
    literature's text, so BLEU is computed on them as they are (sacreBLEU tokenize none,
    multi-bleu.perl's metric) and is also `bleu_lc_tok`, whatever `compat_lc_tok` says;
    chrF is computed on the same text.
    """
    if text_protocol != RAW:
        return _score_as_written(hyps, refs, text_protocol)
    out = {**_bleu_fields(BLEU(), hyps, refs), **_chrf_fields(hyps, refs)}
    if compat_lc_tok:
        lc_metric, prepare = metric_for("bleu_lc_tok", target_lang)
        lc = lc_metric.corpus_score(prepare(hyps), [prepare(refs)])
        out.update({
            "bleu_lc_tok": lc.score,
            "bleu_lc_tok_signature": str(lc_metric.get_signature()),
            "bleu_lc_tok_preprocessing": f"lowercase + sacremoses MosesTokenizer(lang="
                                         f"{target_lang!r}).tokenize(escape=False)",
            "bleu_lc_tok_text": str(lc),
        })
    return out


def _bleu_fields(metric: BLEU, hyps: list[str], refs: list[str]) -> dict:
    bleu = metric.corpus_score(hyps, [refs])
    return {"bleu": bleu.score, "bleu_signature": str(metric.get_signature()),
            "bleu_text": str(bleu),
            "bleu_details": {"precisions": list(bleu.precisions), "bp": bleu.bp,
                             "ratio": bleu.ratio, "hyp_len": bleu.sys_len,
                             "ref_len": bleu.ref_len}}


def _chrf_fields(hyps: list[str], refs: list[str]) -> dict:
    metric = CHRF()
    chrf = metric.corpus_score(hyps, [refs])
    return {"chrf": chrf.score, "chrf_signature": str(metric.get_signature()),
            "chrf_text": str(chrf)}


def _score_as_written(hyps: list[str], refs: list[str], text_protocol: str) -> dict:
    """`score` of text already in a tokenised protocol: nothing re-tokenised."""
    # force: the text is tokenised on purpose (sacreBLEU would warn on every call).
    out = {**_bleu_fields(BLEU(tokenize="none", force=True), hyps, refs), **_chrf_fields(hyps, refs),
           "text_protocol": text_protocol}
    out.update(bleu_lc_tok=out["bleu"], bleu_lc_tok_signature=out["bleu_signature"],
               bleu_lc_tok_text=out["bleu_text"],
               bleu_lc_tok_preprocessing=f"none: trained, translated and scored in "
                                         f"data.text_protocol={text_protocol!r}")
    return out


def score_detokenized(hyps: list[str], raw_refs: list[str]) -> dict:
    """sacreBLEU (its default 13a tokenisation, cased) of Moses-detokenised hypotheses of a
    tokenised protocol against the raw references. The hypotheses are lowercase, so this
    is NOT comparable with the cased BLEU of a run trained on raw text."""
    fields = _bleu_fields(BLEU(), hyps, raw_refs)
    return {"bleu_detok": fields["bleu"], "bleu_detok_signature": fields["bleu_signature"],
            "bleu_detok_text": fields["bleu_text"],
            "bleu_detok_note": "Moses-detokenised lowercase hypotheses against the cased raw "
                               "references: not comparable with a cased BLEU of raw text"}
