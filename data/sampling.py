"""Subword regularisation: every epoch sees its own segmentation of the training pairs.

With `data.spm_sampling_alpha` > 0, epoch e re-encodes the training split (streamed again
from `TrainingSource.chunks`, data/streaming.py) with a sampled segmentation
(data/subword_draws.py): for a unigram model l-best sampling (Kudo 2018), each
sentence's segmentation drawn from its `data.spm_nbest_size` best with probability
proportional to P^alpha; for a BPE model BPE-dropout (Provilkov et al. 2020), each merge
skipped with probability alpha. The draws are numpy's, because SentencePiece's own
sampling salts its generator per process and could not be replayed on resume. Then the
epoch is batched like any other (data/packing.py's `make_batcher`: padded buckets or
packed rows, order from (train.seed, e)). The draw of chunk c of epoch e is seeded from
(train.seed, e, c), so a run killed anywhere and resumed gets the same segmentations and
batches as an uninterrupted one. Evaluation, decoding and alignment keep the best
(deterministic) segmentation.

Cost (bench/subword_sampling.py; Multi30k, 29,000 pairs, unigram 6,000, 2-core CPU): one
n-best encoding pass per epoch, 5.6 s at l = 8, 9.4 s at l = 16, 40 s at l = 64, done by
a background thread while the previous epoch trains. The step never waits for it, but on
2 cores it takes CPU from the step: with the CPU recipe (about 95 s an epoch) the log
windows that hold an epoch's start ran ~17% slower at l = 16, ~5% over the run.
BPE-dropout at p = 0.1 (De→En, BPE 10,000): 11 s per epoch, 1.20× the tokens. The
epoch's ids are held in memory as Python lists, then packed; the deterministic encoding
stays memory-mapped (data/cache.py). Sampled pieces are shorter:
the epoch has 5% (l = 8) to 10% (l = 64) more tokens at alpha 0.1, 2% at alpha 0.5, so
a batch of `train.batch_tokens` holds fewer pairs. Pairs that then exceed
`data.max_length` are dropped or truncated as `data.long_pairs` says, per epoch.

    epochs = SampledEpochs(source, tokenizer, cfg.data, batch_tokens=4096, seed=0)
    for epoch, index, batch in epochs.iterate(start_epoch, start_index): ...
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import ml_collections
import numpy as np

from data.batching import Batch, EpochBatches
from data.packing import make_batcher
from data.streaming import TrainingSource
from data.subword_draws import Sampling
from data.tokenizer import Tokenizer, encode_for_training

EPOCH_CHUNK = 20_000  # pairs encoded per call: the draw is seeded per chunk


def chunk_seed(seed: int, epoch: int, chunk: int) -> int:
    """SentencePiece's seed for one chunk's draw (below 2**31: the target side adds 1)."""
    return int(np.random.SeedSequence([seed, epoch, chunk]).generate_state(1)[0]) % (1 << 31)


class SampledEpochs:
    """Training batches whose segmentation is drawn afresh each epoch (module docstring).

    Yields what `EpochBatches.iterate` yields; the number of batches differs between
    epochs, so a run resumes from the (epoch, index) its iterator last gave, not from
    the step count.
    """

    def __init__(self, source: TrainingSource, tokenizer: Tokenizer,
                 cfg_data: ml_collections.ConfigDict, *, batch_tokens: int,
                 batch_multiple: int = 1, seed: int = 0):
        self.source, self.tokenizer, self.cfg_data = source, tokenizer, cfg_data
        self.batch_tokens, self.batch_multiple, self.seed = batch_tokens, batch_multiple, seed

    def encode_epoch(self, epoch: int) -> tuple[list[list[int]], list[list[int]], int]:
        """The sampled (source ids, target ids, pairs dropped as too long) of `epoch`,
        under `tokenizer.encode_for_training`'s rules."""
        sources, targets, dropped = [], [], 0
        for chunk, (src_text, tgt_text) in enumerate(self.source.chunks(EPOCH_CHUNK)):
            sampling = Sampling(float(self.cfg_data.spm_sampling_alpha),
                                int(self.cfg_data.spm_nbest_size), chunk_seed(self.seed, epoch, chunk),
                                str(self.cfg_data.spm_model_type))
            src, tgt, n = encode_for_training(self.tokenizer, src_text, tgt_text,
                                              self.cfg_data.max_length,
                                              self.cfg_data.long_pairs, sampling)
            sources.extend(src)
            targets.extend(tgt)
            dropped += n
        return sources, targets, dropped

    def batcher(self, epoch: int) -> EpochBatches:
        """The batcher of `epoch`'s segmentation (padded buckets, or packed rows with
        `data.pack_length`: their length is that epoch's longest pair's, so an epoch with a
        longer one brings a second shape); its `epoch_plan(epoch)` is that epoch."""
        sources, targets, _ = self.encode_epoch(epoch)
        return make_batcher(sources, targets, self.batch_tokens, self.cfg_data.max_length,
                            pack_length=self.cfg_data.pack_length,
                            bucket_step=self.cfg_data.bucket_step,
                            batch_multiple=self.batch_multiple, seed=self.seed)

    def iterate(self, start_epoch: int = 0, start_index: int = 0,
                ) -> Iterator[tuple[int, int, Batch]]:
        """(epoch, index, batch) forever from batch `start_index` of `start_epoch`; the
        next epoch is encoded in the background while this one is consumed."""
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="attnmt-sampling")
        try:
            upcoming = pool.submit(self.batcher, start_epoch)
            epoch, index = start_epoch, start_index
            while True:
                batcher = upcoming.result()
                upcoming = pool.submit(self.batcher, epoch + 1)
                for i in range(index, batcher.epoch_length(epoch)):
                    yield epoch, i, batcher.batch(epoch, i)
                epoch, index = epoch + 1, 0
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
