"""Corpus registry and loaders: config -> parallel sentences for one split.

A corpus split is two parallel lists of raw (untokenized) strings,
`(sources, targets)`, with `len(sources) == len(targets)`; pair `i` is
`(sources[i], targets[i])`. Lines are split on "\\n" only (never on other
Unicode line breaks, which would shift line counts), and surrounding whitespace
is stripped.

Datasets (`data.dataset`):
  multi30k  the vendored Multi30k task-1 files in data/multi30k/, any direction
            among de/en/fr (`data.data_dir` overrides the folder).
  tatoeba   a manythings.org file (`data.path`: deu-eng.zip or deu.txt) with
            lines "english<TAB>other<TAB>attribution"; valid/test are drawn
            with a fixed seed (see `_load_tatoeba`).
  text      plain parallel files, `data.{train,valid,test}_{source,target}`
            (plain or gzip).
  hf        any Hugging Face dataset with a `translation` column (or one column
            per language), through `datasets.load_dataset`.

Under `data.text_protocol = "lc_norm_tok"` (data/protocol.py) Multi30k reads its official
`tok/*.lc.norm.tok.*` files and every other dataset's text passes through sacremoses.

Training split only: with `data.distilled_targets` (a teacher's translation of every
training source, one per line) the targets are the teacher's, or both (`data.distilled_mix`:
sequence-level knowledge distillation, `with_distilled`); then pairs with an empty side
are dropped, then at most
`data.max_train_sentences` pairs are kept (the first ones, 0 = all). Eval splits
keep every line, empty ones included, so hypotheses stay aligned with the
reference file.

Bad input raises `DataError` with a one-line message naming the file.
"""

import gzip
import hashlib
import itertools
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import ml_collections
import numpy as np

from common.errors import UserError
from common.files import require_file
from configs.base import DATASETS, MULTI30K_LANGS
from data.protocol import LC_NORM_TOK, apply_protocol, protocol_of

SPLITS = ("train", "valid", "test")
MULTI30K_DIR = Path(__file__).parent / "multi30k"
# File prefix of each split in the Multi30k distribution.
MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# Split names used by Hugging Face datasets.
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
# Fixed, independent of train.seed, so changing the training seed never moves
# sentences between the Tatoeba train and test sets.
TATOEBA_SPLIT_SEED = 20240601

Corpus = tuple[list[str], list[str]]


class DataError(UserError, ValueError):
    """Bad corpus input: missing/empty/mismatched/non-UTF-8 file, unknown dataset."""


