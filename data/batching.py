"""Token-budget batches with length buckets, deterministic and resumable.

Inputs are tokenized pairs as produced by data/tokenizer.py: source id lists
ending with eos, target id lists with no specials. A batch is a dict of numpy
arrays, padded with pad_id = 0:

  src      int32 [B, S]  source ids + eos
  tgt_in   int32 [B, T]  [bos] + target ids     (decoder input)
  tgt_out  int32 [B, T]  target ids + [eos]     (what the decoder predicts)
  num_tokens  int        non-pad tokens of tgt_out (a Python int: pop it before
                         handing the arrays to jit / device_put)
  ... and from a TrainBatcher given `fields`, one array per field (a training
  plug-in's, training/plugins.py), [B, ...]

Training batches: each pair goes to the bucket of
L = max(len(src), len(tgt) + 1), rounded up to a boundary (multiples of
`bucket_step` up to max_length, or explicit `boundaries`), and is padded to
S = T = that boundary. Each bucket has one batch size B, the largest multiple of
`batch_multiple` with B * L <= batch_tokens, so jit sees one shape per bucket.
A bucket's last, short batch is filled with all-pad rows (zero tokens, so they
carry no loss weight; attention code must tolerate fully masked rows).

Epoch e visits every pair exactly once, in an order drawn from
numpy.random.default_rng([seed, e]): shuffle within each bucket, cut into
batches, shuffle the batches. The number of batches per epoch is fixed, so a
global step maps to a position (epoch, index) and a resumed run gets exactly
the batches an uninterrupted one would have.

`EpochBatches` is what the training loop reads of a batcher (`iterate`, `position`);
data/packing.py's `PackedBatcher` is the other one: every batch one packed shape.
"""

import abc
import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from common.errors import UserError
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID

Batch = dict[str, np.ndarray | int]


