"""What evaluate.py translates: a split of the run's dataset, or any text file or stdin,
with optional references; read and checked before any model is loaded (no JAX here).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import ml_collections

from common.errors import UserError
from data.corpora import DataError, decode_lines, read_lines, read_split
from data.protocol import RAW, apply_protocol, protocol_of


@dataclasses.dataclass
class Inputs:
    """What to translate: source lines, optional references, and how to name them."""

    sources: list[str]
    references: list[str] | None
    source_name: str  # for messages and the JSON: a path, "<stdin>" or "multi30k test (de)"
    reference_name: str | None
    base: str  # default output name stem
    split: str | None
    # The references before data.text_protocol's preprocessing (evaluate's detokenised
    # score); None when not asked for (`read_inputs(raw_references=False)`) or absent.
    raw_references: list[str] | None = None


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
                reference: str | None, max_sentences: int = 0,
                raw_references: bool = False) -> Inputs:
    """Reads and checks the input text (before any model is loaded).

    The text is in the run's `data.text_protocol` (data/protocol.py): a split is loaded in
    it, a `source` / `reference` file is raw text put into it here. `raw_references` also
    keeps the references as they were before (for a tokenised protocol's detokenised score).
    """
    protocol = protocol_of(cfg.data)
    if source is None:
        if reference is not None:
            raise UserError("--reference needs --source (with --split the reference is the "
                            "split's target side)")
        split = split or "test"
        # Every line of the split: for "train", one per training pair as read (what a
        # distillation teacher translates: docs/training.md).
        sources, references = read_split(cfg.data, split)
        what = f"{cfg.data.dataset} {split}"
        inputs = Inputs(sources, references, f"{what} ({cfg.data.source_lang})",
                        f"{what} ({cfg.data.target_lang})", output_base(split, None), split)
        if raw_references:
            inputs.raw_references = references if protocol == RAW else read_split(
                ml_collections.ConfigDict({**cfg.data.to_dict(), "text_protocol": RAW}),
                split)[1]
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
        inputs = Inputs(*apply_protocol(cfg.data, sources, references or []), source_name,
                        reference_name, output_base(None, source), None,
                        raw_references=references if raw_references else None)
        if references is None:
            inputs.references = None
    if not inputs.sources:
        raise DataError(f"{inputs.source_name} is empty: nothing to translate")
    if max_sentences > 0:
        inputs.sources = inputs.sources[:max_sentences]
        for field in ("references", "raw_references"):
            if getattr(inputs, field) is not None:
                setattr(inputs, field, getattr(inputs, field)[:max_sentences])
    return inputs
