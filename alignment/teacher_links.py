"""An outside aligner's word links as the teacher of the alignment student.

Garg et al. (2019) taught their alignment layer GIZA++'s links; here eflomal's, made
from the very text the model trains on and symmetrised by grow-diag-final-and. A
statistical aligner is a model of another kind, so its errors are not the model's own
(a student taught by the run's own heads could only reproduce them: docs/alignment.md).

Making the links file, once per training text (needs eflomal, the `bench` extra):

    python -m attention.teacher_links --source runs/align_data/train.de \
        --target runs/align_data/train.en --source_lang de --target_lang en \
        > runs/align_data/train.links

One Pharaoh line per training pair, `i-j` between the pair's whitespace words (SPEC
§4.7, the words `attention.align` links). Repeated pairs are aligned once (eflomal on a
text that repeats the pairs to align scores worse: docs/alignment.md), each side
Moses-tokenized and lowercased as the aligners' evaluations do, and the links of the
Moses tokens are folded back onto the whitespace words that hold them. Training with
`--config.alignment.teacher_links=runs/align_data/train.links` maps them onto each row's
pieces (`piece_links`): target piece j and source piece i are linked when their words
are.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from alignment.links import WORD_START, Link, format_pharaoh, read_pharaoh, symmetrize
from common.errors import UserError
from data.batching import TokenArray
from data.cache import file_sha256


def moses_lowercase(lines: Sequence[str], lang: str) -> list[str]:
    """Moses-tokenized (sacremoses, no escaping), lowercased lines."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, escape=False, return_str=True).lower() for line in lines]


def eflomal_links(source: Sequence[str], target: Sequence[str], folder: Path,
                  model: int = 3) -> tuple[list[list[Link]], list[list[Link]]]:
    """eflomal -m `model` over tokenized lines, both directions: (forward links, reverse
    links), each as (source token, target token) pairs per line."""
    from eflomal import Aligner

    Aligner(model=model).align(list(source), list(target),
                               links_filename_fwd=str(folder / "eflomal.fwd"),
                               links_filename_rev=str(folder / "eflomal.rev"))
    return read_pharaoh(folder / "eflomal.fwd"), read_pharaoh(folder / "eflomal.rev")


def token_words(line: str, tokens: Sequence[str]) -> list[int]:
    """The whitespace word of `line` that holds each token of its tokenization: [N] ->
    [N]. Tokens are looked up in order (case-insensitively); one the line does not
    spell as such (a tokenizer's rewrite) stays with the word of the token before it.
    "Ein Hund." with ["ein", "hund", "."] -> [0, 1, 1]."""
    text = line.lower()
    starts = [i for i, c in enumerate(text) if not c.isspace() and (i == 0 or text[i - 1].isspace())]
    out, cursor, word = [], 0, 0
    for token in tokens:
        found = text.find(token, cursor)
        if found >= 0 and len(text[cursor:found].strip()) <= 2:  # near: not a chance match
            word = max(0, int(np.searchsorted(starts, found, side="right")) - 1)
            cursor = found + len(token)
        out.append(word)
    return out


def word_links(sources: Sequence[str], targets: Sequence[str], source_lang: str,
               target_lang: str) -> list[list[Link]]:
    """eflomal's grow-diag-final-and links between the whitespace words of each pair (the
    module docstring): one sorted link list per pair."""
    pairs = list(zip(sources, targets, strict=True))
    unique = list(dict.fromkeys(pairs))
    src_tok = moses_lowercase([s for s, _ in unique], source_lang)
    tgt_tok = moses_lowercase([t for _, t in unique], target_lang)
    with tempfile.TemporaryDirectory() as folder:
        forward, reverse = eflomal_links(src_tok, tgt_tok, Path(folder))
    out = {}
    for (s, t), st, tt, f, r in zip(unique, src_tok, tgt_tok, forward, reverse, strict=True):
        sw, tw = token_words(s, st.split()), token_words(t, tt.split())
        links = symmetrize(f, r, "grow-diag-final-and")
        out[(s, t)] = sorted({(sw[i], tw[j]) for i, j in links if i < len(sw) and j < len(tw)})
    return [out[pair] for pair in pairs]


def piece_word_index(pieces: Sequence[str]) -> np.ndarray:
    """Per vocabulary entry, whether the piece opens a whitespace word: bool [V] (the
    `alignment.links.words_from_pieces` rule, as a table over ids)."""
    return np.array([p.startswith(WORD_START) for p in pieces], bool)


def _words(ids: np.ndarray, opens: np.ndarray, real: int) -> np.ndarray:
    """Word index of the first `real` pieces of one row (a leading continuation piece
    opens word 0): int [real]."""
    return np.maximum(np.cumsum(opens[ids[:real]]) - 1, 0)


