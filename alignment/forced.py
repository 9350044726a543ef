"""Forced decoding of a bitext for word alignment: every pair teacher-forced through a
trained run, its cross-attention (and, when the model has one, its alignment head's
terms in logs) kept per forced-decoding unit, then read into word links for any setting.

    rec = Recorded("runs/align_de_en", "best", sources, targets)
    links = rec.links(layer="alignment", shift=False, threshold=None)   # N sorted lists

Used by the alignment command (alignment/command.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from alignment.links import (
    HEAD_LAYER,
    HEAD_LAYERS,
    HEADS_AND_STUDENT_LAYER,
    JOINT_HEADS_LAYER,
    REVERSE_HEAD_LAYER,
    STUDENT_JOINT_LAYER,
    STUDENT_LAYER,
    STUDENT_LAYERS,
    Link,
    Unit,
    make_units,
    merge_into_words,
    pair_links,
    symmetrize,
)
from common.errors import UserError
from configs import resolved

MAX_TOKENS = 1024  # pieces (with </s> or <s>) per side of one forced-decoding unit
PAD_MULTIPLE = 16  # unit lengths are padded to a multiple: fewer shapes to compile


def _groups(units: Sequence[Unit], batch_size: int):
    """Batches of units of similar length (`data.batching.length_groups`)."""
    from data.batching import length_groups
    from models.translate import MAP_BATCH_CELLS

    sizes = [max(len(u.src) + 1, len(u.tgt) + 1) for u in units]
    return length_groups(sizes, batch_size, max_cost=MAP_BATCH_CELLS,
                         cost=lambda longest, rows: rows * 2 * (longest + PAD_MULTIPLE) ** 2)


class HeadTerms(NamedTuple):
    """What the alignment head said about one forced-decoding unit: rows j (target piece
    y_j; row n: </s>), columns i (source piece i; column m: </s>, the NULL word)."""

    log_prior: np.ndarray  # float32 [n + 1, m + 1]: log a(i | x, y_<j)
    log_lexical: np.ndarray  # float32 [n + 1, m + 1]: log t(y_j | x_i)
    transition_bias: np.ndarray | None  # float32 [m + 2, m + 1] with alignment.jumps


@functools.cache
def _forced_fn(with_head: bool, measure: str = "weights"):
    """The jitted (graphdef [static], state, src, tgt_in, tgt_out) -> (cross-attention
    [L, B, H, T, S], or with `measure` "norm" / "alti" that measure's map of the same shape
    (`models.contributions.cross_map`), the head's terms {name: [B, T, S] or
    [B, S + 1, S]} or None); built on first use, so importing this module does not load
    JAX."""
    import jax
    from flax import nnx

    from models.contributions import cross_map

    def fn(graphdef, state, src, tgt_in, tgt_out):
        model = nnx.merge(graphdef, state)
        measured = None if measure == "weights" else cross_map(model, src, tgt_in, measure)
        if not with_head:
            if measured is not None:
                return measured, None
            return model(src, tgt_in, return_weights=True)[1]["cross"], None
        _, _, _, weights = model.forward_with_alignment(src, tgt_in, tgt_out,
                                                        return_weights=True)
        return (weights["cross"] if measured is None else measured), {
            key: value for key, value in weights.items() if key.startswith("alignment_")}

    return jax.jit(fn, static_argnums=0)


def record(model, units: Sequence[Unit], heads: str | Sequence[int], batch_size: int,
           limit: int = MAX_TOKENS, measure: str = "weights",
           ) -> tuple[list[np.ndarray], list[HeadTerms] | None, list[HeadTerms] | None,
                      list[tuple] | None]:
    """One teacher-forced pass over every unit: its cross-attention (or `measure`'s map,
    `_forced_fn`) averaged over `heads` and, for a model with an alignment head, the
    head's terms (alignment/head.py).

    Returns (per unit float32 [L, n + 1, m + 1]: decoder layer, decoder input row (<s>,
    y_0..y_{n-1}), source column (m pieces, then </s>); per unit `HeadTerms`, or None
    without a head; per unit the reverse head's `HeadTerms` with rows and columns swapped
    ([m + 1, n + 1], bias [n + 2, n + 1]), or None without alignment.reverse; per
    unit the student's two posteriors (float32 [n + 1, m + 1] over source pieces, [m + 1,
    n + 1] over target pieces), or None without alignment.student).
    Units go in batches of similar length, padded to a multiple of
    PAD_MULTIPLE, at most `limit` (padding is masked: the rows of the real tokens are the
    same).
    """
    import jax
    from flax import nnx

    from data.tokenizer import BOS_ID, EOS_ID, PAD_ID

    graphdef, state = nnx.split(model)
    with_head = getattr(model, "alignment_head", None) is not None  # an AlignmentTransformer
    with_reverse = getattr(model, "alignment_reverse", None) is not None
    with_student = getattr(model, "alignment_student", None) is not None
    atts: list = [None] * len(units)
    head_terms: list[HeadTerms] | None = [None] * len(units) if with_head else None
    reverse_terms: list[HeadTerms] | None = [None] * len(units) if with_reverse else None
    student: list[tuple] | None = [None] * len(units) if with_student else None
    head_index = slice(None) if heads == "mean" else list(heads)
    for group in _groups(units, batch_size):
        longest = max(max(len(units[i].src), len(units[i].tgt)) + 1 for i in group)
        width = min(longest + -longest % PAD_MULTIPLE, max(limit, longest))
        src, tgt_in, tgt_out = (np.full((len(group), width), PAD_ID, np.int32) for _ in range(3))
        for row, i in enumerate(group):
            u = units[i]
            src[row, : len(u.src) + 1] = [*u.src, EOS_ID]
            tgt_in[row, : len(u.tgt) + 1] = [BOS_ID, *u.tgt]
            tgt_out[row, : len(u.tgt) + 1] = [*u.tgt, EOS_ID]
        cross, terms = jax.device_get(_forced_fn(with_head, measure)(graphdef, state, src,
                                                                    tgt_in, tgt_out))
        for row, i in enumerate(group):
            n, m = len(units[i].tgt), len(units[i].src)
            atts[i] = np.asarray(cross[:, row][:, head_index, : n + 1, : m + 1],
                                 np.float32).mean(axis=1)
            if with_head:
                head_terms[i] = _unit_terms(terms, "alignment_", row, n, m)
            if with_reverse:
                reverse_terms[i] = _unit_terms(terms, "alignment_reverse_", row, m, n)
            if with_student:
                student[i] = tuple(np.exp(np.asarray(terms[name][row, : a + 1, : b + 1],
                                                     np.float32))
                                   for name, a, b in (("alignment_student_log_posterior", n, m),
                                                      ("alignment_student_reverse_log_posterior",
                                                       m, n)))
    return atts, head_terms, reverse_terms, student


def _unit_terms(terms: dict, prefix: str, row: int, rows: int, cols: int) -> HeadTerms:
    """One unit's `HeadTerms` out of a batch's terms (names `prefix` + field): its
    [rows + 1, cols + 1] corner, the bias's [cols + 2, cols + 1]."""
    bias = terms.get(f"{prefix}transition_bias")
    return HeadTerms(*(np.asarray(terms[f"{prefix}{name}"][row, : rows + 1, : cols + 1],
                                  np.float32) for name in ("log_prior", "log_lexical")),
                     None if bias is None else np.asarray(bias[row, : cols + 2, : cols + 1],
                                                          np.float32))


