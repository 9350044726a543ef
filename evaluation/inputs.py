"""What evaluate.py translates: a split of the run's dataset, or any text file or stdin,
with optional references; read and checked before any model is loaded (no JAX here).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import ml_collections

from common.errors import UserError
from data.corpora import DataError, decode_lines, load_corpus, read_lines


@dataclasses.dataclass
class Inputs:
    """What to translate: source lines, optional references, and how to name them."""

    sources: list[str]
    references: list[str] | None
    source_name: str  # for messages and the JSON: a path, "<stdin>" or "multi30k test (de)"
    reference_name: str | None
    base: str  # default output name stem
    split: str | None


def read_text(path: str) -> tuple[list[str], str]:
    """Lines of a text file (plain or gzip) or of stdin (`-`); (lines, name for messages).

    Raises DataError for a missing file or invalid UTF-8 (naming the file and line).
    """
    if path == "-":
        return decode_lines(sys.stdin.buffer.read(), "<stdin>"), "<stdin>"
    if Path(path).is_dir():
        raise DataError(f"{path} is a directory, not a text file")
    return read_lines(path), path


def output_base(split: str | None, source: str | None) -> str:
    """The default output name's stem: the split (test by default), the source file's name
    without `.gz` / `.txt`, or `stdin`."""
    if source is None:
        return split or "test"
    if source == "-":
        return "stdin"
    return Path(source).name.removesuffix(".gz").removesuffix(".txt") or "source"


def read_inputs(cfg: ml_collections.ConfigDict, split: str | None, source: str | None,
                reference: str | None, max_sentences: int = 0) -> Inputs:
    """Reads and checks the input text (before any model is loaded)."""
    if source is None:
        if reference is not None:
            raise UserError("--reference needs --source (with --split the reference is the "
                            "split's target side)")
        split = split or "test"
        sources, references = load_corpus(cfg.data, split)
        what = f"{cfg.data.dataset} {split}"
        inputs = Inputs(sources, references, f"{what} ({cfg.data.source_lang})",
                        f"{what} ({cfg.data.target_lang})", output_base(split, None), split)
    else:
        if split is not None:
            raise UserError("give either --split or --source, not both")
        if source == "-" and reference == "-":
            raise UserError("--source and --reference cannot both be stdin ('-')")
        sources, source_name = read_text(source)
        references, reference_name = read_text(reference) if reference else (None, None)
        if references is not None and len(references) != len(sources):
            raise DataError(f"mismatched line counts: {source_name} has {len(sources)} lines, "
                            f"{reference_name} has {len(references)}")
        inputs = Inputs(sources, references, source_name, reference_name,
                        output_base(None, source), None)
    if not inputs.sources:
        raise DataError(f"{inputs.source_name} is empty: nothing to translate")
    if max_sentences > 0:
        inputs.sources = inputs.sources[:max_sentences]
        if inputs.references is not None:
            inputs.references = inputs.references[:max_sentences]
    return inputs
