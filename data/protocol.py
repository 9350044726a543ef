"""Text protocols (`data.text_protocol`): which form of the text is trained on and scored.

  raw          the corpus as released: cased, untokenised. BLEU is sacreBLEU on
               detokenised, cased text (its `bleu_lc_tok` lowercases and tokenises both
               sides afterwards: evaluation/scoring.py).
  lc_norm_tok  the text of the Multi30k literature: lowercased, punctuation-normalised,
               Moses-tokenised, with Moses' XML escapes ("&apos;", "&quot;"). Multi30k
               reads the official `*.lc.norm.tok.*` files (data/multi30k/tok/); any other
               dataset passes through `lc_norm_tok`, sacremoses' port of the same Moses
               scripts. The tokenizer trains on this text, the model translates it, and
               BLEU is computed on it as it is (no re-tokenisation).

`lc_norm_tok` reproduces the official Multi30k files on the raw ones for 99.98% of their
lines (data/multi30k/tok/README.md); the rest is a quirk of the Perl script of the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

RAW, LC_NORM_TOK = "raw", "lc_norm_tok"


def protocol_of(cfg_data) -> str:
    """`data.text_protocol`; "raw" for a config written before the key existed."""
    return cfg_data.get("text_protocol", RAW)


@lru_cache(maxsize=8)
def _moses(lang: str):
    # Building them compiles dozens of regexes: once per language and process.
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)


def lc_norm_tok(lines: Sequence[str], lang: str) -> list[str]:
    """Raw lines in the literature's form: lowercase, normalise punctuation, tokenise.

    Lowercasing first reproduces the official files better than lowercasing last (99.98%
    of Multi30k's lines against 99.88%). Each line is normalised with a newline after it,
    as the Perl script read it: some rules look at the character after a quote (German
    and French move a final full stop out of quotes only then). Empty lines stay empty.
    """
    normalizer, tokenizer, _ = _moses(lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower() + "\n").strip(),
                               escape=True, return_str=True) if line else ""
            for line in lines]


def detokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses-detokenised lines (escapes undone, spaces removed where Moses put them); the
    case stays lowercase: the protocol threw it away."""
    _, _, detokenizer = _moses(lang)
    return [detokenizer.detokenize(line.split(), unescape=True) for line in lines]


def apply_protocol(cfg_data, sources: list[str], targets: list[str]) -> tuple[list[str], list[str]]:
    """Raw (sources, targets) in the config's protocol: unchanged for "raw", else through
    `lc_norm_tok` in each side's language."""
    if protocol_of(cfg_data) == RAW:
        return sources, targets
    return (lc_norm_tok(sources, cfg_data.source_lang),
            lc_norm_tok(targets, cfg_data.target_lang))
