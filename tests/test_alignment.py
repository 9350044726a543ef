"""Alignment extraction, word merging, Pharaoh/TALP files and AER."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alignment.links import (
    aer,
    alignment_scores,
    column_links,
    extract_alignment,
    extract_alignments,
    format_pharaoh,
    links_from_rows,
    make_units,
    merge_into_words,
    pair_links,
    parse_pharaoh,
    read_gold,
    read_pairs,
    read_pharaoh,
    read_sides,
    read_talp,
    symmetrize,
    words_from_pieces,
)
from attention.mapfile import AttentionMaps, validate_maps
from common.errors import UserError

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_pairs() -> list[tuple[list[str], list[str]]]:
    """(German words, English words) of the 10 fixture sentences."""
    lines = (FIXTURES / "rwth_de_en.head10.de-en").read_text(encoding="utf-8").splitlines()
    return [tuple(side.split() for side in line.split(" ||| ")) for line in lines]


def hand_maps(examples: list[tuple[list[str], list[str], np.ndarray]]) -> AttentionMaps:
    """Maps from (source pieces, target pieces, cross [L, H, T, S]) per example.

    Self-attention is uniform over valid (and, for the decoder, past) keys.
    """
    n = len(examples)
    s = max(len(src) for src, _, _ in examples)
    t = max(len(tgt) for _, tgt, _ in examples)
    layers, heads = examples[0][2].shape[:2]
    enc = np.zeros((n, layers, heads, s, s), np.float32)
    dec = np.zeros((n, layers, heads, t, t), np.float32)
    cross = np.zeros((n, layers, heads, t, s), np.float32)
    src_tok, tgt_tok = np.full((n, s), "", "<U12"), np.full((n, t), "", "<U12")
    for i, (src, tgt, att) in enumerate(examples):
        enc[i, :, :, : len(src), : len(src)] = 1.0 / len(src)
        dec[i, :, :, : len(tgt), : len(tgt)] = np.tril(np.ones((len(tgt),) * 2)) / np.arange(
            1, len(tgt) + 1)[:, None]
        cross[i, :, :, : len(tgt), : len(src)] = att
        src_tok[i, : len(src)], tgt_tok[i, : len(tgt)] = src, tgt
    maps = AttentionMaps(enc, dec, cross, src_tok, tgt_tok,
                         np.array([len(e[0]) for e in examples], np.int32),
                         np.array([len(e[1]) for e in examples], np.int32), 0, "greedy")
    validate_maps(maps)
    return maps


SRC = ["▁a", "▁b", "▁c", "</s>"]
TGT = ["<s>", "▁x", "▁y", "▁z"]  # decoder input; row r predicts TGT[r + 1] (or </s>)
#                 a    b    c   </s>
A = np.array([[0.1, 0.6, 0.2, 0.1],   # row 0: input <s>, predicts x
              [0.7, 0.1, 0.1, 0.1],   # row 1: input x,   predicts y
              [0.1, 0.1, 0.3, 0.5],   # row 2: input y,   predicts z (</s> wins, then c)
              [0.1, 0.1, 0.6, 0.2]])  # row 3: input z,   predicts </s>
B = np.array([[0.1, 0.1, 0.7, 0.1],
              [0.7, 0.1, 0.1, 0.1],
              [0.1, 0.6, 0.2, 0.1],
              [0.1, 0.1, 0.6, 0.2]])


def simple_maps() -> AttentionMaps:
    """Two layers, two heads: layer 0 = A for both heads, layer 1 head 0 = A, head 1 = B."""
    att = np.stack([np.stack([A, A]), np.stack([A, B])])  # [L=2, H=2, T, S]
    return hand_maps([(SRC, TGT, att)])


def test_argmax_per_target_token_on_the_prediction_row():
    maps = simple_maps()
    # x <- row 0 -> b; y <- row 1 -> a; z <- row 2 -> c once </s> is skipped.
    assert extract_alignment(maps, 0, layers=[0]) == [(0, 1), (1, 0), (2, 2)]


def test_keeping_eos_leaves_its_winners_unaligned():
    maps = simple_maps()
    assert extract_alignment(maps, 0, layers=[0], skip_eos=False) == [(0, 1), (1, 0)]


def test_shift_reads_the_row_where_the_word_is_the_input():
    maps = simple_maps()
    # x <- row 1 -> a; y <- row 2 -> c (</s> skipped); z <- row 3 -> c.
    assert extract_alignment(maps, 0, layers=[0], shift=True) == [(0, 0), (2, 1), (2, 2)]


def test_layers_and_heads_are_averaged_as_asked():
    maps = simple_maps()
    # Layer 1, head 1 (= B): x <- row 0 -> c; z <- row 2 -> b.
    assert extract_alignment(maps, 0, layers=[1], heads=[1]) == [(0, 1), (1, 2), (2, 0)]
    assert extract_alignment(maps, 0, layers=-1, heads=1) == [(0, 1), (1, 2), (2, 0)]
    # Layer 1, mean of heads: row 0 = [.1, .35, .45, .1] -> c; row 2 = [.1, .35, .25, .3] -> b.
    assert extract_alignment(maps, 0, layers=[1]) == [(0, 1), (1, 2), (2, 0)]
    # All layers and heads (3 x A, 1 x B): row 0 -> b, row 2 -> c (</s> skipped).
    assert extract_alignment(maps, 0) == [(0, 1), (1, 0), (2, 2)]
    assert extract_alignment(maps, 0, heads=[0]) == [(0, 1), (1, 0), (2, 2)]


def test_words_from_pieces():
    assert words_from_pieces(["▁Ein", "▁Mann", "▁spiel", "t", "</s>"]) == [0, 1, 2, 2, -1]
    assert words_from_pieces(["<s>", "▁A", "▁man", "▁play", "s"]) == [-1, 0, 1, 2, 2]
    assert words_from_pieces(["spiel", "t", "▁im", "▁", "(", "P", "ark", ")"]) == [
        0, 0, 1, 2, 2, 2, 2, 2]
    assert words_from_pieces(["</s>"]) == [-1]


def test_word_level_links_merge_pieces():
    src = ["▁Ein", "▁Mann", "▁spiel", "t", "</s>"]
    tgt = ["<s>", "▁A", "▁man", "▁play", "s"]
    att = np.full((5, 5), 0.05)
    for row, col in ((0, 0), (1, 1), (2, 2), (3, 1), (4, 3)):
        att[row, col] = 0.8
    # pieces: A<-Ein (0,0); man<-Mann (1,1); play<-spiel (2,2); s<-Mann (1,3); and row 4 is
    # the </s> prediction, only read by shift.
    maps = hand_maps([(src, tgt, att[None, None])])
    assert extract_alignment(maps, 0) == [(0, 0), (1, 1), (1, 3), (2, 2)]
    # words: s belongs to "plays" (2) -> Mann (1); play/spiel -> (2, 2).
    assert extract_alignment(maps, 0, words=True) == [(0, 0), (1, 1), (1, 2), (2, 2)]
    # shift: A<-row1 Mann, man<-row2 spiel, play<-row3 Mann, s<-row4 t.
    assert extract_alignment(maps, 0, shift=True) == [(1, 0), (1, 2), (2, 1), (3, 3)]
    assert extract_alignment(maps, 0, shift=True, words=True) == [(1, 0), (1, 2), (2, 1), (2, 2)]


def test_pharaoh_round_trip(tmp_path):
    assert format_pharaoh([(2, 3), (0, 1)]) == "0-1 2-3"
    assert format_pharaoh([]) == ""
    assert parse_pharaoh("0-1 2-3\n") == [(0, 1), (2, 3)]
    (tmp_path / "a.txt").write_text("0-1 2-3\n\n4-4\n")
    assert read_pharaoh(tmp_path / "a.txt") == [[(0, 1), (2, 3)], [], [(4, 4)]]
    with pytest.raises(ValueError, match="2p3"):
        parse_pharaoh("0-1 2p3")


def test_read_talp_fixture_is_one_indexed_german_first():
    gold = read_talp(FIXTURES / "rwth_de_en.head10.talp")
    pairs = fixture_pairs()
    assert len(gold) == len(pairs) == 10
    sure, possible = gold[0]
    assert (8, 7) in sure and (0, 0) in sure and (7, 7) in sure  # "9-8", "1-1", "8-8"
    assert pairs[0][0][7] == "Rosinen" and pairs[0][1][7] == "cherry-pick"
    sure3, possible3 = gold[2]
    assert (24, 21) in possible3 and (24, 21) not in sure3  # "25p22"
    for (sure, possible), (de, en) in zip(gold, pairs, strict=True):
        assert sure <= possible
        assert max(i for i, _ in possible) < len(de)
        assert max(j for _, j in possible) < len(en)


def test_read_talp_rejects_bad_links(tmp_path):
    (tmp_path / "g.talp").write_text("1-1 2-2\n0-1\n")
    with pytest.raises(UserError, match=r"g.talp:2: not a 1-indexed TALP link: '0-1'"):
        read_talp(tmp_path / "g.talp")


def test_aer_of_gold_against_itself_is_zero():
    gold = read_talp(FIXTURES / "rwth_de_en.head10.talp")
    assert aer([sure for sure, _ in gold], gold) == 0.0


def test_aer_textbook_values():
    golds = [({(0, 0), (1, 1)}, {(0, 0), (1, 1), (1, 2)}), ({(0, 0)}, {(0, 0)})]
    # Sentence 1: A = {(0,0), (1,2), (2,2)}: |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 2
    #   -> AER = 1 - (1 + 2) / (3 + 2) = 0.4.
    hyp1 = [(0, 0), (1, 2), (2, 2)]
    assert aer([hyp1], golds[:1]) == pytest.approx(0.4)
    # Corpus with sentence 2 unaligned (A = {}, |S| = 1): 1 - (1 + 2 + 0 + 0) / (3 + 2 + 0 + 1)
    #   = 0.5, not the mean of the sentence AERs (0.4 and 1.0).
    assert aer([hyp1, []], golds) == pytest.approx(0.5)
    # Possible links count only in |A∩P|; hitting every sure link with nothing else gives 0,
    # and a hypothesis made only of possible links is not perfect: 1 - (0 + 1) / (1 + 2).
    assert aer([[(0, 0), (1, 1)]], golds[:1]) == 0.0
    assert aer([[(1, 2)]], golds[:1]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="1 hypothesis alignments but 2 gold"):
        aer([hyp1], golds)


def gold_peaked_maps() -> tuple[AttentionMaps, list[set]]:
    """Maps of the 10 fixture sentences whose cross-attention puts each English word on one
    sure German link (long words split into two pieces); returns maps and those links."""
    gold = read_talp(FIXTURES / "rwth_de_en.head10.talp")
    examples, chosen = [], []
    for (de, en), (sure, _) in zip(fixture_pairs(), gold, strict=True):

        def pieces(words):
            out = []
            for w in words:
                out += ["▁" + w[:4], w[4:]] if len(w) > 6 else ["▁" + w]
            return out

        src, tgt = pieces(de) + ["</s>"], ["<s>"] + pieces(en)
        src_word = words_from_pieces(src)
        tgt_word = [w for w in words_from_pieces(tgt) if w >= 0]
        att = np.full((len(tgt), len(src)), 0.01)
        links = set()
        for j, word in enumerate(tgt_word):  # target piece j is predicted on row j
            german = sorted(i for i, e in sure if e == word)
            if german:
                att[j, src_word.index(german[0])] = 1.0
                links.add((german[0], word))
            else:
                att[j, len(src) - 1] = 1.0  # no sure link: look at </s>, stays unaligned
        examples.append((src, tgt, (att / att.sum(1, keepdims=True))[None, None]))
        chosen.append(links)
    return hand_maps(examples), chosen


def test_word_alignments_against_real_gold():
    maps, chosen = gold_peaked_maps()
    gold = read_talp(FIXTURES / "rwth_de_en.head10.talp")
    hyps = extract_alignments(maps, words=True, skip_eos=False)
    assert [set(h) for h in hyps] == chosen
    # A ⊆ S, so |A∩S| = |A∩P| = |A| and AER = 1 - 2|A| / (|A| + |S|).
    n_a, n_s = sum(map(len, chosen)), sum(len(s) for s, _ in gold)
    assert aer(hyps, gold) == pytest.approx(1 - 2 * n_a / (n_a + n_s))


# ----------------------------------------------------------------- links from rows


def test_links_from_rows_argmax_threshold_and_words():
    # 3 target pieces over 3 source pieces + </s>; source pieces 1, 2 form word 1.
    rows = np.array([[0.6, 0.1, 0.1, 0.2],
                     [0.1, 0.3, 0.35, 0.25],
                     [0.05, 0.05, 0.1, 0.8]])
    src_words, tgt_words = [0, 1, 1], [0, 1, 1]
    assert links_from_rows(rows, src_words, tgt_words) == [(0, 0), (1, 1)]
    # Without skip_eos the last row's argmax is </s>: that piece stays unaligned.
    assert links_from_rows(rows, src_words, tgt_words, skip_eos=False) == [(0, 0), (1, 1)]
    assert links_from_rows(rows, [0, 1, 2], [0, 1, 2], skip_eos=False) == [(0, 0), (2, 1)]
    assert links_from_rows(rows, [0, 1, 2], [0, 1, 2]) == [(0, 0), (2, 1), (2, 2)]
    # Thresholds read the raw weights: </s> (0.8) never links, 0.3 and 0.35 both do.
    assert links_from_rows(rows, [0, 1, 2], [0, 1, 2], threshold=0.3) == [(0, 0), (1, 1), (2, 1)]
    assert links_from_rows(rows, [0, 1, 2], [0, 1, 2], threshold=0.9) == []
    assert links_from_rows(rows, src_words, tgt_words, threshold=0.05) == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert links_from_rows(rows[:0], [], []) == []
    with pytest.raises(ValueError, match="do not fit"):
        links_from_rows(rows, [0, 1, 2, 3, 4], [0, 1, 2])


def test_extract_alignment_threshold_uses_the_same_rows():
    maps = simple_maps()  # layer 0 = A: rows 0..2 predict x, y, z
    assert extract_alignment(maps, 0, layers=[0], threshold=0.5) == [(0, 1), (1, 0)]
    assert extract_alignment(maps, 0, layers=[0], threshold=0.2) == [
        (0, 1), (1, 0), (2, 0), (2, 2)]
    assert extract_alignment(maps, 0, layers=[0], shift=True, threshold=0.5) == [
        (0, 0), (2, 2)]


# ----------------------------------------------------------------- symmetrization


def test_intersect_and_union():
    fwd, rev = [(0, 0), (1, 1), (2, 1)], [(0, 0), (1, 1), (1, 2), (3, 3)]
    assert symmetrize(fwd, rev, "intersect") == [(0, 0), (1, 1)]
    assert symmetrize(fwd, rev, "union") == [(0, 0), (1, 1), (1, 2), (2, 1), (3, 3)]
    with pytest.raises(ValueError, match="unknown symmetrization 'grow'"):
        symmetrize(fwd, rev, "grow")


def test_grow_diag_final_and_hand_computed():
    gdfa = "grow-diag-final-and"
    # Intersection {0-0, 1-1}; grow-diag adds 1-2 (target 2 unaligned, next to 1-1) and
    # 2-1 (source 2 unaligned, next to 1-1); 3-3 has no neighbour in; final-and adds it
    # (both words unaligned).
    assert symmetrize([(0, 0), (1, 1), (2, 1)], [(0, 0), (1, 1), (1, 2), (3, 3)], gdfa) == [
        (0, 0), (1, 1), (1, 2), (2, 1), (3, 3)]
    # Empty intersection: nothing grows; final-and takes forward 1-1 (both unaligned), then
    # 3-1, 1-2 and 2-1 each share a word with it.
    assert symmetrize([(1, 1), (3, 1)], [(1, 2), (2, 1)], gdfa) == [(1, 1)]
    # Intersection {1-2}; 0-1 grows (diagonal neighbour, source 0 unaligned); 1-1 has both
    # words aligned; 2-0, 3-0, 3-1, 3-2 touch nothing in. final-and: forward 2-0 (both
    # unaligned) yes, forward 3-1 no (target 1 taken), reverse 3-0 / 3-2 no.
    assert symmetrize([(1, 2), (2, 0), (3, 1)], [(0, 1), (1, 1), (1, 2), (3, 0), (3, 2)],
                      gdfa) == [(0, 1), (1, 2), (2, 0)]


def test_grow_diag_final_and_visits_in_atools_order():
    """The same links give another result in another visiting order: this one is what
    `atools -c grow-diag-final-and` (clab/fast_align cab1e9a, built here) prints; the
    function also matched atools on 3,000 random pairs of alignments (each heuristic)."""
    forward = [(0, 0), (0, 2), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    # From {1-1}, in (source, target) order: 0-0, 0-2 and 2-0 grow (each has a word still
    # unaligned when visited); 1-2, 2-1, 2-2 then have both words aligned. Visited from
    # the end, 2-2 would come in and 0-0 would not.
    assert symmetrize(forward, [(1, 1)], "grow-diag-final-and") == [(0, 0), (0, 2), (1, 1), (2, 0)]
    assert symmetrize([(2, 0), (3, 1)], [(0, 2), (1, 0), (1, 2), (2, 0), (3, 0)],
                      "grow-diag-final-and") == [(0, 2), (1, 0), (2, 0), (3, 0), (3, 1)]
    assert symmetrize([(0, 3)], [(0, 0), (0, 3), (1, 1), (1, 2), (2, 2), (2, 3)],
                      "grow-diag-final-and") == [(0, 0), (0, 3), (1, 1), (1, 2), (2, 2)]


# ----------------------------------------------------------------- scores


def test_precision_recall_and_aer_hand_computed():
    golds = [({(0, 0), (1, 1)}, {(2, 2)}), ({(0, 0)}, {(0, 0), (0, 1)})]
    # Sentence 1: A = {0-0, 1-1, 2-2, 0-2}, S = {0-0, 1-1}, P = S + {2-2}:
    #   |A| = 4, |S| = 2, |A∩S| = 2, |A∩P| = 3 -> P = 3/4, R = 1, AER = 1 - 5/6.
    hyps = [[(0, 0), (1, 1), (2, 2), (0, 2)], [(0, 1)]]
    one = alignment_scores(hyps[:1], golds[:1])
    assert one["precision"] == pytest.approx(0.75) and one["recall"] == 1.0
    assert one["aer"] == pytest.approx(1 / 6)
    # Sentence 2: A = {0-1} (possible only): |A∩S| = 0, |A∩P| = 1. Corpus: |A| = 5,
    # |S| = 3, |A∩S| = 2, |A∩P| = 4 -> P = 4/5, R = 2/3, AER = 1 - 6/8.
    both = alignment_scores(hyps, golds)
    assert (both["precision"], both["recall"], both["aer"]) == pytest.approx((0.8, 2 / 3, 0.25))
    assert (both["hyp_links"], both["sure_links"], both["hyp_in_sure"],
            both["hyp_in_possible"], both["sentences"]) == (5, 3, 2, 4, 2)
    assert aer(hyps, golds) == both["aer"]
    empty = alignment_scores([[]], golds[:1])
    assert (empty["precision"], empty["recall"], empty["aer"]) == (0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="undefined"):
        alignment_scores([[]], [(set(), set())])


# ----------------------------------------------------------------- bitexts and units


def test_read_pairs_sides_and_gold(tmp_path):
    pairs = tmp_path / "p.txt"
    pairs.write_text("a b ||| x\n ||| y z\nc |||\n", encoding="utf-8")
    assert read_pairs(pairs) == (["a b", "", "c"], ["x", "y z", ""])
    (tmp_path / "s").write_text("a b\nc\n")
    (tmp_path / "t").write_text("x\ny z\n")
    assert read_sides(tmp_path / "s", tmp_path / "t") == (["a b", "c"], ["x", "y z"])
    (tmp_path / "t1").write_text("x\n")
    with pytest.raises(UserError, match="has 2 lines but .*t1 has 1"):
        read_sides(tmp_path / "s", tmp_path / "t1")
    for bad, n in (("a ||| b\nno separator\n", 2), ("a ||| b ||| c\n", 1)):
        pairs.write_text(bad)
        with pytest.raises(UserError, match=f"p.txt:{n}: expected 'source [|]{{3}} target'"):
            read_pairs(pairs)
    pairs.write_bytes(b"a ||| \xff\n")
    with pytest.raises(UserError, match="not UTF-8"):
        read_pairs(pairs)
    with pytest.raises(UserError, match="file not found"):
        read_pairs(tmp_path / "absent")
    gold = tmp_path / "g.talp"
    gold.write_text("1-1 2p1\n1-2\n")
    assert read_gold(gold, ["a b", "c"], ["x", "y z"]) == [
        ({(0, 0)}, {(0, 0), (1, 0)}), ({(0, 1)}, {(0, 1)})]
    with pytest.raises(UserError, match=r"g.talp:2: link 1-2 is outside the pair's 1 source "
                                        r"and 1 target words"):
        read_gold(gold, ["a b", "c"], ["x", "y"])
    with pytest.raises(UserError, match="has 2 lines but the input has 1 pairs"):
        read_gold(gold, ["a b"], ["x"])


class CharTokenizer:
    """Each word -> one piece per character (ids 10 + ord % 50); source ids end with eos."""

    def encode_source(self, texts):
        return [[10 + ord(c) % 50 for c in t] + [3] for t in texts]

    def encode_target(self, texts):
        return [[10 + ord(c) % 50 for c in t] for t in texts]


def test_units_merge_pieces_into_words_and_split_long_pairs():
    tok = CharTokenizer()
    units = make_units(tok, ["ab c", "", "x"], ["de", "y", ""], max_tokens=100)
    assert [(u.pair, u.src_words, u.tgt_words) for u in units] == [(0, [0, 0, 1], [0, 0])]
    # 30 source words of 2 pieces, 12 target words of 1 piece, at most 9 pieces per chunk:
    # 60 / 9 -> 7 chunks; every piece lands in exactly one, in order, with its word index.
    src, tgt = " ".join(["ab"] * 30), " ".join(["z"] * 12)
    units = make_units(tok, [src], [tgt], max_tokens=10)
    assert len(units) == 7 and all(len(u.src) <= 9 and len(u.tgt) <= 9 for u in units)
    assert [w for u in units for w in u.src_words] == [w for w in range(30) for _ in range(2)]
    assert [w for u in units for w in u.tgt_words] == list(range(12))
    # Each unit's attention: every target piece looks at the unit's first source piece.
    atts = []
    for u in units:
        att = np.zeros((1, len(u.tgt) + 1, len(u.src) + 1), np.float32)
        att[0, :, 0] = 1.0
        atts.append(att)
    links = pair_links(2, units, atts, layer=0, shift=False, threshold=None)
    assert links[1] == [] and links[0] == sorted(
        (u.src_words[0], j) for u in units for j in u.tgt_words)
    flipped = pair_links(2, units, atts, layer="mean", shift=True, threshold=None, transpose=True)
    assert flipped[0] == sorted((j, i) for i, j in links[0])


def test_word_map_and_reading_a_map_both_ways_by_hand():
    """Source words 0 = pieces (0, 1), 1 = piece 2; target words 0 = pieces (0, 1), 1 =
    piece 2, 2 = piece 3; column 3 is </s>."""
    from alignment.links import Unit, symmetrize

    rows = np.array([[0.3, 0.3, 0.1, 0.3],   # target word 0: pieces link 0 (argmax ties: first)
                     [0.1, 0.2, 0.6, 0.1],   # ... and source word 1
                     [0.0, 0.1, 0.1, 0.8],   # target word 1: mostly </s>
                     [0.4, 0.5, 0.05, 0.05]], np.float32)
    src_words, tgt_words = [0, 0, 1], [0, 0, 1, 2]
    merged, src_ids, tgt_ids = merge_into_words(rows, src_words, tgt_words)
    np.testing.assert_allclose(merged, [[0.45, 0.35, 0.2], [0.1, 0.1, 0.8], [0.9, 0.05, 0.05]],
                               atol=1e-6)
    assert (src_ids, tgt_ids) == ([0, 1], [0, 1, 2])
    np.testing.assert_allclose(merged.sum(-1), 1.0, atol=1e-6)  # rows still sum to 1
    # Pieces' links merged: (0,0) (1,0) (0,1) (0,2); the word map's: (0,0), (0,1), (0,2)
    # (target word 1's real columns tie at 0.1: the first wins).
    assert links_from_rows(rows, src_words, tgt_words) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert links_from_rows(merged, src_ids, tgt_ids) == [(0, 0), (0, 1), (0, 2)]
    # With </s> as NULL, target word 1 stays unaligned.
    assert links_from_rows(merged, src_ids, tgt_ids, skip_eos=False) == [(0, 0), (0, 2)]
    # The columns: source word 0's largest row is target word 2, source word 1's word 0.
    assert column_links(merged, src_ids, tgt_ids) == [(0, 2), (1, 0)]
    unit = Unit(0, [5, 6, 7], src_words, [8, 9, 10, 11], tgt_words)
    att = np.concatenate([rows, np.zeros((1, 4), np.float32)])[None]  # + the </s> row
    for method in ("intersect", "union", "grow-diag-final-and"):
        want = symmetrize([(0, 0), (0, 2)], [(0, 2), (1, 0)], method)
        got = pair_links(1, [unit], [att], 0, False, None, null=True, words=True,
                         both_ways=lambda a, b, m=method: symmetrize(a, b, m))
        assert got == [want], method
    assert pair_links(1, [unit], [att], 0, False, None, null=True, words=True,
                      both_ways=lambda a, b: symmetrize(a, b, "intersect")) == [[(0, 2)]]
