"""Subword regularisation's draws: a sampled segmentation of each text, replayable from a seed.

Two methods, one per SentencePiece model type, behind `draw_segmentations`:
- unigram models, l-best sampling (Kudo 2018): each sentence's segmentation is drawn
  from its l best (SentencePiece's n-best list) with probability ~ P(segmentation)^alpha;
- BPE models, BPE-dropout (Provilkov et al. 2020): `BpeDropout`, each merge skipped with
  probability alpha.

SentencePiece samples both itself (`encode(..., enable_sampling=True)`), but its random
generator is salted per process: the same seed segments differently after a restart, so a
resumed run could not replay its epochs (tests/test_subword_sampling.py checks that these
draws replay). Here the randomness is numpy's, drawn in the texts' order from one seed.

`BpeDropout` runs the algorithm of the paper's code (Provilkov et al.'s `bpe.py`) on the
merges of a SentencePiece BPE model: the word's characters, then merges in the model's
order (the merged piece with the highest score first, the leftmost on ties), each
skipped with probability p when its turn comes; the skipped ones are offered again
after the next merge, so a word stops merging only when every merge left to it is
skipped in a row. SentencePiece's own BPE-dropout never offers a skipped merge again,
which splits words much further (1.40× the tokens of the best segmentation on Multi30k
De→En at p = 0.1, against 1.20× here). At p = 0 the result is SentencePiece's own
segmentation, piece for piece (tested on a corpus), and with the same draws it is the
paper's code's, piece for piece (tested against a port of it). Merges never cross
words (a piece holds "▁" only at its start), so a sentence is segmented word by word,
starting from SentencePiece's best pieces of that word; a word with a piece that is not
a plain vocabulary entry (an unknown character) keeps its best pieces.

    ids = draw_segmentations(sp, texts, Sampling(0.1, 16, seed=3, model_type="bpe"))
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

WORD_START = "\u2581"  # SentencePiece's "▁", its mark of a preceding space


@dataclasses.dataclass(frozen=True)
class Sampling:
    """One draw of subword regularisation (module docstring): `alpha` is l-best sampling's
    smoothing exponent for a unigram model and the merge-dropout probability for a BPE
    one (`model_type="bpe"`, which ignores `nbest_size`). `seed` fixes the draw: the same
    texts and seed give the same ids in any process."""

    alpha: float
    nbest_size: int
    seed: int
    model_type: str = "unigram"


def draw_segmentations(sp: spm.SentencePieceProcessor, texts: Sequence[str],
                       sampling: Sampling, add_eos: bool = False) -> list[list[int]]:
    """list[str] -> one sampled id list per text (+ eos when `add_eos`)."""
    rng = np.random.default_rng(sampling.seed)
    if sampling.model_type == "bpe":
        return BpeDropout(sp).encode(texts, sampling.alpha, rng, add_eos)
    eos = [sp.eos_id()] if add_eos else []
    ids = []
    for proto in sp.nbest_encode(list(texts), nbest_size=sampling.nbest_size, out_type="proto"):
        if not proto.nbests:  # an empty sentence
            ids.append(eos.copy())
            continue
        scores = sampling.alpha * np.array([best.score for best in proto.nbests])
        weights = np.exp(scores - scores.max())
        pick = int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum(), "right"))
        ids.append([piece.id for piece in proto.nbests[min(pick, len(weights) - 1)].pieces] + eos)
    return ids


class BpeDropout:
    """A BPE model's merge table, and segmentation with merges dropped at random."""

    def __init__(self, sp: spm.SentencePieceProcessor):
        self.sp = sp
        plain = (i for i in range(sp.get_piece_size())
                 if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i)))
        # piece -> (id, score): a merge a + b exists when the piece a + b does; BPE models
        # score pieces by the order their merges were learned (higher merges first).
        self.pieces = {sp.id_to_piece(i): (i, sp.get_score(i)) for i in plain}

    def merge(self, chars: Sequence[str], p: float, rng: np.random.Generator) -> list[str]:
        """One word's characters -> its pieces, each merge skipped with probability `p`.

        Args:
          chars: the word's characters, each a piece of the model (its first usually "▁").
          p: the dropout probability: 0 gives the model's own segmentation, 1 characters.
          rng: draws one number per merge considered (none when p is 0 or 1).
        """
        symbols = list(chars)
        count = len(symbols)
        after = [*range(1, count), -1]
        before = list(range(-1, count - 1))
        agenda: list[tuple[float, int, int, int]] = []

        def offer(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            piece = symbols[left] + symbols[right]
            entry = self.pieces.get(piece)
            if entry is not None:
                heapq.heappush(agenda, (-entry[1], left, right, len(piece)))

        for i in range(count - 1):
            offer(i, i + 1)
        dropped: list[tuple[float, int, int, int]] = []
        while agenda:
            entry = heapq.heappop(agenda)
            _, left, right, size = entry
            # A pair is stale once either side has merged with something else.
            if not symbols[left] or not symbols[right] or \
                    len(symbols[left]) + len(symbols[right]) != size:
                continue
            if p >= 1.0 or (p > 0.0 and rng.random() < p):
                dropped.append(entry)
                continue
            # The merges dropped since the last merge are offered again (the paper's code):
            # the word stops merging only when every merge left is dropped in a row.
            for again in dropped:
                heapq.heappush(agenda, again)
            dropped.clear()
            symbols[left] += symbols[right]
            symbols[right] = ""
            after[left] = after[right]
            if after[right] >= 0:
                before[after[right]] = left
            offer(before[left], left)
            offer(left, after[left])
        return [symbol for symbol in symbols if symbol]

    def encode(self, texts: Sequence[str], p: float, rng: np.random.Generator,
               add_eos: bool = False) -> list[list[int]]:
        """list[str] -> one id list per text (+ eos when `add_eos`), merges dropped with
        probability `p`; the draws follow the texts' order, so `rng`'s seed fixes them."""
        eos = [self.sp.eos_id()] if add_eos else []
        ids = []
        for proto in self.sp.encode(list(texts), out_type="proto"):
            row: list[int] = []
            for word in _words(proto.pieces):
                chars = list("".join(piece.piece for piece in word))
                if any(piece.id == self.sp.unk_id() for piece in word) or \
                        any(char not in self.pieces for char in chars):
                    row.extend(piece.id for piece in word)
                else:
                    row.extend(self.pieces[piece][0] for piece in self.merge(chars, p, rng))
            ids.append(row + eos)
        return ids


def _words(pieces) -> list[list]:
    """SentencePiece's pieces grouped into words: a new word at each piece starting "▁"."""
    words: list[list] = []
    for piece in pieces:
        if not words or piece.piece.startswith(WORD_START):
            words.append([])
        words[-1].append(piece)
    return words
