"""Sequence packing: training batches of one shape [R, L] for the whole run.

With padded length buckets (data/batching.py's `TrainBatcher`) a run meets one batch
shape per bucket, and jit compiles the train step once for each; a third of the
positions the model computes are padding. `PackedBatcher` instead places several pairs
in each row of L positions, on the source and the target side alike (pair k of a row
occupies segment k + 1 on both sides), in batches of R rows:

  src, tgt_in, tgt_out            int32 [R, L]  ids, 0 after the row's last segment
  src_segments, tgt_segments      int32 [R, L]  1, 2, ... per pair in the row; 0 = padding
  src_positions, tgt_positions    int32 [R, L]  position within the pair's own sentence
  num_tokens                      int           non-pad tokens of tgt_out

The model lets a position attend only within its own segment (encoder, decoder) or to
its own pair's source (cross-attention), and embeds positions per sentence: every pair
sees exactly what it would see alone in a padded batch, so its loss is the same.

Shape: L = max(`pack_length`, the longest pair rounded up to 8), computed once from the
corpus, so no pair is dropped or cut; R = the rows `batch_tokens` positions make
(batch_tokens // L, rounded down to a multiple of the device count). A batch's last
rows may be all-pad (zero tokens, no loss weight).

Epoch e: the pairs in an order drawn from numpy.random.default_rng([seed, e]), laid
first-fit into the rows of the batch being filled (a row must have room on both
sides); the first pair that fits in no row closes the batch and starts the next one.
On the tiny recipe's Multi30k (BPE 10,000, rows of 64) that fills 0.94 of the source
positions and 0.92 of the target ones; trying up to 8 or 32 more pairs before closing
(a lookahead) saved 0 or 1 batch of 116 an epoch, so there is none. The number of
batches differs from epoch to epoch; `EpochBatches.iterate` / `position` (data/batching.py) follow each epoch's own
count, so a resumed run gets exactly the batches an uninterrupted one would have.
Runs in train.py's input thread: planning an epoch of Multi30k's 29,000 pairs takes
about 0.03 s on the development CPU, building its batches the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from common.errors import UserError
from data.batching import (
    Batch,
    EpochBatches,
    TokenArray,
    TrainBatcher,
    as_token_array,
    round_up,
)
from data.tokenizer import BOS_ID, EOS_ID

PACKED_KEYS = ("src", "tgt_in", "tgt_out", "src_segments", "tgt_segments", "src_positions",
               "tgt_positions")


def plan_rows(src_lengths: np.ndarray, tgt_lengths: np.ndarray, order: np.ndarray,
              rows: int, length: int) -> list[np.ndarray]:
    """Lays pairs, in `order`, first-fit into batches of `rows` rows of `length` positions
    per side; the pair that fits in no row of the open batch starts the next one.

    Args:
      src_lengths, tgt_lengths: int [N], positions each pair takes on each side (the
        source with eos; the target + 1, for bos / eos); each at most `length`.
      order: int [M], the pairs to lay, in the order they are offered.
      rows, length: R and L of every batch.
    Returns:
      One int64 array [n, 4] per batch: (pair, row, source offset, target offset) of its
      n pairs in placement order (so `order` read batch after batch). Every pair of
      `order` is in exactly one batch.
    """
    # Plain Python lists: a pair scans a few dozen rows, where NumPy's per-call cost
    # would dominate (4x slower on Multi30k).
    src, tgt = src_lengths.tolist(), tgt_lengths.tolist()
    batches: list[np.ndarray] = []
    placed: list[tuple[int, int, int, int]] = []
    used_src, used_tgt = [0] * rows, [0] * rows
    for pair in order.tolist():
        s, t = src[pair], tgt[pair]
        room_s, room_t = length - s, length - t
        for row in range(rows):
            if used_src[row] <= room_s and used_tgt[row] <= room_t:
                break
        else:  # the batch is as full as this pair finds it: close it
            batches.append(np.array(placed, np.int64))
            placed, row = [], 0
            used_src, used_tgt = [0] * rows, [0] * rows
        placed.append((pair, row, used_src[row], used_tgt[row]))
        used_src[row] += s
        used_tgt[row] += t
    if placed:
        batches.append(np.array(placed, np.int64))
    return batches


def _spans(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start + i, i) for i in range(length), for each (start, length), concatenated."""
    ends = np.cumsum(lengths)
    within = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - lengths, lengths)
    return np.repeat(starts, lengths) + within, within


def packed_batch(source_ids: TokenArray, target_ids: TokenArray, placement: np.ndarray,
                 rows: int, length: int) -> Batch:
    """The packed batch (module docstring) of one `plan_rows` batch.

    Args:
      source_ids: source ids with eos; target_ids: target ids without specials.
      placement: int [n, 4] (pair, row, source offset, target offset), pairs in each row
        in increasing offset order (as `plan_rows` gives them).
      rows, length: R and L.
    Returns:
      {key: int32 [R, L] for PACKED_KEYS, "num_tokens": int}.
    """
    out = {key: np.zeros((rows, length), np.int32) for key in PACKED_KEYS}
    flat = {key: value.reshape(-1) for key, value in out.items()}
    pairs, row, src_at, tgt_at = placement.T
    # Segment k + 1 for the k-th pair of its row: placements come in offset order per row.
    by_row = np.argsort(row, kind="stable")
    sorted_rows = row[by_row]
    group_start = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
    rank = np.arange(len(row)) - np.repeat(group_start, np.diff(np.r_[group_start, len(row)]))
    segment = np.empty(len(row), np.int32)
    segment[by_row] = rank + 1
    src_len = source_ids.lengths[pairs]
    tgt_len = target_ids.lengths[pairs]

    where, within = _spans(row * length + src_at, src_len)
    flat["src"][where] = source_ids.ids[_spans(source_ids.offsets[pairs], src_len)[0]]
    flat["src_segments"][where] = np.repeat(segment, src_len)
    flat["src_positions"][where] = within
    # Each target takes its tokens + 1 positions: [bos] + ids in, ids + [eos] out.
    where, within = _spans(row * length + tgt_at, tgt_len + 1)
    flat["tgt_segments"][where] = np.repeat(segment, tgt_len + 1)
    flat["tgt_positions"][where] = within
    ids = target_ids.ids[_spans(target_ids.offsets[pairs], tgt_len)[0]]
    first = row * length + tgt_at
    flat["tgt_in"][first] = BOS_ID
    flat["tgt_in"][_spans(first + 1, tgt_len)[0]] = ids
    flat["tgt_out"][_spans(first, tgt_len)[0]] = ids
    flat["tgt_out"][first + tgt_len] = EOS_ID
    return {**out, "num_tokens": int(np.sum(tgt_len + 1))}


