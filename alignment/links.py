"""Word links: read from cross-attention, from and to Pharaoh / TALP files, symmetrised
over two directions and scored (AER, precision, recall) against gold links.

Python API (the `--align` / `--gold` options of `python -m attention.inspect` and the
alignment command `python -m attention.align` use it):

    maps = load_maps("runs/de_en/attention/step_10000.npz")
    hyps = extract_alignments(maps, layers=[-2], words=True)    # one list per example
    golds = read_talp("gold.talp")[: maps.num_examples]
    print(format_pharaoh(hyps[0]), aer(hyps, golds))

`links_from_rows` is the one reading of attention rows into links (argmax, or every
source piece over a threshold); `read_pairs` / `read_sides` / `read_gold` read a bitext and its gold links, and
`make_units` / `pair_links` cut it into the forced-decoding inputs of
`alignment.forced.record` and read their attention back into word links per pair.

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

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from attention.mapfile import AttentionMaps
from common.errors import UserError
from common.files import require_file

# The `layer` that reads a model's alignment head (alignment/head.py) instead of
# its cross-attention (alignment/forced.py, alignment/command.py).
HEAD_LAYER = "alignment"
# ... and the one that reads its reverse head (alignment.reverse): target -> source.
REVERSE_HEAD_LAYER = "alignment_reverse"
# ... and the one that reads the two heads' agreement: their posteriors' geometric mean.
JOINT_HEADS_LAYER = "alignment_joint"
# ... and the two that read the alignment student (alignment.student, taught by the
# heads or by an outside aligner's links): its rows, and the geometric mean of its rows and
# columns. No prior to weigh.
STUDENT_LAYER = "alignment_student"
STUDENT_JOINT_LAYER = "alignment_student_joint"
STUDENT_LAYERS = (STUDENT_LAYER, STUDENT_JOINT_LAYER)
# ... and the mean of the two joint readings, the heads' (a prior to weigh) and the student's.
HEADS_AND_STUDENT_LAYER = "alignment_heads_student"
HEAD_LAYERS = (HEAD_LAYER, REVERSE_HEAD_LAYER, JOINT_HEADS_LAYER, *STUDENT_LAYERS,
               HEADS_AND_STUDENT_LAYER)
# The ones read with a prior weight (`--prior_weight`): all but the student's own.
PRIOR_LAYERS = tuple(layer for layer in HEAD_LAYERS if layer not in STUDENT_LAYERS)
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


def links_from_rows(
    rows: np.ndarray,
    src_words: Sequence[int],
    tgt_words: Sequence[int],
    threshold: float | None = None,
    skip_eos: bool = True,
) -> list[Link]:
    """Links of one sentence from the attention row of each target piece.

    Args:
      rows: float [n, K], row j = the attention that aligns target piece j (see
        `extract_alignment` for which decoder row that is); columns 0..m-1 are the m real
        source pieces, columns m..K-1 (K >= m) are `</s>` (the "null" word) or padding.
      src_words: [m] the word (or piece) index each real source piece maps to.
      tgt_words: [n] the same for the target pieces.
      threshold: None = argmax: each target piece links its most attended source piece
        (Garg et al. 2019, Chen et al. 2020); a number: it links every source piece whose
        weight is at least `threshold`, none if no weight is (the raw weights, so mass
        on `</s>` stays unaligned; Zenkel et al. 2019, Chen et al. 2021).
      skip_eos: argmax over the m real columns only; without it over all K, and a piece
        whose argmax is a column >= m stays unaligned. Thresholds never link those.
    Returns:
      sorted, duplicate-free (src_words[i], tgt_words[j]) pairs: pieces merged into words
      (two words are linked when any of their pieces are).
    """
    m, n = len(src_words), len(tgt_words)
    if m == 0 or n == 0:
        return []
    rows = np.asarray(rows)
    if rows.shape[0] != n or rows.shape[1] < m:
        raise ValueError(f"rows {rows.shape} do not fit {n} target and {m} source pieces")
    if threshold is None:
        best = np.argmax(rows if not skip_eos else rows[:, :m], axis=1)
        pairs = [(int(i), j) for j, i in enumerate(best) if i < m]
    else:
        jj, ii = np.nonzero(rows[:, :m] >= threshold)  # row = target piece, column = source
        pairs = list(zip(ii.tolist(), jj.tolist(), strict=True))
    return sorted({(int(src_words[i]), int(tgt_words[j])) for i, j in pairs})


def extract_alignment(
    maps: AttentionMaps,
    example: int,
    layers: int | str | Sequence[int] = "mean",
    heads: int | str | Sequence[int] = "mean",
    shift: bool = False,
    skip_eos: bool = True,
    words: bool = False,
    threshold: float | None = None,
) -> list[Link]:
    """Hard alignment of one example: each target token -> argmax source token.

    The cross-attention [T, S] of `example` is averaged over `layers` and `heads` (an
    index, a list of indices -- negative ones count from the end -- or "mean" for all).
    For target token j the source argmax is taken on row j (where y_j is predicted) or,
    with `shift`, on row j + 1 (where y_j is the decoder input), see the module docstring.
    With `skip_eos` the `</s>` source column is left out of the argmax; without it a
    target token whose argmax is `</s>` stays unaligned (the "null" link). `words`
    merges pieces into words: two words are linked if any of their pieces are.
    `threshold` links every source token with at least that weight instead of the argmax
    (`links_from_rows`).

    Returns:
      sorted, duplicate-free (source, target) index pairs, 0-indexed over real pieces
      (or words), `<s>`/`</s>` not counted.
    """
    src = maps.key_tokens(example, "cross")  # pieces + </s>
    tgt = maps.query_tokens(example, "cross")  # <s> + pieces
    att = maps.matrix(example, "cross", layers, heads)  # [T, S]
    src_real, tgt_real = _real_positions(src), _real_positions(tgt)
    others = [i for i in range(len(src)) if i not in set(src_real)]
    # The decoder input at row r is tgt[r]: y_j at position p is predicted at row p - 1.
    rows = [(j, pos if shift else pos - 1) for j, pos in enumerate(tgt_real)]
    rows = [(j, r) for j, r in rows if 0 <= r < len(tgt)]
    src_ids = [w for w in words_from_pieces(src) if w >= 0] if words else range(len(src_real))
    tgt_ids = [w for w in words_from_pieces(tgt) if w >= 0] if words else range(len(tgt_real))
    block = att[[r for _, r in rows]][:, src_real + others]  # [n, K]
    return links_from_rows(block, src_ids, [tgt_ids[j] for j, _ in rows], threshold, skip_eos)


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


# ------------------------------------------- bitexts, and the units of forced decoding


def _read_text(path: str | Path) -> list[str]:
    path = require_file(path)
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_pairs(path: str | Path) -> tuple[list[str], list[str]]:
    """`src ||| tgt` lines -> (sources, targets), both [N] stripped strings.

    Raises UserError naming the file (and line): missing, not UTF-8, a line without
    exactly one "|||".
    """
    sources, targets = [], []
    for n, line in enumerate(_read_text(path), 1):
        if line.count("|||") != 1:
            raise UserError(f"{path}:{n}: expected 'source ||| target'")
        src, tgt = line.split("|||")
        sources.append(src.strip())
        targets.append(tgt.strip())
    return sources, targets


def read_sides(source: str | Path, target: str | Path) -> tuple[list[str], list[str]]:
    """Two plain files of N lines each -> (sources, targets); UserError if counts differ."""
    sources, targets = _read_text(source), _read_text(target)
    if len(sources) != len(targets):
        raise UserError(f"{source} has {len(sources)} lines but {target} has {len(targets)}")
    return sources, targets


def read_gold(path: str | Path, sources: Sequence[str], targets: Sequence[str]) -> list:
    """TALP gold for the pairs; UserError on another line count or a link past a sentence."""
    golds = read_talp(require_file(path))
    if len(golds) != len(sources):
        raise UserError(f"{path} has {len(golds)} lines but the input has {len(sources)} pairs")
    for n, ((_, possible), src, tgt) in enumerate(zip(golds, sources, targets, strict=True), 1):
        m, k = len(src.split()), len(tgt.split())
        for i, j in possible:
            if i >= m or j >= k:
                raise UserError(f"{path}:{n}: link {i + 1}-{j + 1} is outside the pair's {m} "
                                f"source and {k} target words (pairs the other way round?)")
    return golds


@dataclasses.dataclass
class Unit:
    """One forced-decoding input: a pair, or a chunk of a long one."""

    pair: int
    src: list[int]  # [m] source piece ids (no </s>)
    src_words: list[int]  # [m] word index of each source piece
    tgt: list[int]  # [n] target piece ids
    tgt_words: list[int]  # [n]


def _word_pieces(encode: Callable, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
    """Per text: (piece ids, word index of each piece), every word encoded on its own."""
    words = [text.split() for text in texts]
    flat = encode([w for ws in words for w in ws]) if any(words) else []
    out, k = [], 0
    for ws in words:
        ids, index = [], []
        for w in range(len(ws)):
            ids += flat[k]
            index += [w] * len(flat[k])
            k += 1
        out.append((ids, index))
    return out


def make_units(tokenizer, sources: Sequence[str], targets: Sequence[str],
               max_tokens: int) -> list[Unit]:
    """Forced-decoding units of N pairs: one per pair with words on both sides; a pair
    with more than `max_tokens - 1` pieces on a side becomes k consecutive chunks, cut at
    the same fractions of both sides (k the fewest that fit)."""
    src = _word_pieces(lambda ws: [ids[:-1] for ids in tokenizer.encode_source(ws)], sources)
    tgt = _word_pieces(tokenizer.encode_target, targets)
    units = []
    for pair, ((s, sw), (t, tw)) in enumerate(zip(src, tgt, strict=True)):
        if not s or not t:
            continue
        k = max(math.ceil(len(s) / (max_tokens - 1)), math.ceil(len(t) / (max_tokens - 1)))
        cut_s = [round(len(s) * q / k) for q in range(k + 1)]
        cut_t = [round(len(t) * q / k) for q in range(k + 1)]
        for q in range(k):
            a, b, c, d = cut_s[q], cut_s[q + 1], cut_t[q], cut_t[q + 1]
            if a < b and c < d:
                units.append(Unit(pair, s[a:b], sw[a:b], t[c:d], tw[c:d]))
    return units


def merge_into_words(rows: np.ndarray, src_words: Sequence[int],
                     tgt_words: Sequence[int]) -> tuple[np.ndarray, list[int], list[int]]:
    """A piece-level map as a word-level one: rows [n, K] (target pieces x m source
    pieces, then K - m columns for `</s>` or padding) -> (float32 [N, M + K - m]: a
    target word's piece rows averaged, a source word's piece columns summed, the columns
    past the m pieces kept; the M source and N target word indices, in order). Rows
    that summed to 1 still do."""
    src_words, tgt_words = np.asarray(src_words), np.asarray(tgt_words)
    src_ids, tgt_ids = np.unique(src_words), np.unique(tgt_words)
    m = len(src_words)
    by_word = np.stack([rows[tgt_words == w].mean(axis=0) for w in tgt_ids])
    columns = [by_word[:, :m][:, src_words == w].sum(axis=1) for w in src_ids]
    merged = np.concatenate([np.stack(columns, axis=1), by_word[:, m:]], axis=1)
    return merged.astype(np.float32), src_ids.tolist(), tgt_ids.tolist()


def column_links(rows: np.ndarray, src_words: Sequence[int],
                 tgt_words: Sequence[int]) -> list[Link]:
    """The map read the other way: each real source column's largest row, as
    (src_words[i], tgt_words[j]) links (a reverse direction from the same map, as
    SimAlign's "ArgMax" reads a similarity matrix both ways; Jalili Sabet et al. 2020).
    rows [n, K >= m] as `links_from_rows` takes them."""
    m = len(src_words)
    if m == 0 or len(tgt_words) == 0:
        return []
    best = np.argmax(np.asarray(rows)[:, :m], axis=0)
    return sorted({(int(src_words[i]), int(tgt_words[j])) for i, j in enumerate(best)})


def pair_links(num_pairs: int, units: Sequence[Unit], atts: Sequence[np.ndarray],
               layer: int | str, shift: bool, threshold: float | None,
               transpose: bool = False, null: bool = False, words: bool = False,
               both_ways: Callable[[list[Link], list[Link]], list[Link]] | None = None,
               ) -> list[list[Link]]:
    """Word links per pair from per-unit attention (the union over a pair's chunks).

    atts: per unit float [L, n + 1, m + 1] (decoder layer, decoder input row <s> y_0 ..
    y_{n-1}, source piece then </s>), as `alignment.forced.record` returns it; `layer` an
    index or "mean"; `shift` reads row j + 1 for target piece j instead of row j;
    `transpose` swaps (i, j) for a model of the other direction; `null` lets an argmax on
    the `</s>` column leave a target piece unaligned (`links_from_rows(skip_eos=False)`:
    for the alignment head, whose `</s>` is the mixture's NULL word). `words` reads the
    map merged into words first (`merge_into_words`) instead of merging the pieces'
    links; `both_ways(row links, column links)` (a symmetrisation) combines the rows'
    reading with the columns' (`column_links`) of the same map. Returns N sorted lists.
    """
    out: list[set] = [set() for _ in range(num_pairs)]
    for unit, att in zip(units, atts, strict=True):
        a = att.mean(axis=0) if layer == "mean" else att[layer]  # [n + 1, m + 1]
        rows = a[1:] if shift else a[:-1]  # row of target piece j: j + 1 (input) or j
        src_words, tgt_words = unit.src_words, unit.tgt_words
        if words:
            rows, src_words, tgt_words = merge_into_words(rows, src_words, tgt_words)
        links = links_from_rows(rows, src_words, tgt_words, threshold, skip_eos=not null)
        if both_ways is not None:
            links = both_ways(links, column_links(rows, src_words, tgt_words))
        out[unit.pair].update([(j, i) for i, j in links] if transpose else links)
    return [sorted(s) for s in out]


# --- combining and scoring link sets: symmetrisation, AER with precision and recall

SYMMETRIZE = ("grow-diag-final-and", "intersect", "union")
# The eight neighbours of grow-diag, in the order of fast_align's atools.cc.
_NEIGHBOURS = ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1))


def symmetrize(forward: Iterable[Link], reverse: Iterable[Link], method: str) -> list[Link]:
    """Combines the links of the two directions of one sentence pair.

    Both inputs are (source, target) pairs: the links of a target->source aligner must be
    transposed first. `method`:
      * "intersect": links in both; "union": links in either;
      * "grow-diag-final-and" (Koehn et al. 2003, 2005): start from the intersection;
        "grow-diag": repeatedly add a union link next to (8-neighbourhood) a link already
        in, if its source or its target word is still unaligned, until nothing is added;
        "final-and": add a forward link, then a reverse one, whose source and target
        words are both still unaligned.
    The visiting order is that of `atools -c grow-diag-final-and` (github.com/clab/
    fast_align, src/atools.cc, GDFACommand): candidates in (source, target) order, a
    pass sees the links added earlier in the same pass; so the result is atools'.
    Returns sorted links.
    """
    a, b = set(forward), set(reverse)
    if method == "intersect":
        return sorted(a & b)
    if method == "union":
        return sorted(a | b)
    if method != "grow-diag-final-and":
        raise ValueError(f"unknown symmetrization {method!r}; expected one of "
                         f"{', '.join(SYMMETRIZE)}")
    links = a & b
    src_done, tgt_done = {i for i, _ in links}, {j for _, j in links}

    def add(i: int, j: int) -> None:
        links.add((i, j))
        src_done.add(i)
        tgt_done.add(j)

    pending = sorted((a | b) - links)
    grown = True
    while grown:  # grow-diag
        grown, left = False, []
        for i, j in pending:
            if ((i not in src_done or j not in tgt_done)
                    and any((i + di, j + dj) in links for di, dj in _NEIGHBOURS)):
                add(i, j)
                grown = True
            else:
                left.append((i, j))
        pending = left
    for side in (a, b):  # final-and: the forward links first, then the reverse ones
        for i, j in sorted(side - links):
            if i not in src_done and j not in tgt_done:
                add(i, j)
    return sorted(links)


def alignment_scores(
    hyps: Sequence[Iterable[Link]],
    golds: Sequence[tuple[Iterable[Link], Iterable[Link]]],
) -> dict:
    """Corpus AER, precision and recall (Och & Ney 2003), counts summed over sentences.

    With A the hypothesis, S the sure and P the possible links (P taken as P ∪ S):
    precision = |A∩P| / |A|, recall = |A∩S| / |S|, AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|).
    Args: hyps [N] link lists, golds [N] (sure, possible) pairs as from `read_talp`.
    Returns: {"aer", "precision", "recall"} in [0, 1] (precision is 0 without any
    hypothesis link, recall 0 without any sure link), "sentences": N, and the counts
    "hyp_links" |A|, "sure_links" |S|, "hyp_in_sure" |A∩S|, "hyp_in_possible" |A∩P|.
    Raises ValueError: different lengths, or AER undefined (no A and no S link at all).
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
    return {"aer": 1.0 - (a_s + a_p) / (n_a + n_s), "precision": a_p / n_a if n_a else 0.0,
            "recall": a_s / n_s if n_s else 0.0, "sentences": len(hyps), "hyp_links": n_a,
            "sure_links": n_s, "hyp_in_sure": a_s, "hyp_in_possible": a_p}


def aer(
    hyps: Sequence[Iterable[Link]],
    golds: Sequence[tuple[Iterable[Link], Iterable[Link]]],
) -> float:
    """Corpus alignment error rate (Och & Ney 2003): `alignment_scores(...)["aer"]`.

    AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) with A the hypothesis, S the sure and P the
    possible links (P is taken as P ∪ S). Args: hyps [N] link lists, golds [N]
    (sure, possible) pairs as from `read_talp`. Returns a float in [0, 1].
    """
    return alignment_scores(hyps, golds)["aer"]
