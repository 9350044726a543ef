"""Jitted decoding: one batch (`translate`, `translate_split`) or a whole corpus
(`translate_ids`), a corpus's pairs scored by teacher forcing (`sequence_log_probs`),
and the attention maps of a few sentences (`record_maps`, or
`record_maps_grouped` for any number of them, in batches of similar length).
`decode_shapes`, `compile_translate` and `compile_record_maps` compile those programs
without running them (validation's, ahead of time: evaluation/precompile.py).

The search algorithms themselves are in models/search.py and models/beam_search.py;
this module compiles them.
`translate_ids` is shared by validation in train.py and by evaluate.py: sentences are
sorted by length (`data.batching.eval_batches`), padded to multiples of `bucket_step`,
and the maximum target length is bucketed too, so jit compiles a handful of shapes.

jit pattern: `translate(model, src, ...)` splits the model (`nnx.split`) and calls one
`jax.jit`-compiled function of (graphdef [static], state, src, length_penalty [traced])
that merges the model inside the trace. Plain `jax.jit` over the split state has the
smallest per-call overhead on CPU (no NNX graph traversal inside the call, unlike
`nnx.jit`), and the length penalty is traced, so changing it does not recompile. The
graphdef is hashable (modules keep only the frozen `ModelConfig` and plain values as
static attributes), so it is the static argument itself: models of one config share
the compiled function. One compilation per (graph, src shape, beam_size, max_length,
return_weights); callers that already hold the split model use `translate_split`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from data.batching import eval_batches, length_groups, make_batch, restore_order
from data.tokenizer import EOS_ID, PAD_ID
from models.beam_search import beam_search, beam_search_nbest
from models.contributions import contributions as contributions_of
from models.search import SearchOutput, max_target_length


@functools.partial(jax.jit, static_argnames=("graphdef", "beam_size", "max_length",
                                             "return_weights", "nbest"))
def _translate_jit(graphdef, state, src, length_penalty, head_mask, *, beam_size, max_length,
                   return_weights, nbest):
    model = nnx.merge(graphdef, state)
    if nbest:
        return beam_search_nbest(model, src, beam_size=beam_size, length_penalty=length_penalty,
                                 max_length=max_length)
    return beam_search(model, src, beam_size=beam_size, length_penalty=length_penalty,
                       max_length=max_length, return_weights=return_weights,
                       head_mask=head_mask)


def _static_max_length(src, max_length) -> int:
    """`max_length`, or the bucketed budget of the longest source row (a Python int)."""
    if max_length is not None:
        return int(max_length)
    return max_target_length(np.sum(np.asarray(src) != PAD_ID, axis=1), multiple=8)


def translate_split(graphdef, state, src, *, beam_size: int = 1, length_penalty: float = 0.6,
                    max_length: int | None = None, return_weights: bool = False,
                    head_mask: dict | None = None, nbest: bool = False) -> SearchOutput:
    """`translate` for a model already split with `nnx.split` (graphdef, state).

    head_mask: {kind: [L, H] or [L, B, H]} heads kept (1) or removed (0), traced (other
    masks of the same shapes do not recompile); None decodes with every head.
    nbest: return each sentence's `beam_size` best hypotheses (`beam_search_nbest`: an
    axis K after the batch; no maps, no head mask).
    """
    max_length = _static_max_length(src, max_length)
    return _translate_jit(
        graphdef, state, jnp.asarray(src, jnp.int32),
        jnp.asarray(length_penalty, jnp.float32), head_mask, beam_size=int(beam_size),
        max_length=max_length, return_weights=bool(return_weights), nbest=bool(nbest),
    )


def compile_translate(graphdef, state, src_shape: tuple[int, int], max_length: int, *,
                      beam_size: int, return_weights: bool = False) -> None:
    """Compiles, without running it, the program `translate_split` runs on an int32 src of
    `src_shape` [B, S] with this `max_length`: a later call of the same shapes finds it
    compiled (jit's in-process cache, and the persistent one where it is on).

    graphdef, state: `nnx.split` of the model; state's leaves may be arrays or
    `jax.ShapeDtypeStruct`s (with the arrays' shardings, as the call will pass them).
    """
    _translate_jit.lower(
        graphdef, state, jax.ShapeDtypeStruct(tuple(src_shape), jnp.int32),
        jax.ShapeDtypeStruct((), jnp.float32), None, beam_size=int(beam_size),
        max_length=int(max_length), return_weights=bool(return_weights), nbest=False,
    ).compile()


def translate(model, src, *, beam_size: int = 1, length_penalty: float = 0.6,
              max_length: int | None = None, return_weights: bool = False) -> SearchOutput:
    """Jitted decoding of one batch: beam_size 1 -> greedy, otherwise beam search.

    src: int [B, S] (pad = 0). max_length: static int; None uses
    `max_target_length(source lengths, multiple=8)` (bucketed, so few shapes compile).
    Returns a `SearchOutput` (models/search.py; tokens [B, max_length]; for beam_size 1,
    `scores` are the log-probs normalized with `length_penalty`, as beam search would).
    """
    graphdef, state = nnx.split(model)
    return translate_split(graphdef, state, src, beam_size=beam_size, length_penalty=length_penalty,
                           max_length=max_length, return_weights=return_weights)


def to_token_lists(output: SearchOutput) -> list[list[int]]:
    """Host-side: each hypothesis as a list of ids, cut before its eos (no pad)."""
    tokens, lengths = np.asarray(output.tokens), np.asarray(output.lengths)
    result = []
    for row, n in zip(tokens, lengths, strict=True):
        ids = row[:n].tolist()
        result.append(ids[:-1] if ids and ids[-1] == EOS_ID else ids)
    return result


def to_nbest_lists(output: SearchOutput) -> list[list[tuple[list[int], float]]]:
    """Host-side, for an n-best `output` (tokens [B, K, T]): each sentence's entries,
    best first, as (ids as `to_token_lists` gives them, the search's score), the
    never-filled (-inf) entries left out."""
    tokens, lengths, scores = (np.asarray(x) for x in (output.tokens, output.lengths,
                                                      output.scores))
    batch, k, steps = tokens.shape
    flat = to_token_lists(SearchOutput(tokens.reshape(batch * k, steps),
                                       lengths.reshape(-1), None, None, None))
    return [[(flat[b * k + j], float(scores[b, j])) for j in range(k)
             if np.isfinite(scores[b, j])] for b in range(batch)]


def translate_ids(
    model,
    source_ids: Sequence[Sequence[int]],
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    batch_size: int = 64,
    bucket_step: int = 8,
    progress: bool = False,
    nbest: bool = False,
) -> list[list[int]] | list[list[tuple[list[int], float]]]:
    """Translate tokenized sentences (each ending in eos).

    Returns one list of target ids per input, in input order, without bos/eos/pad.
    An empty source (just eos) still gets a (possibly empty) translation. With
    `nbest`: per input, its `beam_size` best hypotheses with their scores
    (`to_nbest_lists`: (ids, score) pairs), best first.
    """
    graphdef, state = nnx.split(model)
    outputs, orders = [], []
    # Listed first: the length groups, not len / batch_size, give the progress bar's total.
    batches = list(eval_batches(source_ids, batch_size=batch_size, bucket_step=bucket_step))
    for batch, indices in tqdm(batches, disable=not progress, desc="decode", unit="batch",
                               dynamic_ncols=True):
        result = jax.device_get(translate_split(graphdef, state, batch["src"],
                                                beam_size=beam_size,
                                                length_penalty=length_penalty, nbest=nbest))
        outputs.append(to_nbest_lists(result) if nbest else to_token_lists(result))
        orders.append(indices)
    return restore_order(outputs, orders, len(source_ids))


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _forced_log_probs_jit(graphdef, state, src, tgt_in, tgt_out):
    model = nnx.merge(graphdef, state)
    logits, _ = model(src, tgt_in)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, tgt_out[..., None], axis=-1)[..., 0]
    return jnp.where(tgt_out != PAD_ID, picked, 0.0).sum(axis=-1)


def sequence_log_probs(model, source_ids: Sequence[Sequence[int]],
                       target_ids: Sequence[Sequence[int]], *, batch_size: int = 64,
                       bucket_step: int = 8) -> np.ndarray:
    """float [N]: log p(target + eos | source) of each pair, by teacher forcing (the sum
    the searches' `log_probs` hold for a hypothesis that ends in eos).

    source_ids: id lists with eos (`encode_source`); target_ids: id lists without specials
    (`encode_target`, or a search's `to_token_lists`). Batched as `translate_ids` batches.
    """
    graphdef, state = nnx.split(model)
    outputs, orders = [], []
    for batch, indices in eval_batches(source_ids, target_ids, batch_size=batch_size,
                                       bucket_step=bucket_step):
        scores = _forced_log_probs_jit(graphdef, state, jnp.asarray(batch["src"]),
                                       jnp.asarray(batch["tgt_in"]),
                                       jnp.asarray(batch["tgt_out"]))
        outputs.append(np.asarray(scores).tolist())
        orders.append(indices)
    return np.asarray(restore_order(outputs, orders, len(source_ids)), np.float64)


def decode_shapes(source_ids: Sequence[Sequence[int]], *, batch_size: int = 64,
                  bucket_step: int = 8) -> list[tuple[tuple[int, int], int]]:
    """The distinct (src shape [B, S], max_length) `translate_ids` decodes these sentences
    in, with the same `batch_size` and `bucket_step`: one compiled program each (per beam
    size), in the order it first meets them."""
    shapes = {}
    for batch, _ in eval_batches(source_ids, batch_size=batch_size, bucket_step=bucket_step):
        shapes[(batch["src"].shape, _static_max_length(batch["src"], None))] = None
    return list(shapes)


# Most weight-buffer cells (B * K * T * (T + S), per decoder layer and head) one batch of
# `record_maps_grouped` decodes: 2**22 is ~270 MB of float32 for 4 layers x 4 heads. A
# single sentence over it still gets a batch of its own.
MAP_BATCH_CELLS = 1 << 22


@functools.partial(jax.jit, static_argnums=0)
def _teacher_forced_weights(graphdef, state, src, tgt_in) -> dict:
    """Attention weights of the teacher-forced pass (see `Transformer.__call__`)."""
    _, weights = nnx.merge(graphdef, state)(src, tgt_in, return_weights=True)
    return weights


@functools.partial(jax.jit, static_argnums=0)
def _teacher_forced_contributions(graphdef, state, src, tgt_in) -> dict:
    """`models.contributions.contributions` of a teacher-forced batch (batch first)."""
    return contributions_of(nnx.merge(graphdef, state), src, tgt_in)


def record_maps(model, tokenizer, source_ids, target_ids=None, *, beam_size=1,
                length_penalty=0.6, step=0, contributions=False):
    """Attention maps (the map file of attention/mapfile.py) for a few sentences.

    With `target_ids` (lists without specials) the maps are teacher-forced on them;
    otherwise they are recorded while decoding (greedy or beam), for the returned
    hypotheses. `contributions`: also the norm-based maps and ALTI+
    (models/contributions.py), from a teacher-forced pass on the targets or on the
    returned hypotheses (the decoder is causal: that pass attends as the search did).
    Returns `attention.mapfile.AttentionMaps`.
    """
    from attention.mapfile import maps_from_arrays

    batch = _maps_batch(source_ids, target_ids)
    graphdef, state = nnx.split(model)
    if target_ids is not None:
        weights = _teacher_forced_weights(graphdef, state, batch["src"], batch["tgt_in"])
        hyps, decode = [list(t) for t in target_ids], "teacher_forced"
    else:
        result = translate_split(graphdef, state, batch["src"], beam_size=beam_size,
                                 length_penalty=length_penalty, return_weights=True)
        hyps, weights = to_token_lists(result), result.weights
        decode = "greedy" if beam_size == 1 else "beam"
        if contributions:
            rows = list(range(len(source_ids)))
            batch = make_batch(source_ids, hyps, rows, len(rows), batch["src"].shape[1],
                               max(len(h) for h in hyps) + 1)
    measured = None
    if contributions:
        measured = jax.device_get(_teacher_forced_contributions(graphdef, state, batch["src"],
                                                                batch["tgt_in"]))
    weights = {k: np.asarray(v, np.float32) for k, v in jax.device_get(weights).items()}
    src_pieces = [tokenizer.source_pieces(ids) for ids in source_ids]
    # A hypothesis cut at max_length has no row for feeding its last token.
    rows = weights["cross"].shape[-2]
    tgt_pieces = [["<s>", *tokenizer.target_pieces(h)][:rows] for h in hyps]
    return maps_from_arrays(weights, src_pieces, tgt_pieces, step, decode, measured)


def _maps_batch(source_ids, target_ids=None) -> dict:
    """`record_maps`' one batch of its few sentences: unbucketed, as long as the longest."""
    rows = list(range(len(source_ids)))
    tgt_len = max(len(t) for t in target_ids) + 1 if target_ids is not None else 0
    return make_batch(source_ids, target_ids, rows, len(rows),
                      max(len(s) for s in source_ids), tgt_len)


def compile_record_maps(graphdef, state, source_ids, target_ids=None, *,
                        beam_size: int = 1) -> None:
    """Compiles, without running it, the program `record_maps` runs for these sentences
    (teacher-forced with `target_ids`, else decoded); graphdef and state as in
    `compile_translate`. Not the contributions' pass."""
    batch = _maps_batch(source_ids, target_ids)
    if target_ids is not None:
        _teacher_forced_weights.lower(
            graphdef, state, jax.ShapeDtypeStruct(batch["src"].shape, batch["src"].dtype),
            jax.ShapeDtypeStruct(batch["tgt_in"].shape, batch["tgt_in"].dtype)).compile()
    else:
        compile_translate(graphdef, state, batch["src"].shape,
                          _static_max_length(batch["src"], None), beam_size=beam_size,
                          return_weights=True)


def map_groups(source_ids: Sequence[Sequence[int]], *, beam_size: int, batch_size: int,
               max_cells: int = MAP_BATCH_CELLS) -> list[list[int]]:
    """How `record_maps_grouped` batches sentences: `data.batching.length_groups` (longest
    first, similar lengths), with at most `max_cells` cells of the beam-search weight
    buffers per batch, B * beam_size * T * (T + S) (a longer sentence is alone)."""
    def cells(longest: int, rows: int) -> int:
        steps = max_target_length(longest, multiple=8)
        return rows * beam_size * steps * (steps + longest)

    return length_groups([len(s) for s in source_ids], batch_size, cost=cells,
                         max_cost=max_cells)


def record_maps_grouped(model, tokenizer, source_ids, *, beam_size=1, length_penalty=0.6,
                        step=0, batch_size=64, max_cells=MAP_BATCH_CELLS, progress=False,
                        contributions=False):
    """`record_maps` of the decoded hypotheses of any number of sentences, in the batches
    of `map_groups`, joined back in input order (`contributions` as in `record_maps`).

    source_ids: N id lists (with eos). Returns `attention.mapfile.AttentionMaps` with
    N examples in input order, S / T the longest source / target (zero-padded). A
    sentence's maps equal those of recording it alone (search results do not depend
    on the batch) unless its hypothesis reaches the decoding budget without eos: that
    budget is the batch's, at most twice its own (in `translate_ids`, the batch's too).
    """
    from attention.mapfile import concatenate_maps

    groups = map_groups(source_ids, beam_size=beam_size, batch_size=batch_size,
                        max_cells=max_cells)
    parts = [record_maps(model, tokenizer, [source_ids[i] for i in group], None,
                         beam_size=beam_size, length_penalty=length_penalty, step=step,
                         contributions=contributions)
             for group in tqdm(groups, disable=not progress, desc="attention maps",
                               unit="batch", dynamic_ncols=True)]
    return concatenate_maps(parts, order=[i for group in groups for i in group])