class PackedBatcher(EpochBatches):
    """Packed, shuffled, resumable training batches of one shape (module docstring).

    Attributes:
      rows, length: R and L of every batch.
      num_pairs: pairs per epoch.
    """

    def __init__(self, source_ids: TokenArray | Sequence[Sequence[int]],
                 target_ids: TokenArray | Sequence[Sequence[int]], batch_tokens: int,
                 pack_length: int, *, batch_multiple: int = 1, seed: int = 0):
        """Measures the corpus once; each epoch's plan is made when first asked for.

        Args:
          source_ids, target_ids: parallel tokenized pairs as for `TrainBatcher` (sources
            with eos, targets without specials), TokenArrays or lists of id lists.
          batch_tokens: positions per side of a batch, R * L <= batch_tokens.
          pack_length: the least row length L.
          batch_multiple: R is a multiple of this (the number of data-parallel devices).
          seed: shuffling seed.
        Raises:
          UserError: empty input, or a budget too small for `batch_multiple` rows of L.
        """
        if len(source_ids) != len(target_ids) or not len(source_ids):
            raise UserError(f"batching needs equal, non-zero numbers of sources and targets "
                            f"(got {len(source_ids)} and {len(target_ids)})")
        self.source_ids, self.target_ids = as_token_array(source_ids), as_token_array(target_ids)
        self.seed, self.num_pairs = seed, len(self.source_ids)
        self.src_lengths = self.source_ids.lengths
        self.tgt_lengths = self.target_ids.lengths + 1  # [bos] + ids, ids + [eos]
        longest = int(max(self.src_lengths.max(), self.tgt_lengths.max()))
        self.length = max(pack_length, round_up(longest, 8))
        self.rows = batch_tokens // self.length // batch_multiple * batch_multiple
        if self.rows == 0:
            raise UserError(f"train.batch_tokens={batch_tokens} cannot hold {batch_multiple} "
                            f"packed row(s) of {self.length} tokens; raise it to at least "
                            f"{batch_multiple * self.length}")
        self._plan_cache: tuple[int, list[np.ndarray]] | None = None
        self._lengths: dict[int, int] = {}

    def shapes(self) -> list[tuple[int, int]]:
        """[(R, L)]: the one shape of every batch."""
        return [(self.rows, self.length)]

    def epoch_plan(self, epoch: int) -> list[np.ndarray]:
        """The batches of `epoch`: `plan_rows` placements, in order."""
        if self._plan_cache is not None and self._plan_cache[0] == epoch:
            return self._plan_cache[1]
        order = np.random.default_rng([self.seed, epoch]).permutation(self.num_pairs)
        plan = plan_rows(self.src_lengths, self.tgt_lengths, order, self.rows, self.length)
        self._plan_cache = (epoch, plan)
        self._lengths[epoch] = len(plan)
        return plan

    def epoch_length(self, epoch: int) -> int:
        """Batches of `epoch` (it differs between epochs)."""
        if epoch not in self._lengths:
            self.epoch_plan(epoch)
        return self._lengths[epoch]

    def batch(self, epoch: int, index: int) -> Batch:
        """Batch number `index` (0-based) of epoch `epoch`."""
        return packed_batch(self.source_ids, self.target_ids, self.epoch_plan(epoch)[index],
                            self.rows, self.length)


def make_batcher(source_ids: TokenArray | Sequence[Sequence[int]],
                 target_ids: TokenArray | Sequence[Sequence[int]], batch_tokens: int,
                 max_length: int, *, pack_length: int = 0, bucket_step: int = 8,
                 batch_multiple: int = 1, seed: int = 0,
                 fields: Mapping[str, Callable] | None = None) -> EpochBatches:
    """The training batcher of a run: `PackedBatcher` when `pack_length` > 0, else the
    padded buckets of `TrainBatcher` (arguments as theirs). A plug-in's per-pair fields
    (training/plugins.py) need one pair per row: with packing they are a ValueError (a
    plug-in refuses data.pack_length in its config check, before any work)."""
    if not pack_length:
        return TrainBatcher(source_ids, target_ids, batch_tokens, max_length,
                            bucket_step=bucket_step, batch_multiple=batch_multiple, seed=seed,
                            fields=fields)
    if fields:
        raise ValueError(f"data.pack_length={pack_length} puts several pairs in a row; the "
                        f"per-pair batch field(s) {', '.join(sorted(fields))} need "
                        "data.pack_length=0")
    return PackedBatcher(source_ids, target_ids, batch_tokens, pack_length,
                         batch_multiple=batch_multiple, seed=seed)
