"""Combining and scoring word-link sets: symmetrisation of two directions and the
alignment error rate with precision and recall against sure/possible gold links.

Links are (source word, target word) pairs, 0-indexed, as `attention.alignment` reads
them; gold is a list of (sure, possible) sets per sentence (`alignment.read_talp`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from attention.alignment import Link

SYMMETRIZE = ("grow-diag-final-and", "intersect", "union")
# The eight neighbours of grow-diag, in the order of fast_align's atools.cc.
_NEIGHBOURS = ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1))


def symmetrize(forward: Iterable[Link], reverse: Iterable[Link], method: str) -> list[Link]:
    """Combines the links of the two directions of one sentence pair.

    Both inputs are (source, target) pairs: the links of a target->source aligner must be
    transposed first. `method`:
      * "intersect": links in both; "union": links in either;
      * "grow-diag-final-and" (Koehn et al. 2003, 2005): start from the intersection;
        "grow-diag": repeatedly add a union link next to (8-neighbourhood) a link already
        in, if its source or its target word is still unaligned, until nothing is added;
        "final-and": add a forward link, then a reverse one, whose source and target
        words are both still unaligned.
    The visiting order is that of `atools -c grow-diag-final-and` (github.com/clab/
    fast_align, src/atools.cc, GDFACommand): candidates in (source, target) order, a
    pass sees the links added earlier in the same pass; so the result is atools'.
    Returns sorted links.
    """
    a, b = set(forward), set(reverse)
    if method == "intersect":
        return sorted(a & b)
    if method == "union":
        return sorted(a | b)
    if method != "grow-diag-final-and":
        raise ValueError(f"unknown symmetrization {method!r}; expected one of "
                         f"{', '.join(SYMMETRIZE)}")
    links = a & b
    src_done, tgt_done = {i for i, _ in links}, {j for _, j in links}

    def add(i: int, j: int) -> None:
        links.add((i, j))
        src_done.add(i)
        tgt_done.add(j)

    pending = sorted((a | b) - links)
    grown = True
    while grown:  # grow-diag
        grown, left = False, []
        for i, j in pending:
            if ((i not in src_done or j not in tgt_done)
                    and any((i + di, j + dj) in links for di, dj in _NEIGHBOURS)):
                add(i, j)
                grown = True
            else:
                left.append((i, j))
        pending = left
    for side in (a, b):  # final-and: the forward links first, then the reverse ones
        for i, j in sorted(side - links):
            if i not in src_done and j not in tgt_done:
                add(i, j)
    return sorted(links)


def alignment_scores(
    hyps: Sequence[Iterable[Link]],
    golds: Sequence[tuple[Iterable[Link], Iterable[Link]]],
) -> dict:
    """Corpus AER, precision and recall (Och & Ney 2003), counts summed over sentences.

    With A the hypothesis, S the sure and P the possible links (P taken as P ∪ S):
    precision = |A∩P| / |A|, recall = |A∩S| / |S|, AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|).
    Args: hyps [N] link lists, golds [N] (sure, possible) pairs as from `read_talp`.
    Returns: {"aer", "precision", "recall"} in [0, 1] (precision is 0 without any
    hypothesis link, recall 0 without any sure link), "sentences": N, and the counts
    "hyp_links" |A|, "sure_links" |S|, "hyp_in_sure" |A∩S|, "hyp_in_possible" |A∩P|.
    Raises ValueError: different lengths, or AER undefined (no A and no S link at all).
    """
    if len(hyps) != len(golds):
        raise ValueError(f"{len(hyps)} hypothesis alignments but {len(golds)} gold ones")
    a_s = a_p = n_a = n_s = 0
    for hyp, (sure, possible) in zip(hyps, golds, strict=True):
        a, s = set(hyp), set(sure)
        p = set(possible) | s
        a_s += len(a & s)
        a_p += len(a & p)
        n_a += len(a)
        n_s += len(s)
    if n_a + n_s == 0:
        raise ValueError("AER is undefined without any hypothesis or sure gold link")
    return {"aer": 1.0 - (a_s + a_p) / (n_a + n_s), "precision": a_p / n_a if n_a else 0.0,
            "recall": a_s / n_s if n_s else 0.0, "sentences": len(hyps), "hyp_links": n_a,
            "sure_links": n_s, "hyp_in_sure": a_s, "hyp_in_possible": a_p}


def aer(
    hyps: Sequence[Iterable[Link]],
    golds: Sequence[tuple[Iterable[Link], Iterable[Link]]],
) -> float:
    """Corpus alignment error rate (Och & Ney 2003): `alignment_scores(...)["aer"]`.

    AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) with A the hypothesis, S the sure and P the
    possible links (P is taken as P ∪ S). Args: hyps [N] link lists, golds [N]
    (sure, possible) pairs as from `read_talp`. Returns a float in [0, 1].
    """
    return alignment_scores(hyps, golds)["aer"]
