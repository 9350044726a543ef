"""Encode once, reuse always: the training split tokenised into memory-mapped ids.

A start used to read the whole corpus into Python lists and encode it again; with a
million pairs that took minutes and gigabytes on every resume. Now the first start
streams the corpus (data/streaming.py) into this cache, and later starts on the same
data map it in seconds. `data.cache_dir` sets the folder (default
`$XDG_CACHE_HOME/attnmt/data`, i.e. `~/.cache/attnmt/data`, shared by every run of the
user, as Hugging Face's cache is):

  corpora/<source key>.json   {"pairs", "data_sha256"}: the corpus fingerprint of a raw
                              input (its files' bytes and the selection settings), so a
                              warm start need not read the corpus to check a resume
  tokenizers/<key>/           a trained tokenizer (key: data_sha256 + tokenizer
                              settings): a second run on the same data copies it
  encoded/<key>/              key: data_sha256 + tokenizer_sha256 + max_length + long_pairs
      source.bin, target.bin  token ids, flat (uint16 below 65,536 ids, else int32), as
                              nanoGPT's train.bin
      source.offsets.npy, target.offsets.npy   int64 [N + 1]: pair i is ids[o[i]:o[i+1]]
      manifest.json           written last: the key's inputs, counts, dtype, and the
                              SHA-256 and size of every file

Keys hold the fingerprints, so other data or another tokenizer never meets a stale entry.
Every use re-hashes an entry's files against its manifest: a corrupted or half-copied
entry is reported on stderr, deleted and rebuilt, never used. Entries are built in a
temporary folder renamed into place when complete (a build cut off by a kill leaves only
that folder, deleted by the next build), under an exclusive lock on
`<cache_dir>/.lock` (processes of one multi-process launch build an entry once). The
pairs keep corpus order, so the batcher draws exactly the batches it drew from lists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import ml_collections
import numpy as np

from common.files import remove_stale_temp_files, require_file, temp_folder, write_atomic
from data.batching import TokenArray
from data.corpora import DataError
from data.streaming import Scan, TrainingSource, progress, sample_for_tokenizer, scan
from data.tokenizer import (
    META_FILE,
    Tokenizer,
    encode_for_training,
    load_or_train_tokenizer,
    tokenizer_fingerprint,
    tokenizer_meta,
)

FORMAT = "attnmt-encoded-v1"
ENCODE_CHUNK = 20_000  # pairs encoded at once: ~50 MB of Python id lists at most
SIDES = ("source", "target")

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one process per cache then)
    fcntl = None


class CacheError(Exception):
    """A cache entry that does not match its manifest (it is then rebuilt)."""


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/attnmt/data`, else `~/.cache/attnmt/data`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnmt" / "data"


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps([FORMAT, *parts]).encode()).hexdigest()


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex (cache manifests; train.py's teacher links)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


class DataCache:
    """The cache folder of one config (see the module docstring)."""

    def __init__(self, folder: str | Path = ""):
        self.folder = Path(folder) if folder else default_cache_dir()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a+b") as lock:
            if fcntl is not None:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            yield  # the lock goes with the file's closing (or the process's death)

    def _record_path(self, source: TrainingSource) -> Path:
        return self.folder / "corpora" / f"{source.key}.json"

    def scan(self, source: TrainingSource) -> Scan:
        """The pair count and corpus fingerprint of `source`: from its record when an
        earlier run wrote one, else by reading it (two streaming passes). Writes nothing."""
        try:
            record = json.loads(self._record_path(source).read_text())
            return Scan(pairs=int(record["pairs"]), data_sha256=str(record["data_sha256"]))
        except (OSError, ValueError, KeyError, TypeError):
            return scan(source)

    def tokenizer(self, tokenizer_dir: Path, cfg_data: ml_collections.ConfigDict,
                  source: TrainingSource, corpus: Scan) -> Tokenizer:
        """The run's tokenizer: loaded from `tokenizer_dir` when it holds one (a resume),
        else copied there from the cache, trained into the cache first if absent (from
        the seeded sample of `sample_for_tokenizer`, one streaming pass)."""
        tokenizer_dir = Path(tokenizer_dir)
        if not tokenizer_dir.exists():
            cached = self.folder / "tokenizers" / _key(
                corpus.data_sha256, tokenizer_meta(cfg_data), cfg_data.spm_max_sentences)
            with self._locked():
                remove_stale_temp_files(cached.parent)
                if (cached / META_FILE).is_file():
                    try:
                        load_or_train_tokenizer(cached, cfg_data, _no_text)
                    except DataError as e:
                        _warn(f"cached tokenizer {cached} is unusable ({e}); training again")
                        shutil.rmtree(cached)
                load_or_train_tokenizer(cached, cfg_data,
                                        lambda: self._tokenizer_text(cfg_data, source, corpus))
            with temp_folder(tokenizer_dir) as tmp:
                for path in cached.iterdir():
                    shutil.copy2(path, tmp / path.name)
                with contextlib.suppress(OSError):  # another process of the launch won
                    os.replace(tmp, tokenizer_dir)
        return load_or_train_tokenizer(tokenizer_dir, cfg_data, _no_text)

    @staticmethod
    def _tokenizer_text(cfg_data, source: TrainingSource, corpus: Scan) -> tuple[list, list]:
        texts = sample_for_tokenizer(source, corpus.pairs, bool(cfg_data.joint_vocab),
                                     cfg_data.spm_max_sentences)
        return (texts[0], []) if cfg_data.joint_vocab else (texts[0], texts[1])

    def encoded(self, source: TrainingSource, corpus: Scan, tokenizer: Tokenizer,
                tokenizer_dir: Path, max_length: int, long_pairs: str,
                ) -> tuple[TokenArray, TokenArray, int]:
        """The training pairs encoded (`tokenizer.encode_for_training` rules), memory-mapped.

        Builds the entry on first use (one streaming pass, chunk by chunk); re-hashes it
        against its manifest on every use, rebuilding a damaged one.
        Returns:
          (source ids, target ids, pairs dropped as too long); source sequences end
          with eos, target ones carry no specials.
        """
        if long_pairs not in ("drop", "truncate"):
            raise DataError(f"data.long_pairs must be 'drop' or 'truncate', got {long_pairs!r}")
        inputs = {"data_sha256": corpus.data_sha256,
                  "tokenizer_sha256": tokenizer_fingerprint(Path(tokenizer_dir)),
                  "max_length": int(max_length), "long_pairs": long_pairs}
        entry = self.folder / "encoded" / _key(inputs)
        with self._locked():
            try:
                return _open_entry(entry, inputs)
            except CacheError as e:
                if entry.exists():
                    _warn(f"data cache entry {entry} is damaged ({e}); encoding again")
                    shutil.rmtree(entry)
            remove_stale_temp_files(entry.parent)  # builds cut off by a kill
            with temp_folder(entry) as tmp:
                _build_entry(tmp, source, corpus, tokenizer, inputs)
                os.replace(tmp, entry)
            write_atomic(self._record_path(source), json.dumps(
                {"pairs": corpus.pairs, "data_sha256": corpus.data_sha256}) + "\n")
            return _open_entry(entry, inputs)


def _no_text() -> tuple[list, list]:
    raise DataError("internal: a tokenizer that should exist was about to be trained")


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _build_entry(folder: Path, source: TrainingSource, corpus: Scan, tokenizer: Tokenizer,
                 inputs: dict) -> None:
    """Encodes `source` chunk by chunk into `folder` (module docstring layout)."""
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
    lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
    digests = {side: hashlib.sha256() for side in SIDES}
    dropped = 0
    bar = progress("encode the training data", corpus.pairs)
    with open(folder / "source.bin", "wb") as src_file, open(folder / "target.bin", "wb") as tgt_file:
        files = {"source": src_file, "target": tgt_file}
        for sources, targets in source.chunks(ENCODE_CHUNK):
            src_ids, tgt_ids, n_dropped = encode_for_training(
                tokenizer, sources, targets, inputs["max_length"], inputs["long_pairs"])
            dropped += n_dropped
            for side, ids in zip(SIDES, (src_ids, tgt_ids), strict=True):
                sizes = np.fromiter(map(len, ids), np.int64, len(ids))
                flat = np.fromiter((i for seq in ids for i in seq), dtype, int(sizes.sum()))
                data = flat.tobytes()
                files[side].write(data)
                digests[side].update(data)
                lengths[side].append(sizes)
            bar.update(len(sources))
    bar.close()
    manifest = {"format": FORMAT, **inputs, "pairs_read": corpus.pairs, "dropped": dropped,
                "dtype": np.dtype(dtype).name, "files": {}}
    for side in SIDES:
        offsets = np.zeros(sum(map(len, lengths[side])) + 1, np.int64)
        np.cumsum(np.concatenate(lengths[side]), out=offsets[1:])
        np.save(folder / f"{side}.offsets.npy", offsets)
        manifest["pairs"] = len(offsets) - 1
        manifest["files"][f"{side}.bin"] = {"sha256": digests[side].hexdigest(),
                                            "bytes": int(offsets[-1]) * np.dtype(dtype).itemsize}
        path = folder / f"{side}.offsets.npy"
        manifest["files"][path.name] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _open_entry(entry: Path, inputs: dict) -> tuple[TokenArray, TokenArray, int]:
    """Memory-maps a complete entry after checking every file against its manifest.

    Raises:
      CacheError: no entry, or one whose manifest or files do not match.
    """
    try:
        manifest = json.loads((entry / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise CacheError(f"no readable manifest.json: {e}") from None
    if manifest.get("format") != FORMAT or any(manifest.get(k) != v for k, v in inputs.items()):
        raise CacheError("its manifest describes other data")
    for name, expected in manifest.get("files", {}).items():
        path = entry / name
        if not path.is_file() or path.stat().st_size != expected["bytes"]:
            raise CacheError(f"{name} is missing or has the wrong size")
        if file_sha256(path) != expected["sha256"]:
            raise CacheError(f"{name} does not match its SHA-256")
    if len(manifest.get("files", {})) != 2 * len(SIDES):
        raise CacheError("its manifest lists other files")
    arrays = []
    for side in SIDES:
        offsets = np.load(require_file(entry / f"{side}.offsets.npy", CacheError))
        ids = (np.memmap(entry / f"{side}.bin", dtype=manifest["dtype"], mode="r")
               if offsets[-1] > 0 else np.zeros(0, manifest["dtype"]))
        arrays.append(TokenArray(ids, offsets))
    return arrays[0], arrays[1], int(manifest["dropped"])
