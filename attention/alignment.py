"""Word alignments from cross-attention, Pharaoh / TALP files and AER.

Python API (the `--align` / `--gold` options of `python -m attention.inspect` use it):

    maps = load_maps("runs/de_en/attention/step_10000.npz")
    hyps = extract_alignments(maps, layers=[-2], words=True)    # one list per example
    golds = read_talp("gold.talp")[: maps.num_examples]
    print(format_pharaoh(hyps[0]), aer(hyps, golds))

Indices are 0-indexed `(source, target)` pairs over the real tokens: `<s>` and `</s>`
are never counted. With `words=True` they index words (whitespace tokens of the
original text, recovered from the SentencePiece "▁" word-start marker).

Which attention row aligns a target token. In the map file the target axis holds the
decoder *input* `<s> y1 ... yn` (`attention/mapfile.py`): query row r is fed token r
and predicts token r + 1. Target token y_j (0-indexed j, stored at position j + 1) is
therefore *predicted* at row j -- the usual choice -- and is the *input* at row j + 1.
Chen et al. (2020, "Accurate word alignment induction from neural machine
translation") observe that attention at the step where y_j is fed in ("shift-att")
aligns better, since the decoder has then seen y_j; `shift=True` reads row j + 1,
which always exists because the decoder also runs on y_n to predict `</s>`.

TALP gold files (`gold.talp`, Vilar et al. 2006): one line per sentence, links `i-j`
(sure) and `ipj` (possible), 1-indexed, `i` the German (source) word and `j` the
English word of `test.de-en` (`de ||| en`): on all 508 lines the largest `i` fits the
German length and the largest `j` the English one, while the reverse fails on 427.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from attention.mapfile import AttentionMaps
from configs.errors import UserError

WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a new whitespace word
SPECIAL_TOKENS = frozenset({"<s>", "</s>", "<pad>", ""})

Link = tuple[int, int]


def words_from_pieces(pieces: Sequence[str]) -> list[int]:
    """Word index of each piece: [P] -> [P], -1 for special tokens.

    A piece starting with "▁" opens a new word; any other piece continues the current
    one (a leading continuation piece opens word 0). Example:
    ["▁Ein", "▁Mann", "▁spiel", "t", "</s>"] -> [0, 1, 2, 2, -1].
    """
    out, word = [], -1
    for piece in pieces:
        if piece in SPECIAL_TOKENS:
            out.append(-1)
            continue
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        out.append(word)
    return out


def _real_positions(tokens: Sequence[str]) -> list[int]:
    return [i for i, tok in enumerate(tokens) if tok not in SPECIAL_TOKENS]


def extract_alignment(
    maps: AttentionMaps,
    example: int,
    layers: int | str | Sequence[int] = "mean",
    heads: int | str | Sequence[int] = "mean",
    shift: bool = False,
    skip_eos: bool = True,
    words: bool = False,
) -> list[Link]:
    """Hard alignment of one example: each target token -> argmax source token.

    The cross-attention [T, S] of `example` is averaged over `layers` and `heads` (an
    index, a list of indices -- negative ones count from the end -- or "mean" for all).
    For target token j the source argmax is taken on row j (where y_j is predicted) or,
    with `shift`, on row j + 1 (where y_j is the decoder input), see the module docstring.
    With `skip_eos` the `</s>` source column is left out of the argmax; without it a
    target token whose argmax is `</s>` stays unaligned (the "null" link). `words`
    merges pieces into words: two words are linked if any of their pieces are.

    Returns:
      sorted, duplicate-free (source, target) index pairs, 0-indexed over real pieces
      (or words), `<s>`/`</s>` not counted.
    """
    src = maps.key_tokens(example, "cross")  # pieces + </s>
    tgt = maps.query_tokens(example, "cross")  # <s> + pieces
    att = maps.matrix(example, "cross", layers, heads)  # [T, S]
    src_real, tgt_real = _real_positions(src), _real_positions(tgt)
    columns = src_real if skip_eos else list(range(len(src)))
    if not columns:
        return []
    links = set()
    for j, pos in enumerate(tgt_real):
        row = pos if shift else pos - 1  # the decoder input at row r is tgt[r]
        if not 0 <= row < len(tgt):
            continue
        best = columns[int(np.argmax(att[row, columns]))]
        if best in src_real:
            links.add((src_real.index(best), j))
    if words:
        src_word = [w for w in words_from_pieces(src) if w >= 0]
        tgt_word = [w for w in words_from_pieces(tgt) if w >= 0]
        links = {(src_word[i], tgt_word[j]) for i, j in links}
    return sorted(links)


def extract_alignments(maps: AttentionMaps, **kwargs) -> list[list[Link]]:
    """`extract_alignment` for every example of `maps`: N lists of links."""
    return [extract_alignment(maps, i, **kwargs) for i in range(maps.num_examples)]


def format_pharaoh(links: Iterable[Link]) -> str:
    """[(0, 1), (2, 3)] -> "0-1 2-3" (sorted)."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def parse_pharaoh(line: str) -> list[Link]:
    """"0-1 2-3" -> [(0, 1), (2, 3)]; raises ValueError on anything else."""
    links = []
    for item in line.split():
        m = re.fullmatch(r"(\d+)-(\d+)", item)
        if m is None:
            raise ValueError(f"not a Pharaoh link: {item!r}")
        links.append((int(m.group(1)), int(m.group(2))))
    return links


