"""Minimum-Bayes-risk selection from an n-best list (Kumar & Byrne 2004; Eikema & Aziz
2020), here over beam search's n-best list.

Each sentence's candidates are both the hypotheses and the evidence: a candidate's
expected utility is its mean sentence-level score (sacreBLEU's BLEU with effective order,
or chrF) against every other candidate as a pseudo-reference, each weighted alike; the
candidate with the highest wins, the better-ranked one on a tie (so a one-entry list,
or candidates that all agree, return beam search's own answer). Its cost is K * (K - 1)
sentence scores a sentence, on the host, after decoding. Read beside beam search's answer by
`python -m evaluation.nbest`.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF

UTILITIES = ("bleu", "chrf")


def utility_metric(utility: str):
    """The sacreBLEU metric object scoring one candidate against one pseudo-reference."""
    if utility == "bleu":
        return BLEU(effective_order=True)  # sentence BLEU: short hypotheses keep a score
    if utility == "chrf":
        return CHRF()
    raise ValueError(f"utility must be one of {UTILITIES}, got {utility!r}")


def expected_utilities(candidates: list[str], utility: str) -> list[float]:
    """[K] each candidate's mean score against the other K - 1 (0.0 for K = 1)."""
    metric = utility_metric(utility)
    k = len(candidates)
    if k < 2:
        return [0.0] * k
    return [sum(metric.sentence_score(c, [o]).score for j, o in enumerate(candidates) if j != i)
            / (k - 1) for i, c in enumerate(candidates)]


def mbr_select(nbest: list[list[str]], utility: str) -> list[int]:
    """Per sentence, the index of the candidate of highest expected utility (the earlier
    on a tie; an empty list gives -1).

    nbest: per sentence, its candidates best-scored first (`translate_ids(nbest=True)`
    decoded to text).
    """
    chosen = []
    for candidates in nbest:
        gains = expected_utilities(candidates, utility)
        chosen.append(max(range(len(gains)), key=lambda i: (gains[i], -i)) if gains else -1)
    return chosen

