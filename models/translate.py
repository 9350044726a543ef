"""Batched translation of whole corpora: bucketed batches -> search -> ids in input order.

Shared by validation in train.py and by evaluate.py. Sentences are sorted by length
(`data.batching.eval_batches`), padded to multiples of `bucket_step`, and the
maximum target length is bucketed too, so jit compiles a handful of shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from data.batching import eval_batches, restore_order
from models.search import to_token_lists, translate_split


def translate_ids(
    model,
    source_ids: Sequence[Sequence[int]],
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    batch_size: int = 64,
    bucket_step: int = 8,
    progress: bool = False,
) -> list[list[int]]:
    """Translate tokenized sentences (each ending in eos).

    Returns one list of target ids per input, in input order, without bos/eos/pad.
    An empty source (just eos) still gets a (possibly empty) translation.
    """
    graphdef, state = nnx.split(model)
    outputs, orders = [], []
    batches = eval_batches(source_ids, batch_size=batch_size, bucket_step=bucket_step)
    total = -(-len(source_ids) // batch_size)
    for batch, indices in tqdm(batches, total=total, disable=not progress, desc="decode",
                               unit="batch", dynamic_ncols=True):
        result = translate_split(graphdef, state, batch["src"], beam_size=beam_size,
                                 length_penalty=length_penalty)
        outputs.append(to_token_lists(jax.device_get(result)))
        orders.append(indices)
    return restore_order(outputs, orders, len(source_ids))


@functools.partial(jax.jit, static_argnums=0)
def _teacher_forced_weights(graphdef, state, src, tgt_in) -> dict:
    """Attention weights of the teacher-forced pass (see `Transformer.__call__`)."""
    _, weights = nnx.merge(graphdef, state)(src, tgt_in, return_weights=True)
    return weights


def record_maps(model, tokenizer, source_ids, target_ids=None, *, beam_size=1,
                length_penalty=0.6, step=0):
    """Attention maps (SPEC §4.5) for a few sentences.

    With `target_ids` (lists without specials) the maps are teacher-forced on them;
    otherwise they are recorded while decoding (greedy or beam), for the returned
    hypotheses. Returns `attention.mapfile.AttentionMaps`.
    """
    from attention.mapfile import maps_from_arrays
    from data.batching import make_batch

    rows = list(range(len(source_ids)))
    if target_ids is not None:
        batch = make_batch(source_ids, target_ids, rows, len(rows),
                           max(len(s) for s in source_ids), max(len(t) for t in target_ids) + 1)
        graphdef, state = nnx.split(model)
        weights = _teacher_forced_weights(graphdef, state, batch["src"], batch["tgt_in"])
        hyps, decode = [list(t) for t in target_ids], "teacher_forced"
    else:
        batch = make_batch(source_ids, None, rows, len(rows), max(len(s) for s in source_ids), 0)
        graphdef, state = nnx.split(model)
        result = translate_split(graphdef, state, batch["src"], beam_size=beam_size,
                                 length_penalty=length_penalty, return_weights=True)
        hyps, weights = to_token_lists(result), result.weights
        decode = "greedy" if beam_size == 1 else "beam"
    weights = {k: np.asarray(v, np.float32) for k, v in jax.device_get(weights).items()}
    src_pieces = [tokenizer.source_pieces(ids) for ids in source_ids]
    # A hypothesis cut at max_length has no row for feeding its last token.
    rows = weights["cross"].shape[-2]
    tgt_pieces = [["<s>", *tokenizer.target_pieces(h)][:rows] for h in hyps]
    return maps_from_arrays(weights, src_pieces, tgt_pieces, step, decode)