def decode_lines(data: bytes, name: str) -> list[str]:
    """Decodes a text file's bytes into stripped lines.

    Args:
      data: the raw file content.
      name: how to call the file in error messages.
    Returns:
      One string per line ("\\n"-separated; a final newline does not add a line).
    Raises:
      DataError: invalid UTF-8, naming `name` and the 1-based line number.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{name}: invalid UTF-8 on line {line}") from None
    text = text.removeprefix("\ufeff")
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def iter_lines(path: str | Path) -> Iterator[str]:
    """Streams a plain or gzip-compressed UTF-8 text file line by line, in bounded memory.

    Args:
      path: file path; gzip is detected from the content, not the name.
    Yields:
      The stripped lines, exactly those of `decode_lines` on the whole file.
    Raises:
      DataError: missing file, unreadable gzip, invalid UTF-8 (naming the line).
    """
    path = require_file(path, DataError)
    with open(path, "rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
    with (gzip.open if compressed else open)(path, "rb") as file:
        try:
            for number, line in enumerate(file, start=1):  # binary: split on b"\n" only
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError:
                    raise DataError(f"{path}: invalid UTF-8 on line {number}") from None
                if number == 1:
                    text = text.removeprefix("\ufeff")
                    if not text:  # a file holding only a byte-order mark has no line
                        return
                yield text.strip()
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(f"{path}: cannot decompress gzip file ({e})") from None


def read_lines(path: str | Path) -> list[str]:
    """`iter_lines` as a list: the stripped lines of a plain or gzip text file."""
    return list(iter_lines(path))


def _is_blank(lines: list[str]) -> bool:
    return not any(lines)


def check_parallel(sources: list[str], targets: list[str], source_name: str,
                   target_name: str) -> None:
    """Checks that two sides of a corpus are non-empty and have equal line counts.

    Raises:
      DataError: naming both files and both counts, or the empty file.
    """
    for lines, name in ((sources, source_name), (targets, target_name)):
        if _is_blank(lines):
            raise DataError(f"empty corpus: {name}")
    if len(sources) != len(targets):
        raise DataError(
            f"mismatched line counts: {source_name} has {len(sources)} lines, "
            f"{target_name} has {len(targets)}")


def read_parallel(source_path: str | Path, target_path: str | Path) -> Corpus:
    """Reads two parallel text files (plain or gzip) and checks them.

    Returns:
      (sources, targets), equal-length lists of strings.
    """
    sources, targets = read_lines(source_path), read_lines(target_path)
    check_parallel(sources, targets, str(source_path), str(target_path))
    return sources, targets


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")


def _multi30k_files(cfg: ml_collections.ConfigDict, split: str) -> tuple[Path, Path]:
    folder = Path(cfg.data_dir) if cfg.data_dir else MULTI30K_DIR
    for lang in (cfg.source_lang, cfg.target_lang):
        if lang not in MULTI30K_LANGS:
            raise DataError(f"multi30k has no language {lang!r} "
                            f"(available: {', '.join(MULTI30K_LANGS)})")

    # The literature's protocol reads the official lc.norm.tok files, not sacremoses' output.
    official = protocol_of(cfg) == LC_NORM_TOK

    def path(lang: str) -> Path:
        # Accept unpacked copies too: a user's data_dir may hold plain files.
        gz = (folder / "tok" / f"{MULTI30K_FILES[split]}.lc.norm.tok.{lang}.gz" if official
              else folder / f"{MULTI30K_FILES[split]}.{lang}.gz")
        plain = gz.with_suffix("")
        return plain if plain.is_file() and not gz.is_file() else gz

    return path(cfg.source_lang), path(cfg.target_lang)


def _text_files(cfg: ml_collections.ConfigDict, split: str) -> tuple[Path, Path]:
    keys = (f"{split}_source", f"{split}_target")
    for key in keys:
        if not cfg[key]:
            raise DataError(f"data.{key} is not set (dataset 'text' reads "
                            f"data.{keys[0]} and data.{keys[1]})")
    return Path(cfg[keys[0]]), Path(cfg[keys[1]])


def training_files(cfg: ml_collections.ConfigDict) -> tuple[Path, Path] | None:
    """(source file, target file) of the training split for the file-based datasets
    (multi30k, text); None for the others."""
    files = {"multi30k": _multi30k_files, "text": _text_files}.get(cfg.dataset)
    return files(cfg, "train") if files else None


def read_tatoeba(path: str | Path) -> tuple[list[str], list[str]]:
    """Reads a manythings.org Tatoeba file: `deu-eng.zip` or the `deu.txt` inside.

    Args:
      path: a .zip holding one `<lang>.txt` (the `_about.txt` is ignored) or
        the .txt itself. Lines are "english<TAB>other<TAB>attribution".
    Returns:
      (english, other), parallel lists in file order.
    Raises:
      DataError: missing file, bad zip, a line with fewer than two fields,
        invalid UTF-8, or no pairs.
    """
    path = require_file(path, DataError)
    name = str(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.namelist()
                       if m.endswith(".txt") and not Path(m).name.startswith("_")]
            if len(members) != 1:
                raise DataError(f"{path}: expected one <lang>.txt file in the zip, "
                                f"found {members or 'none'}")
            name = f"{path}:{members[0]}"
            data = archive.read(members[0])
    else:
        data = path.read_bytes()
    english, other = [], []
    for number, line in enumerate(decode_lines(data, name), start=1):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise DataError(f"{name}: line {number} is not 'english<TAB>translation"
                            "<TAB>attribution'")
        english.append(fields[0].strip())
        other.append(fields[1].strip())
    if not english:
        raise DataError(f"empty corpus: {name}")
    return english, other


def _load_tatoeba(cfg: ml_collections.ConfigDict, split: str) -> Corpus:
    # Split: one permutation of all pairs from TATOEBA_SPLIT_SEED; its first
    # test_size pairs are the test set, the next valid_size the validation set,
    # the rest training. Each split keeps file order. Note that Tatoeba repeats
    # many sentences with alternative translations, so a test source can also
    # occur in training with another translation.
    if not cfg.path:
        raise DataError("data.path is not set (the Tatoeba deu-eng.zip or deu.txt)")
    if "en" not in (cfg.source_lang, cfg.target_lang) or cfg.source_lang == cfg.target_lang:
        raise DataError("tatoeba pairs English with one other language: one of "
                        f"data.source_lang/target_lang must be 'en', got "
                        f"{cfg.source_lang!r}/{cfg.target_lang!r}")
    english, other = read_tatoeba(cfg.path)
    n, n_test, n_valid = len(english), cfg.test_size, cfg.valid_size
    if n_test < 0 or n_valid < 0 or n_test + n_valid >= n:
        raise DataError(f"{cfg.path}: {n} pairs cannot hold data.test_size={n_test} "
                        f"+ data.valid_size={n_valid} and a training set")
    order = np.random.default_rng(TATOEBA_SPLIT_SEED).permutation(n)
    parts = {"test": order[:n_test], "valid": order[n_test:n_test + n_valid],
             "train": order[n_test + n_valid:]}
    indices = np.sort(parts[split])
    sources, targets = (english, other) if cfg.source_lang == "en" else (other, english)
    return [sources[i] for i in indices], [targets[i] for i in indices]


def parse_hf_data_files(spec: str) -> str | dict[str, str] | None:
    """Parses `data.hf_data_files`: "" -> None, "a.jsonl" -> "a.jsonl",
    "train=a.jsonl,validation=b.jsonl" -> {"train": "a.jsonl", "validation": "b.jsonl"}."""
    if not spec:
        return None
    if "=" not in spec:
        return spec
    files = {}
    for item in spec.split(","):
        split, sep, path = item.partition("=")
        if not sep or not split.strip() or not path.strip():
            raise DataError(f"data.hf_data_files: expected 'split=path,...', got {spec!r}")
        files[split.strip()] = path.strip()
    return files


def translation_pairs(rows: dict[str, list], source_lang: str, target_lang: str,
                      name: str) -> Corpus:
    """Extracts (sources, targets) from Hugging Face dataset columns.

    Args:
      rows: column name -> values, e.g. `dataset.to_dict()`. Either a
        `translation` column of {lang: text} dicts (the standard format of
        WMT/IWSLT on the hub) or one column per language.
      source_lang, target_lang: language codes, keys of the dicts / columns.
      name: dataset name for error messages.
    Returns:
      (sources, targets) with None mapped to "".
    Raises:
      DataError: a language is missing.
    """
    if "translation" in rows:
        column = rows["translation"]
        try:
            sources = [t[source_lang] for t in column]
            targets = [t[target_lang] for t in column]
        except KeyError:
            languages = sorted(next(t for t in column if not {source_lang, target_lang} <= set(t)))
            raise DataError(f"{name}: translation has languages {languages}, "
                            f"not {source_lang!r} and {target_lang!r}") from None
    elif source_lang in rows and target_lang in rows:
        sources, targets = rows[source_lang], rows[target_lang]
    else:
        raise DataError(f"{name}: no 'translation' column and no "
                        f"{source_lang!r}/{target_lang!r} columns (has {sorted(rows)})")
    return ([(s or "").strip() for s in sources], [(t or "").strip() for t in targets])


def load_hf_split(cfg: ml_collections.ConfigDict, split: str):
    """`datasets.load_dataset` of one split: (the Arrow-backed Dataset, its name for
    messages). Raises DataError for anything the hub or the files refuse."""
    if not cfg.hf_name:
        raise DataError("data.hf_name is not set (e.g. 'IWSLT/iwslt2017' or 'json')")
    import datasets  # Heavy import; only this loader needs it.

    name = cfg.hf_name + (f"/{cfg.hf_config}" if cfg.hf_config else "")
    try:
        dataset = datasets.load_dataset(
            cfg.hf_name, cfg.hf_config or None, split=HF_SPLITS[split],
            data_files=parse_hf_data_files(cfg.hf_data_files),
            revision=cfg.hf_revision or None, cache_dir=cfg.hf_cache_dir or None)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - network, missing split, bad files: all user input.
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load Hugging Face dataset {name} split "
                        f"{HF_SPLITS[split]!r}: {message}") from e
    return dataset, name


def _load_hf(cfg: ml_collections.ConfigDict, split: str) -> Corpus:
    dataset, name = load_hf_split(cfg, split)
    # Materialize only the needed columns (Arrow -> Python in one call).
    wanted = [c for c in ("translation", cfg.source_lang, cfg.target_lang)
              if c in dataset.column_names]
    sources, targets = translation_pairs(dataset.select_columns(wanted).to_dict(),
                                         cfg.source_lang, cfg.target_lang, name)
    check_parallel(sources, targets, f"{name}[{HF_SPLITS[split]}].{cfg.source_lang}",
                   f"{name}[{HF_SPLITS[split]}].{cfg.target_lang}")
    return sources, targets


LOADERS: dict[str, Callable[[ml_collections.ConfigDict, str], Corpus]] = {
    "multi30k": lambda cfg, split: read_parallel(*_multi30k_files(cfg, split)),
    "tatoeba": _load_tatoeba,
    "text": lambda cfg, split: read_parallel(*_text_files(cfg, split)),
    "hf": _load_hf,
}


assert tuple(LOADERS) == DATASETS, "configs/base.py DATASETS and LOADERS must agree"


def check_dataset_name(name: str) -> None:
    """Raises DataError for a `data.dataset` value that is not registered."""
    if name not in LOADERS:
        raise DataError(f"unknown dataset {name!r} (known: {', '.join(LOADERS)})")


def drop_empty_pairs(sources: list[str], targets: list[str]) -> Corpus:
    """Removes pairs whose source or target is empty (training only)."""
    keep = [i for i, (s, t) in enumerate(zip(sources, targets, strict=True)) if s and t]
    return [sources[i] for i in keep], [targets[i] for i in keep]


def distilled_lines(cfg_data: ml_collections.ConfigDict) -> Iterator[str] | None:
    """The lines of `data.distilled_targets` (streamed), or None when it is not set."""
    path = cfg_data.get("distilled_targets", "")
    return iter_lines(path) if path else None


def with_distilled(sources: list[str], targets: list[str], distilled: Iterator[str],
                   mix: str, name: str) -> Corpus:
    """Sequence-level knowledge distillation (Kim & Rush 2016): the training pairs with a
    teacher's translations of their sources as targets.

    Args:
      sources, targets: consecutive training pairs as read (before empty-sided pairs
        are dropped), in `data.text_protocol`'s form.
      distilled: the teacher's lines from here on, one per pair (`evaluate.py --source`
        on the training source file writes them, in the same protocol); the next
        len(sources) lines are taken.
      mix: "replace": (source, distilled) in place of each pair; "add": each pair
        followed by (source, distilled), so the corpus doubles.
      name: the distilled file, for the message.
    Returns:
      (sources, targets) of the mixed pairs.
    Raises:
      DataError: the file has fewer lines than the training pairs.
    """
    teacher = list(itertools.islice(distilled, len(sources)))
    if len(teacher) < len(sources):
        raise DataError(f"{name} has fewer lines than the training split: one teacher "
                        "translation per training pair is needed")
    if mix == "replace":
        return list(sources), teacher
    return ([s for s in sources for _ in range(2)],
            [t for pair in zip(targets, teacher, strict=True) for t in pair])


def check_distilled_end(distilled: Iterator[str], name: str, pairs: int) -> None:
    """DataError if `distilled` has lines left once every one of `pairs` took its own."""
    if next(distilled, None) is not None:
        raise DataError(f"{name} has more lines than the {pairs} pairs of the training "
                        "split: it was written for other data")


def reads_protocol_text(cfg_data: ml_collections.ConfigDict) -> bool:
    """Whether the dataset's loader reads `data.text_protocol`'s text itself (Multi30k: the
    official files of each protocol); the others load raw text for `apply_protocol`."""
    return cfg_data.dataset == "multi30k"


def read_split(cfg_data: ml_collections.ConfigDict, split: str) -> Corpus:
    """Every line of one split as its files hold it, in `data.text_protocol`'s form: an
    eval split as `load_corpus` gives it, and the training split before distillation and
    filtering (one line per pair as read: what a distillation teacher translates).

    Args:
      cfg_data: the `data` group of the config.
      split: "train", "valid" or "test".
    Returns:
      (sources, targets): parallel lists of strings, empty lines included.
    Raises:
      DataError: unknown dataset/split, missing/empty/mismatched/non-UTF-8 input.
    """
    check_dataset_name(cfg_data.dataset)
    _check_split(split)
    if cfg_data.source_lang == cfg_data.target_lang:
        raise DataError(f"data.source_lang and data.target_lang are both "
                        f"{cfg_data.source_lang!r}")
    sources, targets = LOADERS[cfg_data.dataset](cfg_data, split)
    if not reads_protocol_text(cfg_data):
        sources, targets = apply_protocol(cfg_data, sources, targets)
    return sources, targets


def load_corpus(cfg_data: ml_collections.ConfigDict, split: str) -> Corpus:
    """Loads one split of the configured corpus for training or evaluation.

    Args:
      cfg_data: the `data` group of the config (dataset, source_lang,
        target_lang and the loader's own keys).
      split: "train", "valid" or "test".
    Returns:
      (sources, targets): parallel lists of strings in `data.text_protocol`'s form
      (data/protocol.py; raw text by default). "train" has the teacher's targets with
      `data.distilled_targets`, no pair with an empty side and at most
      `max_train_sentences` pairs (if > 0); eval splits keep every line (`read_split`).
    Raises:
      DataError: unknown dataset/split, missing/empty/mismatched/non-UTF-8 input.
    """
    sources, targets = read_split(cfg_data, split)
    if split == "train" and (distilled := distilled_lines(cfg_data)) is not None:
        name, pairs = cfg_data.distilled_targets, len(sources)
        sources, targets = with_distilled(sources, targets, distilled,
                                          cfg_data.get("distilled_mix", "replace"), name)
        check_distilled_end(distilled, name, pairs)
    if split == "train":
        sources, targets = drop_empty_pairs(sources, targets)
        if not sources:
            raise DataError(f"empty corpus: no {cfg_data.dataset} training pair "
                            "has both sides non-empty")
        limit = cfg_data.get("max_train_sentences", 0)
        if limit > 0:
            sources, targets = sources[:limit], targets[:limit]
    return sources, targets


def corpus_fingerprint(sources: list[str], targets: list[str]) -> str:
    """SHA-256 of the training pairs as loaded (after filtering and max_train_sentences);
    a checkpoint stores it so that a resume on other data is refused."""
    digest = hashlib.sha256()
    for side in (sources, targets):
        for line in side:
            digest.update(line.encode("utf-8") + b"\n")
        digest.update(b"\0")
    return digest.hexdigest()
