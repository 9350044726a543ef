"""SentencePiece tokenizer: training, loading, and the id conventions.

Id conventions (the model, batching and search code rely on these):
  pad = 0, unk = 1, bos = 2 ("<s>"), eos = 3 ("</s>"), the same in every model.
  Source:  `encode_source(x)` = pieces(x) + [eos]           (no bos)
  Target:  `encode_target(y)` = pieces(y)                    (no specials)
           decoder input   `tgt_in`  = [bos] + pieces(y)
           training target `tgt_out` = pieces(y) + [eos]
           (data/batching.py adds bos/eos when it builds a batch.)
  Decoding starts from [bos] and stops at the first eos; `decode_target`
  drops everything from the first eos on, and any bos/pad.

By default one joint model (`spm.model`) is trained on source + target training
text, so embeddings can be shared. With `data.joint_vocab=False` there are two
models, `spm_src.model` and `spm_tgt.model`, each trained on its own side.

Training is deterministic: the (at most `data.spm_max_sentences`) training
sentences are sampled here with a seeded numpy generator, SentencePiece's own
sampling is off (`input_sentence_size=0`), its random seed and thread count
are fixed, and no path is stored in the model: the same text and settings give
a byte-identical `.model` file on any machine.
"""

import dataclasses
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_collections
import numpy as np
import sentencepiece as spm

from common.files import temp_folder
from configs.base import NORMALIZATIONS
from data.corpora import DataError, read_lines
from data.subword_draws import Sampling, draw_segmentations

# The special token ids, the same in every vocabulary; the one place they are defined.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# SentencePiece's result depends on its thread count, so it is fixed rather than
# os.cpu_count(): the same text gives the same tokenizer on every machine. Extra
# threads on a small machine cost little (~3 s for Multi30k either way).
SPM_NUM_THREADS = 16
JOINT_MODEL, SOURCE_MODEL, TARGET_MODEL = "spm", "spm_src", "spm_tgt"
META_FILE = "tokenizer.json"


# SentencePiece's training failures (a RuntimeError whose text ends with its reason),
# in words naming the config key at fault; the reason follows.
_SPM_FAILURES = {
    "Vocabulary size too high": "data.vocab_size={vocab_size} is too large for the tokenizer "
                                "training text",
    "smaller than required_chars": "data.vocab_size={vocab_size} is too small for the "
                                   "characters of the tokenizer training text",
    "character_coverage": "data.character_coverage={character_coverage} is out of range",
}


def _training_error(error: RuntimeError, **settings) -> DataError:
    """A SentencePiece training RuntimeError as one line: the config keys and the reason.

    Its text is "INTERNAL: file.cc(N) [failed check] reason"; the reason is its last line
    after the check (the check itself when SentencePiece gives no words).
    """
    text = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    parts = re.fullmatch(r"(?:\w+: )?\S+\(\d+\) \[(.*)\]\s*(.*)", text)
    reason = (parts.group(2) or f"failed check {parts.group(1)}") if parts else text
    what = next((m for key, m in _SPM_FAILURES.items() if key in text),
                "cannot train the tokenizer with data.vocab_size={vocab_size}, "
                "data.spm_model_type={model_type!r}, data.character_coverage={character_coverage}")
    return DataError(f"{what.format(**settings)}: {reason}")


def sample_indices(count: int, max_sentences: int, seed: int) -> np.ndarray | None:
    """Which of `count` sentences the tokenizer trains on: None for all of them (when
    count <= max_sentences), else int64 [max_sentences], sorted, drawn with `seed`."""
    if count <= max_sentences:
        return None
    return np.sort(np.random.default_rng(seed).choice(count, max_sentences, replace=False))


