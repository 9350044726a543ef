"""The training split read by streaming, in bounded memory, however large the corpus.

`training_source(cfg_data)` gives a `TrainingSource`:
  key            a cheap identity of the raw input and of the settings that select the
                 training pairs from it: SHA-256 of the input files' bytes (not of their
                 names or times), or a Hugging Face dataset's own fingerprint. data/cache.py
                 files what it derives from the corpus under this key.
  chunks(size)   yields (sources, targets) lists of at most `size` pairs, in order: the
                 very pairs `load_corpus(cfg_data, "train")` returns, a chunk at a time
                 (in `data.text_protocol`'s form, empty-sided pairs dropped, at most
                 `max_train_sentences` kept).

`scan(source)` reads it once to count the pairs and compute `corpus_fingerprint` (the
definition the resume guard has always stored, so old checkpoints still resume);
`sample_for_tokenizer` gathers the same seeded sample `tokenizer.train_model` would draw
from the whole list. Multi30k and `text` files stream line by line (plain or gzip),
Hugging Face datasets stream Arrow record batches (`Dataset.iter`); a Tatoeba file is
small and split in memory as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import ml_collections
import numpy as np
from tqdm import tqdm

from common.files import require_file
from data import corpora
from data.corpora import DataError, iter_lines
from data.protocol import RAW, apply_protocol, protocol_of
from data.tokenizer import sample_indices

Chunk = tuple[list[str], list[str]]
CHUNK_PAIRS = 50_000  # pairs per chunk: ~10 MB of text, ~1 s of encoding
# Settings that choose the training pairs out of the raw input (the rest of data.* acts
# after that, and is part of the keys of what data/cache.py derives).
SELECTION_KEYS = ("dataset", "source_lang", "target_lang", "max_train_sentences",
                  "hf_name", "hf_config", "hf_revision", "valid_size", "test_size")


@dataclasses.dataclass(frozen=True)
class TrainingSource:
    """The training split of one config, ready to stream (see the module docstring)."""

    key: str
    read: Callable[[int], Iterator[Chunk]]  # chunk size -> raw chunks (before filtering)
    limit: int  # data.max_train_sentences (0 = all)
    name: str  # for messages

    def chunks(self, size: int = CHUNK_PAIRS) -> Iterator[Chunk]:
        """(sources, targets) of at most `size` kept pairs each, in corpus order."""
        left = self.limit if self.limit > 0 else -1
        for sources, targets in self.read(size):
            sources, targets = corpora.drop_empty_pairs(sources, targets)
            if 0 <= left < len(sources):
                sources, targets = sources[:left], targets[:left]
            if sources:
                yield sources, targets
            left -= len(sources)
            if left == 0:
                return


@dataclasses.dataclass(frozen=True)
class Scan:
    """What one pass over a TrainingSource tells: `pairs` kept, their fingerprint."""

    pairs: int
    data_sha256: str


def _settings_digest(cfg_data: ml_collections.ConfigDict) -> hashlib._Hash:
    digest = hashlib.sha256(b"attnmt-training-source-v1\0")
    for key in SELECTION_KEYS:
        digest.update(f"{key}={cfg_data.get(key)!r}\0".encode())
    # Hashed only when it is not raw, so the keys of every raw source stay what they were.
    if (protocol := protocol_of(cfg_data)) != RAW:
        digest.update(f"text_protocol={protocol!r}\0".encode())
    return digest


def _file_digest(digest: hashlib._Hash, path: Path) -> None:
    path = require_file(path, DataError)
    with open(path, "rb") as file:
        digest.update(hashlib.file_digest(file, "sha256").digest())


def _parallel_files(source: Path, target: Path) -> Callable[[int], Iterator[Chunk]]:
    def read(size: int) -> Iterator[Chunk]:
        lines = itertools.zip_longest(iter_lines(source), iter_lines(target))
        count, nonblank = 0, [False, False]
        while chunk := list(itertools.islice(lines, size)):
            if chunk[-1][0] is None or chunk[-1][1] is None:
                sources = count + sum(s is not None for s, _ in chunk)
                targets = count + sum(t is not None for _, t in chunk)
                raise DataError(f"mismatched line counts: {source} has {sources} lines, "
                                f"{target} has {targets}")
            count += len(chunk)
            sources, targets = [s for s, _ in chunk], [t for _, t in chunk]
            nonblank = [nonblank[0] or any(sources), nonblank[1] or any(targets)]
            yield sources, targets
        for path, seen in zip((source, target), nonblank, strict=True):
            if not seen:
                raise DataError(f"empty corpus: {path}")
    return read


def _hf_read(cfg_data: ml_collections.ConfigDict) -> tuple[str, Callable[[int], Iterator[Chunk]]]:
    dataset, name = corpora.load_hf_split(cfg_data, "train")
    wanted = [c for c in ("translation", cfg_data.source_lang, cfg_data.target_lang)
              if c in dataset.column_names]

    def read(size: int) -> Iterator[Chunk]:
        for rows in dataset.select_columns(wanted).iter(batch_size=size):
            yield corpora.translation_pairs(rows, cfg_data.source_lang, cfg_data.target_lang,
                                            name)
    # datasets' own fingerprint of the loaded table: it changes with the files, the
    # revision and any processing, as its cache does.
    return dataset._fingerprint, read


def _in_protocol(cfg_data: ml_collections.ConfigDict,
                 read: Callable[[int], Iterator[Chunk]]) -> Callable[[int], Iterator[Chunk]]:
    """`read` with each raw chunk put into the config's text protocol (data/protocol.py)."""
    def protocol_read(size: int) -> Iterator[Chunk]:
        for sources, targets in read(size):
            yield apply_protocol(cfg_data, sources, targets)
    return protocol_read