class TokenArray:
    """Variable-length id sequences stored flat, as fairseq's and nanoGPT's binarised data:
    sequence i is `ids[offsets[i]:offsets[i + 1]]`. `ids` may be a read-only memory map
    (data/cache.py), so a corpus of millions of pairs costs only the pages a batch touches.

    Attributes:
      ids: uint16 or int32 [total tokens].
      offsets: int64 [N + 1], offsets[0] == 0, non-decreasing.
      lengths: int64 [N], tokens per sequence.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(ids):
            raise ValueError(f"offsets [{len(offsets)}] do not index ids [{len(ids)}]")
        self.ids, self.offsets = ids, offsets
        self.lengths = np.diff(offsets)

    @classmethod
    def from_lists(cls, sequences: Sequence[Sequence[int]]) -> "TokenArray":
        """Packs Python id lists (int32 ids)."""
        offsets = np.zeros(len(sequences) + 1, np.int64)
        np.cumsum([len(s) for s in sequences], out=offsets[1:])
        ids = np.fromiter((i for s in sequences for i in s), np.int32, int(offsets[-1]))
        return cls(ids, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]


def as_token_array(sequences: "TokenArray | Sequence[Sequence[int]]") -> TokenArray:
    """`sequences` as a TokenArray (packed once if it is a list of id lists)."""
    return sequences if isinstance(sequences, TokenArray) else TokenArray.from_lists(sequences)


def round_up(length: int, step: int) -> int:
    """Smallest multiple of `step` that is >= length (and >= step)."""
    return max(step, -(-length // step) * step)


def bucket_boundaries(max_length: int, step: int = 8) -> list[int]:
    """[step, 2*step, ..., round_up(max_length, step)]."""
    return list(range(step, round_up(max_length, step) + 1, step))


def make_batch(source_ids: Sequence[Sequence[int]], target_ids: Sequence[Sequence[int]] | None,
               rows: Sequence[int], batch_size: int, src_len: int, tgt_len: int) -> Batch:
    """Builds one padded batch from the pairs at `rows`.

    Args:
      source_ids: all source id lists (with eos).
      target_ids: all target id lists (no specials), or None for a
        source-only batch (no tgt_in/tgt_out).
      rows: indices of the pairs to put in rows 0..len(rows)-1.
      batch_size: B; rows len(rows)..B-1 are all pad.
      src_len, tgt_len: S and T; each must hold its sequence (T: tokens + 1).
    Returns:
      The batch dict described in the module docstring.
    """
    src = np.full((batch_size, src_len), PAD_ID, np.int32)
    for r, i in enumerate(rows):
        src[r, :len(source_ids[i])] = source_ids[i]
    batch: Batch = {"src": src}
    if target_ids is not None:
        tgt_in = np.full((batch_size, tgt_len), PAD_ID, np.int32)
        tgt_out = np.full((batch_size, tgt_len), PAD_ID, np.int32)
        num_tokens = 0
        for r, i in enumerate(rows):
            n = len(target_ids[i])
            tgt_in[r, 0] = BOS_ID
            tgt_in[r, 1:n + 1] = target_ids[i]
            tgt_out[r, :n] = target_ids[i]
            tgt_out[r, n] = EOS_ID
            num_tokens += n + 1
        batch.update(tgt_in=tgt_in, tgt_out=tgt_out, num_tokens=num_tokens)
    return batch


class EpochBatches(abc.ABC):
    """Training batches by (epoch, index), deterministic from the seed and the epoch, so a
    run resumed at a position gets exactly the batches an uninterrupted one would have.
    Subclasses give `epoch_length`, `batch` and `shapes`."""

    @abc.abstractmethod
    def epoch_length(self, epoch: int) -> int:
        """Number of batches of `epoch`."""

    @abc.abstractmethod
    def batch(self, epoch: int, index: int) -> Batch:
        """Batch number `index` (0-based) of epoch `epoch`."""

    @abc.abstractmethod
    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, length) batch shapes this batcher can produce."""

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, index) of the batch used at 0-based global `step`."""
        epoch = 0
        while step >= (length := self.epoch_length(epoch)):
            step, epoch = step - length, epoch + 1
        return epoch, step

    def iterate(self, start_epoch: int = 0, start_index: int = 0) -> Iterator[tuple[int, int, Batch]]:
        """Yields (epoch, index, batch) forever, from batch `start_index` of `start_epoch`
        (an index past the epoch's end starts the next epoch)."""
        epoch, index = start_epoch, start_index
        while True:
            for i in range(index, self.epoch_length(epoch)):
                yield epoch, i, self.batch(epoch, i)
            epoch, index = epoch + 1, 0


class TrainBatcher(EpochBatches):
    """Bucketed, shuffled, resumable training batches.

    Attributes:
      boundaries: bucket lengths (S = T of a batch).
      batch_sizes: bucket length -> B, for the buckets that hold pairs.
      num_batches: batches per epoch (the same every epoch).
    """

    def __init__(self, source_ids: TokenArray | Sequence[Sequence[int]],
                 target_ids: TokenArray | Sequence[Sequence[int]], batch_tokens: int, max_length: int, *, bucket_step: int = 8,
                 boundaries: Sequence[int] | None = None, batch_multiple: int = 1,
                 seed: int = 0, fields: Mapping[str, Callable] | None = None):
        """Assigns every pair to its bucket once (per epoch only indices move).

        Args:
          source_ids, target_ids: parallel tokenized pairs (see module docstring),
            already limited to max_length (tokenizer.encode_for_training), as
            TokenArrays (memory-mapped by data/cache.py) or lists of id lists. Only
            their lengths are read here; a batch reads its own rows.
          batch_tokens: budget, B * max(S, T) <= batch_tokens.
          max_length: the longest sequence incl. eos; longer pairs are an error.
          bucket_step: boundary spacing when `boundaries` is None.
          boundaries: explicit increasing bucket lengths, the last >= max_length.
          batch_multiple: B is a multiple of this (the number of data-parallel
            devices).
          seed: shuffling seed.
          fields: more arrays per batch, {name: fields(rows, B, L) -> array [B, ...]},
            rows the batch's pair indices (int [<= B]; its padding rows are B - len(rows)).
        Raises:
          UserError: empty input, a pair longer than the last boundary, or a
            budget too small to hold `batch_multiple` rows of some bucket.
        """
        if len(source_ids) != len(target_ids) or not source_ids:
            raise UserError(f"batching needs equal, non-zero numbers of sources and targets "
                            f"(got {len(source_ids)} and {len(target_ids)})")
        self.source_ids, self.target_ids = as_token_array(source_ids), as_token_array(target_ids)
        self.fields = dict(fields or {})
        self.boundaries = sorted(boundaries) if boundaries else bucket_boundaries(
            max_length, bucket_step)
        self.seed = seed
        lengths = np.maximum(self.source_ids.lengths, self.target_ids.lengths + 1)
        if lengths.max() > self.boundaries[-1]:
            raise UserError(f"a training pair has {lengths.max()} tokens, more than the "
                            f"largest bucket ({self.boundaries[-1]}); limit it with "
                            "tokenizer.encode_for_training")
        bucket_of = np.searchsorted(self.boundaries, lengths)
        # (bucket length, member indices in data order, batch size) per non-empty bucket.
        self._buckets: list[tuple[int, np.ndarray, int]] = []
        for b, length in enumerate(self.boundaries):
            members = np.flatnonzero(bucket_of == b)
            if len(members) == 0:
                continue
            size = batch_tokens // length // batch_multiple * batch_multiple
            if size == 0:
                raise UserError(f"train.batch_tokens={batch_tokens} cannot hold "
                                f"{batch_multiple} row(s) of {length} tokens; raise it to at "
                                f"least {batch_multiple * length}")
            self._buckets.append((length, members, size))
        self.batch_sizes = {length: size for length, _, size in self._buckets}
        self.num_batches = sum(math.ceil(len(m) / size) for _, m, size in self._buckets)
        self._plan_cache: tuple[int, list[tuple[int, np.ndarray]]] | None = None

    def shapes(self) -> list[tuple[int, int]]:
        """The (B, L) batch shapes this batcher can produce; S = T = L."""
        return [(size, length) for length, _, size in self._buckets]

    def epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """The batches of `epoch` as (bucket length, pair indices), in order.

        Every pair appears exactly once; only a bucket's last batch may hold
        fewer indices than its batch size.
        """
        if self._plan_cache is not None and self._plan_cache[0] == epoch:
            return self._plan_cache[1]
        rng = np.random.default_rng([self.seed, epoch])
        chunks = []
        for length, members, size in self._buckets:
            shuffled = rng.permutation(members)
            chunks.extend((length, shuffled[i:i + size]) for i in range(0, len(shuffled), size))
        plan = [chunks[i] for i in rng.permutation(len(chunks))]
        self._plan_cache = (epoch, plan)
        return plan

    def batch(self, epoch: int, index: int) -> Batch:
        """Batch number `index` (0-based) of epoch `epoch`."""
        length, rows = self.epoch_plan(epoch)[index]
        batch = make_batch(self.source_ids, self.target_ids, rows, self.batch_sizes[length],
                           length, length)
        for name, field in self.fields.items():
            batch[name] = field(rows, self.batch_sizes[length], length)
        return batch

    def epoch_length(self, epoch: int) -> int:
        """Batches per epoch: `num_batches`, whatever the epoch."""
        return self.num_batches

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, index) of the batch used at 0-based global `step`."""
        return divmod(step, self.num_batches)


def eval_batches(source_ids: Sequence[Sequence[int]],
                 target_ids: Sequence[Sequence[int]] | None = None, *, batch_size: int,
                 bucket_step: int = 8, batch_multiple: int = 1,
                 ) -> Iterator[tuple[Batch, np.ndarray]]:
    """Batches every sentence for evaluation, never dropping or truncating one.

    Sentences are grouped by `length_groups` (longest first, so each batch pads
    little and a too-large batch fails at once, not at the end; a sentence under half
    the length of its batch's longest starts a new batch, so one very long line never
    makes a hundred short ones decode for its budget). Each batch has B = batch_size
    rounded up to a multiple of `batch_multiple` rows (a smaller group: the next power
    of two; missing rows all-pad) and S, T rounded up to a multiple of `bucket_step`,
    which bounds the number of jit shapes.

    Args:
      source_ids: source id lists (with eos); empty and long ones are kept.
      target_ids: optional parallel target id lists (no specials); with them
        batches also hold tgt_in, tgt_out and num_tokens (for validation loss).
      batch_size: sentences per batch.
      bucket_step: padded lengths are multiples of this.
      batch_multiple: B is a multiple of this.
    Yields:
      (batch, indices): indices int64 [B], the original position of each row,
      -1 for padding rows. `restore_order` puts per-row results back in order.
    """
    n = len(source_ids)
    if target_ids is not None and len(target_ids) != n:
        raise UserError(f"eval batching got {n} sources and {len(target_ids)} targets")
    size = round_up(batch_size, batch_multiple)

    def length(i: int) -> int:
        return max(len(source_ids[i]), len(target_ids[i]) + 1 if target_ids is not None else 0)

    for rows in length_groups([length(i) for i in range(n)], size):
        # A short group (a very long line alone, the tail) gets the next power of two of
        # rows, not `size`: a handful of shapes, and no hundred filler rows per step.
        rows_padded = min(size, round_up(1 << (len(rows) - 1).bit_length(), batch_multiple))
        src_len = round_up(max(len(source_ids[i]) for i in rows), bucket_step)
        tgt_len = (round_up(max(len(target_ids[i]) + 1 for i in rows), bucket_step)
                   if target_ids is not None else 0)
        indices = np.full(rows_padded, -1, np.int64)
        indices[:len(rows)] = rows
        yield make_batch(source_ids, target_ids, rows, rows_padded, src_len, tgt_len), indices


def length_groups(lengths: Sequence[int], batch_size: int, *,
                  cost: Callable[[int, int], int] | None = None,
                  max_cost: int = 0) -> list[list[int]]:
    """Indices sorted longest first (ties in input order), cut into groups of similar
    length: a sentence joins the current group only if its length is more than half the
    group's first (longest), the group has fewer than `batch_size` members and, with
    `cost`, cost(longest length, members after joining) <= `max_cost` (a sentence whose
    own cost is higher is alone). The one batching rule of evaluation and map recording.
    """
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if groups:
            group = groups[-1]
            longest = lengths[group[0]]
            if (2 * lengths[i] > longest and len(group) < batch_size
                    and (cost is None or cost(longest, len(group) + 1) <= max_cost)):
                group.append(i)
                continue
        groups.append([i])
    return groups


def restore_order(values: Iterable[Sequence], indices: Iterable[np.ndarray], n: int) -> list:
    """Undoes the eval sort.

    Args:
      values: per batch, a sequence of B per-row results (e.g. hypotheses).
      indices: per batch, the indices array `eval_batches` yielded with it.
      n: number of sentences.
    Returns:
      A list of n results in original order (padding rows are skipped).
    Raises:
      ValueError: some sentence got no result.
    """
    out: list = [None] * n
    seen = np.zeros(n, bool)
    for batch_values, batch_indices in zip(values, indices, strict=True):
        for value, i in zip(batch_values, batch_indices, strict=False):
            if i >= 0:
                out[i], seen[i] = value, True
    if not seen.all():
        raise ValueError(f"{int((~seen).sum())} of {n} sentences have no result")
    return out


def padding_fraction(batches: Iterable[Batch]) -> float:
    """Fraction of pad positions over the src and tgt_out arrays of `batches`."""
    total = nonpad = 0
    for batch in batches:
        for key in ("src", "tgt_out"):
            if key in batch:
                array = np.asarray(batch[key])
                total += array.size
                nonpad += int(np.count_nonzero(array != PAD_ID))
    return 1.0 - nonpad / total if total else 0.0


def prefetch(iterator: Iterable, size: int = 2) -> Iterator:
    """Runs `iterator` in a background thread, keeping up to `size` items ready.

    Exceptions in the producer are re-raised in the consumer. The thread is a
    daemon; closing the generator stops it and waits for it (the item it is making
    is finished first).
    """
    items: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()
    done = object()

    def put(entry: tuple) -> bool:
        # Wait for room, but give up once the consumer has gone away.
        while not stop.is_set():
            try:
                items.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in iterator:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer.
            put((done, e))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item, error = items.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        # Wait for the producer to stop: left running into interpreter shutdown while
        # inside a C++ call (JAX placing a batch on the device), it aborts the process.
        stop.set()
        thread.join()
