"""What each attention head does, measured on its weights (after Voita et al. 2019).

Per head, averaged over every valid query row of every sentence:
  confidence   the largest weight of the row ("confident" heads put most mass on one key);
  entropy      -sum w log w of the row, in nats;
  previous, same, next
               the weight on the key one position before, at, or after the query position
               (self-attention only: positional heads);
  eos          the weight on the end-of-sentence key (`</s>` of the source; `<s>` for the
               decoder's self-attention, whose keys are decoder inputs): "no-op" heads;
  punctuation  the weight on punctuation keys;
  rare         the weight on the sentence's rarest key token (by training-data frequency):
               rare-word heads.

`HeadStats` accumulates batches of weights [L, B, H, Tq, Tk] and returns [L][H] lists.
NumPy only: the statistics run on the host while the next batch is computed.
"""

from __future__ import annotations

import numpy as np

ROLES = ("previous", "same", "next", "eos", "punctuation", "rare")
METRICS = ("confidence", "entropy", *ROLES)


class HeadStats:
    """Running per-head means of `METRICS` over query rows.

    Args:
      num_layers, num_heads: L, H of one attention kind.
      positional: whether previous/same/next apply (self-attention kinds).
    """

    def __init__(self, num_layers: int, num_heads: int, *, positional: bool):
        self.positional = positional
        self.sums = {m: np.zeros((num_layers, num_heads)) for m in METRICS}
        self.rows = 0

    def add(self, weights: np.ndarray, query_valid: np.ndarray, key_flags: dict[str, np.ndarray]
            ) -> None:
        """Adds one batch.

        weights: float [L, B, H, Tq, Tk] (rows over valid keys sum to 1, padding 0);
        query_valid: bool [B, Tq]; key_flags: bool [B, Tk] arrays "eos", "punctuation" and
        "rare" marking the keys of each role.
        """
        w = np.asarray(weights, np.float64)
        rows = np.asarray(query_valid, bool)[None, :, None, :]  # [1, B, 1, Tq]
        self.rows += int(rows.sum())

        def add(metric: str, per_row: np.ndarray) -> None:  # per_row [L, B, H, Tq]
            self.sums[metric] += np.where(rows, per_row, 0.0).sum(axis=(1, 3))

        add("confidence", w.max(axis=-1))
        add("entropy", -(w * np.log(np.where(w > 0, w, 1.0))).sum(axis=-1))
        for role in ("eos", "punctuation", "rare"):
            flags = np.asarray(key_flags[role], np.float64)[None, :, None, None, :]
            add(role, (w * flags).sum(axis=-1))
        if self.positional:
            tq, tk = w.shape[-2:]
            for role, offset in (("previous", -1), ("same", 0), ("next", 1)):
                diagonal = np.eye(tq, tk, k=offset)  # query i, key i + offset
                add(role, (w * diagonal).sum(axis=-1))

    def result(self) -> dict[str, list[list[float]] | None]:
        """{metric: [L][H] means over rows} (None for positional metrics of cross-attention)."""
        rows = max(self.rows, 1)
        return {m: (None if m in ("previous", "same", "next") and not self.positional
                    else (self.sums[m] / rows).tolist()) for m in METRICS}


def is_punctuation(piece: str) -> bool:
    """A SentencePiece piece made only of punctuation (its word-start mark aside)."""
    text = piece.replace("\u2581", "")
    return bool(text) and all(not c.isalnum() and not c.isspace() for c in text)


def rarest_flags(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """bool [B, T]: the key with the lowest training count in each row (pad id 0 and the
    special ids below 4 excluded; ties: the first).

    ids: int [B, T]; counts: int [V] training-data frequency of each id.
    """
    ids = np.asarray(ids)
    freq = np.where(ids >= 4, counts[ids], np.iinfo(np.int64).max)
    flags = np.zeros(ids.shape, bool)
    has_word = (ids >= 4).any(axis=1)
    flags[np.arange(len(ids))[has_word], freq.argmin(axis=1)[has_word]] = True
    return flags