def train_model(texts_or_files: Sequence[str | Path], vocab_size: int,
                model_type: str = "unigram", character_coverage: float = 1.0,
                max_sentences: int = 300_000, seed: int = 0,
                normalization: str = "nmt_nfkc") -> bytes:
    """Trains one SentencePiece model with pad/unk/bos/eos = 0/1/2/3; returns its bytes
    (the content of a `.model` file). Writes nothing.

    Args:
      texts_or_files: sentences (str) and/or text files (Path, plain or gzip,
        one sentence a line), all pooled; empty lines are ignored.
      vocab_size: exact vocabulary size, special ids included.
      model_type: "unigram" or "bpe".
      character_coverage: fraction of characters covered by the vocabulary.
      max_sentences: train on a seeded random sample of at most this many.
      seed: seed of the sample and of SentencePiece's random generator.
      normalization: SentencePiece's normalisation rule, stored in the model and so
        applied to every text it encodes: "nmt_nfkc" (NFKC, its default) or
        "nmt_nfkc_cf" (also case-folded: "Die" and "die" are one word).
    Raises:
      DataError: no text, unknown model type, or settings SentencePiece refuses for this
        text (a vocabulary too large or too small, ...), naming the config key and
        SentencePiece's reason.
    """
    if model_type not in ("unigram", "bpe"):
        raise DataError(f"data.spm_model_type must be 'unigram' or 'bpe', got {model_type!r}")
    if normalization not in NORMALIZATIONS:
        raise DataError(f"data.spm_normalization must be one of {', '.join(NORMALIZATIONS)}, "
                        f"got {normalization!r}")
    sentences: list[str] = []
    for item in texts_or_files:
        if isinstance(item, Path):
            sentences.extend(line for line in read_lines(item) if line)
        elif item:
            sentences.append(item)
    if not sentences:
        raise DataError("no text to train the tokenizer on")
    keep = sample_indices(len(sentences), max_sentences, seed)
    if keep is not None:
        sentences = [sentences[i] for i in keep]
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()  # Not model_prefix=: that would store the (temporary) path in the model.
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model,
            vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, normalization_rule_name=normalization,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            input_sentence_size=0, shuffle_input_sentence=False,
            num_threads=SPM_NUM_THREADS, minloglevel=2)
    except RuntimeError as e:  # every one is a setting this text cannot support
        raise _training_error(e, vocab_size=vocab_size, model_type=model_type,
                              character_coverage=character_coverage) from None
    return model.getvalue()


def write_model(model: bytes, model_prefix: Path) -> Path:
    """Writes `<model_prefix>.model` (the bytes of `train_model`) and `<model_prefix>.vocab`
    (for people: one "piece<TAB>score" line per id); returns the `.model` path."""
    model_path = Path(f"{model_prefix}.model")
    model_path.write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    Path(f"{model_prefix}.vocab").write_text(
        "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.vocab_size())),
        encoding="utf-8")
    return model_path


def train_tokenizer(texts_or_files: Sequence[str | Path], model_prefix: Path, vocab_size: int,
                    model_type: str = "unigram", character_coverage: float = 1.0,
                    max_sentences: int = 300_000, seed: int = 0) -> Path:
    """`train_model` and `write_model`: writes `<model_prefix>.model` and `.vocab`, returns
    the `.model` path. The arguments and errors are those of `train_model`."""
    return write_model(train_model(texts_or_files, vocab_size, model_type, character_coverage,
                                   max_sentences, seed), model_prefix)


