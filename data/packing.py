"""Sequence packing: the pairs of a padded training batch, several to a row.

A batch from data/batching.py pads every pair to the batch's longest sentence; with
short sentences a third to a half of the positions the model computes are padding.
Packing puts several pairs in one row of `length` positions, on the source and the
target side alike (pair k of a row occupies segment k + 1 on both sides), so the same
pairs, hence the same loss and gradient, cost fewer positions:

  src, tgt_in, tgt_out            int32 [R, L]  ids, 0 after the last segment
  src_segments, tgt_segments      int32 [R, L]  1, 2, ... per pair in the row; 0 = padding
  src_positions, tgt_positions    int32 [R, L]  position within the pair's own sentence

The model then lets a position attend only within its own segment (encoder, decoder)
or to its own pair's source (cross-attention), and embeds positions per sentence:
every pair sees exactly what it would see alone in a padded batch.

Pairs are placed first-fit in decreasing order of length (2-D: a row must have room
on both sides). L = max(`length`, longest sentence rounded up to 8) and R comes from
`packed_rows` (all-pad rows fill up), so few distinct shapes reach jit: five over
three epochs of Multi30k with the CPU recipe. Pure NumPy; runs in the input
pipeline's thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from data.batching import Batch, round_up
from data.tokenizer import PAD_ID

PACKED_KEYS = ("src", "tgt_in", "tgt_out", "src_segments", "tgt_segments", "src_positions",
               "tgt_positions")


def packed_rows(needed: int, nominal: int, multiple: int) -> int:
    """R for `needed` rows: a multiple of `multiple`, at least half of `nominal` (the rows
    the padded batch's positions would fill, so the short last batches of the length
    buckets share one shape), and above `nominal` a multiple of half of it (pairs too
    long to share a row are rare; they should not bring a shape each)."""
    half = round_up(max(nominal // 2, 1), multiple)
    rows = max(round_up(max(needed, 1), multiple), half)
    return rows if rows <= nominal else round_up(rows, half)


def pack_batch(batch: Batch, length: int, rows_multiple: int = 8) -> Batch:
    """Packs the pairs of a padded batch (data/batching.py layout) into rows.

    Args:
      batch: {"src": [B, S], "tgt_in": [B, T], "tgt_out": [B, T], ...}, right-padded with
        0; all-pad rows are dropped. Other keys (e.g. "num_tokens") are copied.
      length: row length L (positions per side); raised to hold the longest sentence.
      rows_multiple: R is rounded up to a multiple of this (and of the device count).
    Returns:
      The packed batch (module docstring), with the same non-pad tokens.
    """
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    src_len = np.count_nonzero(src != PAD_ID, axis=1)
    tgt_len = np.count_nonzero(tgt_out != PAD_ID, axis=1)
    pairs = np.flatnonzero((src_len > 0) | (tgt_len > 0))
    longest = int(max(src_len.max(initial=1), tgt_len.max(initial=1)))
    row_length = max(length, round_up(longest, 8))

    # First-fit decreasing: rows[r] = [used source positions, used target positions].
    order = pairs[np.argsort(-np.maximum(src_len[pairs], tgt_len[pairs]), kind="stable")]
    used: list[list[int]] = []
    placement: list[tuple[int, int, int, int]] = []  # (pair, row, src offset, tgt offset)
    for i in order:
        s, t = int(src_len[i]), int(tgt_len[i])
        r = next((r for r, (us, ut) in enumerate(used)
                  if us + s <= row_length and ut + t <= row_length), len(used))
        if r == len(used):
            used.append([0, 0])
        placement.append((int(i), r, used[r][0], used[r][1]))
        used[r][0] += s
        used[r][1] += t

    rows = packed_rows(len(used), nominal=src.size // row_length, multiple=rows_multiple)
    out = {key: np.zeros((rows, row_length), np.int32) for key in PACKED_KEYS}
    next_segment = np.zeros(rows, np.int32)
    for i, r, so, to in sorted(placement, key=lambda p: (p[1], p[2])):
        next_segment[r] += 1
        segment = next_segment[r]
        s, t = int(src_len[i]), int(tgt_len[i])
        out["src"][r, so:so + s] = src[i, :s]
        out["src_segments"][r, so:so + s] = segment
        out["src_positions"][r, so:so + s] = np.arange(s)
        out["tgt_in"][r, to:to + t] = tgt_in[i, :t]
        out["tgt_out"][r, to:to + t] = tgt_out[i, :t]
        out["tgt_segments"][r, to:to + t] = segment
        out["tgt_positions"][r, to:to + t] = np.arange(t)
    for key, value in batch.items():
        if key not in ("src", "tgt_in", "tgt_out"):
            out[key] = value
    return out


def pack_batches(batches: Iterable[tuple[int, int, Batch]], length: int,
                 rows_multiple: int) -> Iterator[tuple[int, int, Batch]]:
    """(epoch, index, batch) with each batch's pairs packed into rows of `length`
    (`pack_batch`); unchanged when `length` is 0. train.py runs it in the prefetch thread,
    off the training step."""
    for epoch, index, batch in batches:
        yield epoch, index, (pack_batch(batch, length, rows_multiple) if length else batch)