def head_posterior(terms: HeadTerms, prior_weight: float = 1.0) -> np.ndarray:
    """The alignment head's posterior p(i | x, y) with its prior raised to `prior_weight`
    w. For the mixture, p(i | x, y_<=j) proportional to a(i | x, y_<j)^w t(y_j | x_i); for
    the HMM (`terms.transition_bias`), the forward-backward marginals of the chain whose
    transitions are raised to w (`alignment.head.hmm_log_likelihood`): it reads the
    whole target, so later pieces move earlier links. w = 1 is the model's own posterior;
    w = 0 drops the prior (IBM model 1's reading: each target piece goes to the source
    piece that best translates it); in between trusts the learned prior less.

    Returns float32 [n + 1, m + 1], rows summing to 1.
    """
    from scipy.special import log_softmax

    if terms.transition_bias is None:
        return np.exp(log_softmax(terms.log_lexical + prior_weight * terms.log_prior,
                                  axis=-1)).astype(np.float32)
    # In probabilities, each row rescaled (the marginals are normalised per row anyway):
    # small matrix products, not a logsumexp per cell.
    lexical = terms.log_lexical.astype(np.float64)
    lexical = np.exp(lexical - lexical.max(axis=-1, keepdims=True))  # [rows, to]
    # [rows, from (the start, then each piece), to], rows summing to 1
    moves = np.exp(log_softmax(prior_weight * (terms.log_prior[:, None, :].astype(np.float64)
                                               + terms.transition_bias), axis=-1))
    forward = np.empty_like(lexical)  # p(i_j = i | y_<=j)
    before = np.eye(1, lexical.shape[1] + 1)[0]  # the chain's start
    for j in range(len(lexical)):
        row = (before @ moves[j]) * lexical[j]
        forward[j] = row / row.sum()
        before[0], before[1:] = 0.0, forward[j]
    marginals, after = forward.copy(), np.ones(lexical.shape[1])  # p(y_>j | i_j = i), scaled
    for j in range(len(lexical) - 2, -1, -1):
        after = moves[j + 1][1:] @ (lexical[j + 1] * after)
        after /= after.max()
        marginals[j] = forward[j] * after
    return (marginals / marginals.sum(axis=-1, keepdims=True)).astype(np.float32)