class Tokenizer:
    """Source and target SentencePiece models (the same object when joint).

    Attributes:
      pad_id, unk_id, bos_id, eos_id: 0, 1, 2, 3.
      source_vocab_size, target_vocab_size: sizes of the two vocabularies.
      vocab_size: the larger of the two (equal when joint): an embedding table
        of this size holds every id of either side.
      joint: whether source and target share one model.
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, source_model: Path, target_model: Path | None = None):
        """Loads `.model` files; `target_model=None` means one joint model."""
        self._source = spm.SentencePieceProcessor(model_file=str(source_model))
        self.joint = target_model is None
        self._target = (self._source if self.joint
                        else spm.SentencePieceProcessor(model_file=str(target_model)))
        for sp in (self._source, self._target):
            ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
            if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
                raise DataError(f"{source_model}: special ids {ids}, expected (0, 1, 2, 3)")
        self.source_vocab_size = self._source.vocab_size()
        self.target_vocab_size = self._target.vocab_size()
        self.vocab_size = max(self.source_vocab_size, self.target_vocab_size)

    @classmethod
    def load(cls, directory: Path) -> "Tokenizer":
        """Loads the model(s) written by `load_or_train_tokenizer` into `directory`."""
        directory = Path(directory)
        if (directory / f"{JOINT_MODEL}.model").is_file():
            return cls(directory / f"{JOINT_MODEL}.model")
        return cls(directory / f"{SOURCE_MODEL}.model", directory / f"{TARGET_MODEL}.model")

    def encode_source(self, texts: Sequence[str], sampling: Sampling | None = None,
                      ) -> list[list[int]]:
        """list[str] -> list of id lists, each `pieces + [eos]` (no bos); the best
        segmentation, or a sampled one (training only)."""
        return _encode(self._source, texts, sampling, add_eos=True)

    def encode_target(self, texts: Sequence[str], sampling: Sampling | None = None,
                      ) -> list[list[int]]:
        """list[str] -> list of id lists of the pieces only (no bos, no eos)."""
        return _encode(self._target, texts, sampling, add_eos=False)

    def decode_target(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Target id lists -> detokenized strings.

        Each list is cut at its first eos; bos and pad ids are dropped. Accepts
        numpy rows too.
        """
        cleaned = []
        for row in ids:
            row = [int(i) for i in row]
            if EOS_ID in row:
                row = row[:row.index(EOS_ID)]
            cleaned.append([i for i in row if i not in (PAD_ID, BOS_ID)])
        return self._target.decode(cleaned)

    @staticmethod
    def _pieces(sp: spm.SentencePieceProcessor, ids: Sequence[int]) -> list[str]:
        # Padding becomes "" so padded rows label straight into attention maps.
        return ["" if int(i) == PAD_ID else sp.id_to_piece(int(i)) for i in ids]

    def source_pieces(self, ids: Sequence[int]) -> list[str]:
        """One source id sequence -> its SentencePiece pieces ("</s>" for eos, "" for pad)."""
        return self._pieces(self._source, ids)

    def target_pieces(self, ids: Sequence[int]) -> list[str]:
        """One target id sequence -> its pieces ("<s>" for bos, "</s>" for eos, "" for pad)."""
        return self._pieces(self._target, ids)


def _encode(sp: spm.SentencePieceProcessor, texts: Sequence[str], sampling: Sampling | None,
            add_eos: bool) -> list[list[int]]:
    if sampling is None:
        return sp.encode(list(texts), out_type=int, add_eos=add_eos)
    return draw_segmentations(sp, texts, sampling, add_eos)


def tokenizer_meta(cfg_data: ml_collections.ConfigDict) -> dict:
    """The settings a tokenizer is trained with, as saved in its tokenizer.json; a run
    config from before a setting existed reads as that setting's default."""
    return {"joint_vocab": bool(cfg_data.joint_vocab), "vocab_size": int(cfg_data.vocab_size),
            "model_type": str(cfg_data.spm_model_type),
            "character_coverage": float(cfg_data.character_coverage),
            "normalization": str(cfg_data.get("spm_normalization", NORMALIZATIONS[0])),
            "source_lang": str(cfg_data.source_lang), "target_lang": str(cfg_data.target_lang)}


def with_meta_defaults(saved: dict) -> dict:
    """A tokenizer.json's settings, with those it predates at their default values."""
    return {"normalization": NORMALIZATIONS[0], **saved}