def piece_links(source_ids: TokenArray, target_ids: TokenArray, links: Sequence[Sequence[Link]],
                source_opens: np.ndarray, target_opens: np.ndarray) -> TokenArray:
    """Word links as the rows' piece links: row r's entry is [j0, i0, j1, i1, ...], target
    piece j (of target_ids[r], no specials) linked with source piece i (of
    source_ids[r], without its closing eos) when their words are linked.

    source_ids, target_ids: the training rows (data/batching.py); links: per row,
    (source word, target word) pairs; source_opens, target_opens: `piece_word_index` of
    each vocabulary. Raises UserError naming the first row whose links name a word its
    pieces do not have (a links file of another text)."""
    rows = []
    for r, row_links in enumerate(links):
        src_words = _words(source_ids[r], source_opens, len(source_ids[r]) - 1)
        tgt_words = _words(target_ids[r], target_opens, len(target_ids[r]))
        n_src, n_tgt = (int(w[-1]) + 1 if len(w) else 0 for w in (src_words, tgt_words))
        bad = [(i, j) for i, j in row_links if i >= n_src or j >= n_tgt]
        if bad:
            raise UserError(f"teacher links, line {r + 1}: link {bad[0][0]}-{bad[0][1]} but "
                            f"the pair has {n_src} source and {n_tgt} target words; the file "
                            "must align the training text line by line")
        linked = np.zeros((max(n_tgt, 1), max(n_src, 1)), bool)
        for i, j in row_links:
            linked[j, i] = True
        pairs = np.argwhere(linked[tgt_words][:, src_words])  # [K, 2]: (piece j, piece i)
        rows.append(pairs.reshape(-1))
    return TokenArray.from_lists(rows)


def read_teacher_links(path: str, pairs: int) -> tuple[list, str]:
    """alignment.teacher_links, read and checked against the training text's `pairs` (before
    anything is written): (each pair's word links, the file's SHA-256, kept in the
    checkpoint so a resume cannot switch teachers). UserError for a file that does not
    align the text line by line."""
    if not Path(path).is_file():
        raise UserError(f"alignment.teacher_links: {path} is not a file (make it with python -m "
                        "attention.teacher_links, alignment/teacher_links.py)")
    try:
        links, sha256 = read_pharaoh(path), file_sha256(path)
    except (OSError, ValueError) as e:
        raise UserError(f"alignment.teacher_links: {e}") from None
    if len(links) != pairs:
        raise UserError(f"alignment.teacher_links: {path} has {len(links)} lines, the training "
                        f"text {pairs} pairs")
    return links, sha256


def teacher_piece_links(links: list, tokenizer, source_ids: TokenArray, target_ids: TokenArray,
                        dropped: int) -> TokenArray:
    """The word links of `read_teacher_links` mapped onto the training rows' pieces
    (`piece_links`); the rows must be the text's pairs, none `dropped`."""
    if dropped:
        raise UserError(f"alignment.teacher_links: {dropped} training pairs were dropped as too "
                        "long, so the links no longer match the rows; raise data.max_length")

    def opens(pieces_of, size: int):
        return piece_word_index(pieces_of(list(range(size))))

    return piece_links(source_ids, target_ids, links,
                       opens(tokenizer.source_pieces, tokenizer.source_vocab_size),
                       opens(tokenizer.target_pieces, tokenizer.target_vocab_size))


def links_field(links: TokenArray):
    """The batch field of the rows' piece links (`piece_links`): fields(rows, B, L) ->
    uint8 [B, L, L], 1 where target piece j and source piece i of a row are linked
    (data/batching.py TrainBatcher `fields`; the student's teacher, "teacher_links")."""
    def field(rows: np.ndarray, batch_size: int, length: int) -> np.ndarray:
        teacher = np.zeros((batch_size, length, length), np.uint8)
        for r, i in enumerate(rows):
            entry = links[i]
            teacher[r, entry[0::2], entry[1::2]] = 1
        return teacher

    return field


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    from absl import flags

    flags.DEFINE_string("source", None, "Source side of the training text, one pair a line.")
    flags.DEFINE_string("target", None, "Target side, line by line with --source.")
    flags.DEFINE_string("source_lang", None, "Source language code (Moses' rules).")
    flags.DEFINE_string("target_lang", None, "Target language code.")


def main(argv: list[str]) -> None:
    """absl main: reads the two sides, aligns them, prints one Pharaoh line per pair."""
    from absl import flags

    from data.corpora import read_parallel

    f = flags.FLAGS
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    missing = [name for name in ("source", "target", "source_lang", "target_lang")
               if not f[name].value]
    if missing:
        raise UserError(f"--{missing[0]} is required")
    sources, targets = read_parallel(f.source, f.target)
    try:
        import eflomal  # noqa: F401
    except ImportError:
        raise UserError("eflomal is not installed: pip install -e '.[bench]' (or pip install "
                        "eflomal)") from None
    for links in word_links(sources, targets, f.source_lang, f.target_lang):
        sys.stdout.write(format_pharaoh(links) + "\n")