def joint_posterior(forward: np.ndarray, reverse: np.ndarray) -> np.ndarray:
    """Where the two heads agree, on one unit: the geometric mean sqrt(p(i | j) p(j | i))
    of the forward head's posterior (float [n + 1, m + 1]: target piece rows, source
    piece columns) and the reverse head's (float [m + 1, n + 1]), so a threshold d on it
    is d^2 on their product (Liang et al. 2006's posterior decoding of two directional
    HMMs). Returns float32 [n + 1, m + 1]; the target </s> row and the NULL column are 0:
    a link needs both heads, and an argmax always lands on a source piece."""
    out = np.zeros(forward.shape, np.float32)
    out[:-1, :-1] = np.sqrt(forward[:-1, :-1] * reverse[:-1, :-1].T)
    return out


class Recorded:
    """One run at one checkpoint, forced-decoded on N pairs: `links(...)` for any setting.

    `layers` lists what `links` can read: each decoder layer's index, "mean" (of the
    layers), HEAD_LAYER when the model has an alignment head, and REVERSE_HEAD_LAYER and
    JOINT_HEADS_LAYER (the two heads' `joint_posterior`) when it also has the reverse one
    (alignment.reverse), STUDENT_LAYERS with alignment.student.
    """

    def __init__(self, workdir: str | Path, checkpoint: str, sources: Sequence[str],
                 targets: Sequence[str], heads: str | Sequence[int] = "mean",
                 batch_size: int = 32, max_tokens: int | None = None,
                 measure: str = "weights", reinit_seed: int | None = None):
        from evaluation.loading import load_params, load_tokenizer

        self.workdir = Path(workdir)
        self.cfg = resolved.load_config_json(self.workdir)
        tokenizer = load_tokenizer(self.workdir, self.cfg)
        # reinit_seed: the architecture with random parameters (the sanity check)
        loaded = load_params(self.workdir, checkpoint, cfg=self.cfg, tokenizer=tokenizer,
                             reinit_seed=reinit_seed)
        self.step, self.num_layers = loaded.steps[-1], self.cfg.model.num_decoder_layers
        if heads != "mean":
            bad = [h for h in heads if not 0 <= h < self.cfg.model.num_heads]
            if bad:
                raise UserError(f"--heads {bad[0]}: {self.workdir} has heads 0.."
                                f"{self.cfg.model.num_heads - 1}")
        limit = max_tokens or MAX_TOKENS
        if self.cfg.model.positions == "learned":
            limit = min(limit, self.cfg.model.max_positions)
        self.num_pairs = len(sources)
        self.units = make_units(tokenizer, sources, targets, limit)
        self.measure = measure  # what the decoder layers' maps are (`record`)
        self.atts, head, reverse, student = record(loaded.model, self.units, heads,
                                                   batch_size, limit, measure)
        self.terms = {HEAD_LAYER: head, REVERSE_HEAD_LAYER: reverse}
        self.has_head = head is not None
        self._posteriors: dict[tuple, list[np.ndarray]] = {}  # head_posteriors, per weight
        self.student = student  # per unit (its rows' posterior, its columns'), or None
        # the joint reading needs both heads (a reverse head never comes without the other)
        present = {HEAD_LAYER: head, REVERSE_HEAD_LAYER: reverse, JOINT_HEADS_LAYER: reverse,
                   STUDENT_LAYER: student, STUDENT_JOINT_LAYER: student,
                   HEADS_AND_STUDENT_LAYER: student}
        self.head_layers = [layer for layer in HEAD_LAYERS if present[layer] is not None]
        self.layers = [*range(self.num_layers), "mean", *self.head_layers]

    def layer_index(self, layer: int | str) -> int | str:
        """`layer` checked against the model: "mean", one of HEAD_LAYERS or an index in
        0..L-1."""
        if layer == "mean":
            return layer
        if layer in HEAD_LAYERS:
            if layer not in self.head_layers:
                off = ("no alignment config group" if not self.has_head else
                       "alignment.student off"
                       if layer in (*STUDENT_LAYERS, HEADS_AND_STUDENT_LAYER)
                       else "alignment.reverse off")
                raise UserError(f"--layer {layer}: {self.workdir} has no {layer} head ({off})")
            return layer
        if not -self.num_layers <= int(layer) < self.num_layers:
            raise UserError(f"--layer {layer}: {self.workdir} has decoder layers "
                            f"0..{self.num_layers - 1}")
        return int(layer) % self.num_layers

    def links(self, layer, shift: bool, threshold: float | None, transpose: bool = False,
              prior_weight: float | None = None, words: bool = False,
              both_ways: str | None = None) -> list[list[Link]]:
        """Word links per pair (`alignment.links.pair_links`: `words` merges the map
        into words before reading it; `both_ways`, a SYMMETRIZE method, combines its rows'
        links with its columns'). A head's posterior (`head_posterior` with
        `prior_weight`, None = 1) row j already aligns y_j (no shift), and its argmax may
        fall on `</s>`, the NULL word: that piece stays unaligned. The reverse head's rows
        are the source pieces: its links come out (source, target) as the others'."""
        layer = self.layer_index(layer)
        combine = None if both_ways in (None, "none") else functools.partial(
            symmetrize, method=both_ways)
        if layer in HEAD_LAYERS:
            if shift:
                raise UserError(f"--shift does not apply to --layer {layer}")
            posteriors = [p[None] for p in self.head_posteriors(prior_weight, layer)]
            reverse = layer == REVERSE_HEAD_LAYER
            units = [_swapped(u) for u in self.units] if reverse else self.units
            return pair_links(self.num_pairs, units, posteriors, 0, False, threshold,
                              transpose != reverse, null=True, words=words,
                              both_ways=combine)
        return pair_links(self.num_pairs, self.units, self.atts, layer, shift, threshold,
                          transpose, words=words, both_ways=combine)

    def head_posteriors(self, prior_weight: float | None = None,
                        layer: str = HEAD_LAYER) -> list[np.ndarray]:
        """Per unit, the posterior `head_posterior(terms, prior_weight)` (None = 1) of the
        head `layer` (HEAD_LAYERS), computed once per weight: `--select` reads each weight
        at every threshold. The student (STUDENT_LAYERS) has no prior: its rows'
        posterior, or their `joint_posterior` with its columns', whatever the weight.
        HEADS_AND_STUDENT_LAYER is the mean of the heads' joint posterior (at the weight)
        and the student's: a map (and a word map, the merge being linear) halfway
        between the two readings."""
        if layer == STUDENT_LAYER:
            return [rows for rows, _ in self.student]
        if layer == STUDENT_JOINT_LAYER:
            if (layer, None) not in self._posteriors:
                self._posteriors[layer, None] = [joint_posterior(*pair) for pair in self.student]
            return self._posteriors[layer, None]
        weight = 1.0 if prior_weight is None else float(prior_weight)
        key = (layer, weight)
        if key not in self._posteriors:
            if layer == HEADS_AND_STUDENT_LAYER:
                posteriors = [(h + s) / 2 for h, s in zip(
                    self.head_posteriors(weight, JOINT_HEADS_LAYER),
                    self.head_posteriors(None, STUDENT_JOINT_LAYER), strict=True)]
            elif layer == JOINT_HEADS_LAYER:  # from the two heads' own (cached) posteriors
                forward, reverse = (self.head_posteriors(weight, name)
                                    for name in (HEAD_LAYER, REVERSE_HEAD_LAYER))
                posteriors = [joint_posterior(f, r) for f, r in zip(forward, reverse,
                                                                    strict=True)]
            else:
                posteriors = [head_posterior(t, weight) for t in self.terms[layer]]
            self._posteriors[key] = posteriors
        return self._posteriors[key]

    def word_matrix(self, pair: int, layer, shift: bool,
                    prior_weight: float | None = None) -> np.ndarray:
        """What `links` reads for pair `pair`, merged into words: float32 [target words,
        source words], a target word's piece rows averaged and a source word's piece
        columns summed (`</s>` left out), as `alignment.figures.alignment_matrix` does."""
        units = [u for u in self.units if u.pair == pair]
        if len(units) != 1:
            raise UserError(f"pair {pair} was aligned in {len(units)} chunks: no single map")
        unit, index = units[0], self.units.index(units[0])
        layer = self.layer_index(layer)
        if layer == REVERSE_HEAD_LAYER:  # rows are source pieces: merged, then transposed
            rows = self.head_posteriors(prior_weight, layer)[index][:-1]  # [m, n + 1]
            merged, tgt_ids, _ = merge_into_words(rows, unit.tgt_words, unit.src_words)
            return np.ascontiguousarray(merged[:, : len(tgt_ids)].T)
        if layer in HEAD_LAYERS:
            att = self.head_posteriors(prior_weight, layer)[index]
        else:
            att = self.atts[index].mean(axis=0) if layer == "mean" else self.atts[index][layer]
        rows = att[1:] if shift and layer not in HEAD_LAYERS else att[:-1]  # [n, m + 1]
        merged, src_ids, _ = merge_into_words(rows, unit.src_words, unit.tgt_words)
        return merged[:, : len(src_ids)]


def _swapped(unit: Unit) -> Unit:
    """The unit with its sides swapped (the reverse head's rows are the source pieces)."""
    return Unit(unit.pair, unit.tgt, unit.tgt_words, unit.src, unit.src_words)