def load_or_train_tokenizer(
        tokenizer_dir: Path, cfg_data: ml_collections.ConfigDict,
        training_text: Callable[[], tuple[Sequence[str], Sequence[str]]]) -> Tokenizer:
    """Loads the tokenizer from `tokenizer_dir`, training it there first if absent.

    The models are trained in memory (bad settings fail before anything is
    written), then written into a temporary sibling folder (`common.files.temp_folder`)
    that is renamed to `tokenizer_dir` only when complete, so a crash never leaves a
    half-written tokenizer behind to be reused. The folder also holds `tokenizer.json`, the
    settings it was trained with; reusing it under other settings is an error.

    Args:
      tokenizer_dir: usually `<workdir>/tokenizer`.
      cfg_data: the `data` config group (vocab_size, joint_vocab,
        spm_model_type, character_coverage, spm_max_sentences, langs).
      training_text: called only when a tokenizer must be trained; returns (sources,
        targets), raw strings (pooled for a joint vocabulary; data/streaming.py's
        `sample_for_tokenizer` reads just the sample from a large corpus).
    Returns:
      The loaded Tokenizer.
    Raises:
      DataError: the folder holds a tokenizer trained with other settings, or
        is not a tokenizer folder.
    """
    tokenizer_dir = Path(tokenizer_dir)
    meta = tokenizer_meta(cfg_data)
    meta_path = tokenizer_dir / META_FILE
    if not meta_path.is_file():
        if tokenizer_dir.is_dir() and any(tokenizer_dir.iterdir()):
            raise DataError(f"{tokenizer_dir} exists but holds no {META_FILE}; "
                            "move it away to train a new tokenizer")
        # Trained in memory first: settings SentencePiece refuses fail before anything
        # (not even the workdir) is written.
        kwargs = dict(vocab_size=cfg_data.vocab_size, model_type=cfg_data.spm_model_type,
                      character_coverage=cfg_data.character_coverage,
                      max_sentences=cfg_data.spm_max_sentences,
                      normalization=cfg_data.spm_normalization)
        train_sources, train_targets = training_text()
        if len(train_sources) + len(train_targets) > 100_000:  # SentencePiece shows no progress
            print(f"attnmt: training the tokenizer on {len(train_sources) + len(train_targets):,} "
                  "sentences (a minute or so)", file=sys.stderr, flush=True)
        if cfg_data.joint_vocab:
            models = {JOINT_MODEL: train_model([*train_sources, *train_targets], **kwargs)}
        else:
            models = {SOURCE_MODEL: train_model(list(train_sources), **kwargs),
                      TARGET_MODEL: train_model(list(train_targets), **kwargs)}
        # Written into `.tokenizer.<random>.tmp/` beside it and renamed when complete; a
        # kill leaves only that folder, which common.files.remove_stale_temp_files removes.
        with temp_folder(tokenizer_dir) as tmp:
            for name, model in models.items():
                write_model(model, tmp / name)
            # The metadata file marks a complete tokenizer: written last.
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            try:
                os.replace(tmp, tokenizer_dir)  # Atomic; fails if another process won.
            except OSError:
                if not meta_path.is_file():
                    raise
    saved = with_meta_defaults(json.loads(meta_path.read_text()))
    changed = [f"{key}: {saved.get(key)!r} -> {value!r}" for key, value in meta.items()
               if saved.get(key) != value]
    if changed:
        raise DataError(f"tokenizer in {tokenizer_dir} was trained with other settings "
                        f"({'; '.join(changed)}); use a new workdir")
    return Tokenizer.load(tokenizer_dir)


def encode_for_training(tokenizer: Tokenizer, sources: Sequence[str], targets: Sequence[str],
                        max_length: int, long_pairs: str = "drop",
                        sampling: Sampling | None = None,
                        ) -> tuple[list[list[int]], list[list[int]], int]:
    """Tokenizes training pairs and enforces `max_length` (training only).

    Lengths count the added eos: a pair fits when len(source ids + eos) and
    len(target ids + eos) are both <= max_length. Pairs that do not fit are
    dropped (`long_pairs="drop"`, the default, as in fairseq and JoeyNMT: a
    truncated target no longer translates its source), or cut to fit
    (`"truncate"`, keeping the first tokens and the final eos).
    Evaluation never truncates: encode eval text with `encode_source` directly.

    Args:
      tokenizer: the Tokenizer.
      sources, targets: parallel raw training strings.
      max_length: the longest sequence, eos included (>= 2).
      long_pairs: "drop" or "truncate".
      sampling: a sampled segmentation (data/sampling.py) instead of the best one; the
        target side draws with seed + 1.
    Returns:
      (source_ids, target_ids, num_dropped): source lists end with eos, target
      lists carry no specials (see the module docstring).
    """
    if long_pairs not in ("drop", "truncate"):
        raise DataError(f"data.long_pairs must be 'drop' or 'truncate', got {long_pairs!r}")
    if max_length < 2:
        raise DataError(f"data.max_length must be at least 2, got {max_length}")
    source_ids = tokenizer.encode_source(sources, sampling)
    target_ids = tokenizer.encode_target(targets, sampling and dataclasses.replace(
        sampling, seed=sampling.seed + 1))
    if long_pairs == "truncate":
        source_ids = [s if len(s) <= max_length else s[:max_length - 1] + [EOS_ID]
                      for s in source_ids]
        target_ids = [t[:max_length - 1] for t in target_ids]
        return source_ids, target_ids, 0
    keep = [i for i, (s, t) in enumerate(zip(source_ids, target_ids, strict=True))
            if len(s) <= max_length and len(t) + 1 <= max_length]
    dropped = len(source_ids) - len(keep)
    return [source_ids[i] for i in keep], [target_ids[i] for i in keep], dropped


def tokenizer_fingerprint(directory: Path) -> str:
    """SHA-256 of the SentencePiece model file(s) in `directory` (stored in checkpoints)."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.model")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