def _with_distilled(cfg_data: ml_collections.ConfigDict,
                    read: Callable[[int], Iterator[Chunk]]) -> Callable[[int], Iterator[Chunk]]:
    """`read` with each chunk's targets from `data.distilled_targets` (corpora.with_distilled),
    the file streamed beside the corpus."""
    name, mix = cfg_data.distilled_targets, cfg_data.get("distilled_mix", "replace")

    def distilled_read(size: int) -> Iterator[Chunk]:
        distilled, pairs = corpora.distilled_lines(cfg_data), 0
        for sources, targets in read(size):
            pairs += len(sources)
            yield corpora.with_distilled(sources, targets, distilled, mix, name)
        corpora.check_distilled_end(distilled, name, pairs)
    return distilled_read


def training_source(cfg_data: ml_collections.ConfigDict) -> TrainingSource:
    """The training split of `cfg_data` as a TrainingSource; reads no corpus text (hashes
    the input files' bytes, or loads a Hugging Face dataset's Arrow table).

    Raises:
      DataError: unknown dataset, a missing file, or a dataset that cannot be loaded.
    """
    corpora.check_dataset_name(cfg_data.dataset)
    if cfg_data.source_lang == cfg_data.target_lang:
        raise DataError(f"data.source_lang and data.target_lang are both "
                        f"{cfg_data.source_lang!r}")
    digest = _settings_digest(cfg_data)
    files = corpora.training_files(cfg_data)
    if files is not None:
        for path in files:
            _file_digest(digest, path)
        read = _parallel_files(*files)
    elif cfg_data.dataset == "hf":
        fingerprint, read = _hf_read(cfg_data)
        digest.update(fingerprint.encode())
    else:  # tatoeba: one small file, split in memory by a fixed permutation
        corpus = corpora.load_corpus(cfg_data, "train")
        _file_digest(digest, Path(cfg_data.path))

        def read(size: int) -> Iterator[Chunk]:
            for start in range(0, len(corpus[0]), size):
                yield corpus[0][start:start + size], corpus[1][start:start + size]
    if cfg_data.dataset in ("text", "hf") and protocol_of(cfg_data) != RAW:
        read = _in_protocol(cfg_data, read)  # Multi30k's files and load_corpus's hold it already
    if cfg_data.get("distilled_targets") and cfg_data.dataset != "tatoeba":  # load_corpus did
        _file_digest(digest, Path(cfg_data.distilled_targets))
        digest.update(f"distilled_mix={cfg_data.get('distilled_mix', 'replace')!r}\0".encode())
        read = _with_distilled(cfg_data, read)
    return TrainingSource(key=digest.hexdigest(), read=read,
                          limit=cfg_data.get("max_train_sentences", 0),
                          name=f"{cfg_data.dataset} training split")


def progress(desc: str, total: int | None = None) -> tqdm:
    """A progress bar on stderr, in pairs, shown only if its stage lasts over 3 seconds."""
    return tqdm(total=total, desc=desc, unit=" pairs", unit_scale=True, delay=3,
                mininterval=2, dynamic_ncols=True)


def scan(source: TrainingSource) -> Scan:
    """Counts the pairs and computes `corpora.corpus_fingerprint` of them, streaming (two
    passes: that hash takes every source line before any target line).

    Raises:
      DataError: no pair with both sides non-empty, and the readers' errors.
    """
    digest = hashlib.sha256()
    pairs = 0
    for side in (0, 1):
        with progress(f"fingerprint the training data ({('sources', 'targets')[side]})",
                      pairs or None) as bar:
            for chunk in source.chunks():
                digest.update("".join(line + "\n" for line in chunk[side]).encode("utf-8"))
                pairs += len(chunk[side]) if side == 0 else 0
                bar.update(len(chunk[side]))
        digest.update(b"\0")
    if pairs == 0:
        raise DataError(f"empty corpus: no {source.name} pair has both sides non-empty")
    return Scan(pairs=pairs, data_sha256=digest.hexdigest())


def sample_for_tokenizer(source: TrainingSource, pairs: int, joint: bool, max_sentences: int,
                         seed: int = 0) -> list[list[str]]:
    """The tokenizer's training text, read in one pass: for a joint vocabulary one list
    (sources then targets, pooled), else two (sources, targets). Each is the seeded sample
    of at most `max_sentences` lines that `tokenizer.train_model` draws from the full list,
    so a tokenizer trained from it is byte-identical to one trained from everything.
    """
    sides = [2 * pairs] if joint else [pairs, pairs]
    wanted = [sample_indices(n, max_sentences, seed) for n in sides]
    # Position of each kept sentence in the pooled (or per-side) list, and where it goes.
    out: list[list[str]] = [[""] * (n if keep is None else len(keep))
                            for n, keep in zip(sides, wanted, strict=True)]
    start = 0
    bar = progress("read the tokenizer's sample", pairs)
    for chunk in source.chunks():
        bar.update(len(chunk[0]))
        for side, lines in enumerate(chunk):
            pool = 0 if joint else side
            offset = start + (side * pairs if joint else 0)
            keep = wanted[pool]
            if keep is None:
                out[pool][offset:offset + len(lines)] = lines
                continue
            lo, hi = np.searchsorted(keep, [offset, offset + len(lines)])
            for slot in range(lo, hi):
                out[pool][slot] = lines[keep[slot] - offset]
        start += len(chunk[0])
    bar.close()
    return out
