"""The standard comparison batches shared by every training benchmark.

Source and target lengths each round(N(16, 6)) clipped to [4, 40], token ids uniform in
[4, vocab), pairs added to a batch while n_sentences * max(longest source, longest
target) <= batch_tokens, each side padded to its own batch maximum (no bucketing),
numpy default_rng(seed). NumPy only, so that benchmarks of other frameworks
(bench/torch_reference.py) feed exactly the same batches without importing JAX.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from data.tokenizer import BOS_ID  # no JAX there either

SYNTHETIC_MEAN, SYNTHETIC_STD, SYNTHETIC_MIN, SYNTHETIC_MAX = 16, 6, 4, 40
FIRST_ID = 4  # ids below are pad, unk, bos, eos


Batch = dict[str, np.ndarray]


def synthetic_lengths(rng: np.random.Generator, size: int) -> np.ndarray:
    """round(N(16, 6)) clipped to [4, 40]."""
    lengths = np.rint(rng.normal(SYNTHETIC_MEAN, SYNTHETIC_STD, size))
    return np.clip(lengths, SYNTHETIC_MIN, SYNTHETIC_MAX).astype(np.int64)


def synthetic_batches(num_batches: int, batch_tokens: int, vocab_size: int = 8000,
                      seed: int = 0, batch_multiple: int = 1) -> list[Batch]:
    """The standard comparison batches (module docstring), deterministic for a seed.

    Pairs are drawn one at a time (source length, target length, source ids, target
    ids) and added to the open batch while (n + 1) * max(longest source, longest
    target) <= batch_tokens; otherwise the batch is closed and the pair opens the next.
    Row r of a batch: src = the source ids; tgt_out = the target ids; tgt_in = [bos] +
    the target ids but the last (the decoder input), so both target arrays hold T_r
    non-pad tokens. Each side is padded with 0 to its own batch maximum; with
    `batch_multiple` > 1 all-pad rows are appended up to a multiple (data parallelism).
    """
    if batch_tokens < SYNTHETIC_MAX:
        raise ValueError(f"batch_tokens={batch_tokens} cannot hold a {SYNTHETIC_MAX}-token pair")
    if vocab_size <= FIRST_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_ID}, got {vocab_size}")
    rng = np.random.default_rng(seed)

    def draw() -> tuple[np.ndarray, np.ndarray]:
        src_len, tgt_len = synthetic_lengths(rng, 2)
        return rng.integers(FIRST_ID, vocab_size, src_len), rng.integers(FIRST_ID, vocab_size, tgt_len)

    batches, pending = [], draw()
    while len(batches) < num_batches:
        pairs = [pending]
        longest = max(len(pending[0]), len(pending[1]))
        pending = draw()
        while (len(pairs) + 1) * max(longest, len(pending[0]), len(pending[1])) <= batch_tokens:
            pairs.append(pending)
            longest = max(longest, len(pending[0]), len(pending[1]))
            pending = draw()
        batches.append(pad_pairs(pairs, batch_multiple))
    return batches


def pad_pairs(pairs: Sequence[tuple[np.ndarray, np.ndarray]], batch_multiple: int = 1) -> Batch:
    """src / tgt_in / tgt_out int32 arrays of (source ids, target ids) pairs."""
    rows = -(-len(pairs) // batch_multiple) * batch_multiple
    src_len = max(len(s) for s, _ in pairs)
    tgt_len = max(len(t) for _, t in pairs)
    src = np.zeros((rows, src_len), np.int32)
    tgt_in = np.zeros((rows, tgt_len), np.int32)
    tgt_out = np.zeros((rows, tgt_len), np.int32)
    for r, (s, t) in enumerate(pairs):
        src[r, :len(s)] = s
        tgt_out[r, :len(t)] = t
        tgt_in[r, 0] = BOS_ID
        tgt_in[r, 1:len(t)] = t[:-1]
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}