def read_pharaoh(path: str | os.PathLike) -> list[list[Link]]:
    """A Pharaoh file (one sentence per line, `i-j` 0-indexed) -> list of link lists."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                out.append(parse_pharaoh(line))
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
    return out


def read_talp(path: str | os.PathLike) -> list[tuple[set[Link], set[Link]]]:
    """A TALP gold file -> per sentence (sure, possible) sets of 0-indexed (src, tgt) links.

    `i-j` is a sure link, `ipj` a possible one; both 1-indexed in the file. As usual
    possible includes sure (S ⊆ P). For the RWTH de-en gold, i = German, j = English.
    Raises UserError naming the file (and line) for text that is not UTF-8 or a malformed
    link; OSError when the file cannot be read.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason})") from None
    out = []
    for n, line in enumerate(lines, 1):
        sure, possible = set(), set()
        for item in line.split():
            m = re.fullmatch(r"(\d+)([-p])(\d+)", item)
            if m is None or int(m.group(1)) < 1 or int(m.group(3)) < 1:
                raise UserError(f"{path}:{n}: not a 1-indexed TALP link: {item!r}")
            link = (int(m.group(1)) - 1, int(m.group(3)) - 1)
            possible.add(link)
            if m.group(2) == "-":
                sure.add(link)
        out.append((sure, possible))
    return out


def aer(
    hyps: Sequence[Iterable[Link]],
    golds: Sequence[tuple[Iterable[Link], Iterable[Link]]],
) -> float:
    """Corpus alignment error rate (Och & Ney 2003), counts summed over sentences.

    AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) with A the hypothesis, S the sure and P the
    possible links (P is taken as P ∪ S). Args: hyps [N] link lists, golds [N]
    (sure, possible) pairs as from `read_talp`. Returns a float in [0, 1].
    """
    if len(hyps) != len(golds):
        raise ValueError(f"{len(hyps)} hypothesis alignments but {len(golds)} gold ones")
    a_s = a_p = n_a = n_s = 0
    for hyp, (sure, possible) in zip(hyps, golds, strict=True):
        a, s = set(hyp), set(sure)
        p = set(possible) | s
        a_s += len(a & s)
        a_p += len(a & p)
        n_a += len(a)
        n_s += len(s)
    if n_a + n_s == 0:
        raise ValueError("AER is undefined without any hypothesis or sure gold link")
    return 1.0 - (a_s + a_p) / (n_a + n_s)
