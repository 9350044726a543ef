"""How much each token contributes, beyond the attention weights: norm-based attention
(Kobayashi et al. 2020, 2021) and ALTI+ (Ferrando et al. 2022), from a teacher-forced pass.

Everything here reads the model's own modules and parameters (`model.encoder_layers[i].
attention`, `.attention_block.norm`, ...) on a second, instrumented walk through the
layers (`trace`); the model's forward pass and its speed are untouched, and nothing is
computed unless a caller asks for it (`record_maps(..., contributions=True)`). Maps
recorded while decoding (greedy, beam) get their contributions from teacher-forcing the
returned hypothesis: the decoder is causal, so row t of that pass sees exactly the prefix
the search fed at step t, and its attention equals the recorded one
(tests/test_contributions.py checks this against beam-search maps).

Notation for one attention block (a layer's self-attention, or a decoder layer's
cross-attention) of one sentence: x [Q, D] the block's input (the residual stream),
u [K, D] what the values are computed from (pre-LN: LN(x) for self-attention; post-LN:
x; cross-attention: the encoder's output), alpha [H, Q, K] the weights,
W_v, b_v, W_o, b_o the value and output projections. Per head h,

    f_h(u_j) = (u_j W_v + b_v)[head h] W_o[rows of head h]            [D]
    attention output_i = sum_h sum_j alpha^h_ij f_h(u_j) + b_o

Measures (every array float32, one sentence; the batched functions add B after L):

* norm (Kobayashi et al. 2020, "Attention is Not Only a Weight"): ||alpha^h_ij f_h(u_j)||
  = alpha^h_ij ||f_h(u_j)|| per layer and head: [L, H, Q, K] like the weights. With
  f(u) constant over j the map is the weights times that norm.
* norm_resln (Kobayashi et al. 2021, "Incorporating Residual and Normalization Layers
  into Analysis of Masked Language Models": their "AttnResLn-N"), per layer, heads
  summed as in their paper: with z_ij = sum_h alpha^h_ij f_h(u_j) + [j is i's residual] x_i,
  post-LN: ||gamma * (z_ij - mean(z_ij)) / sqrt(var(x_i + out_i) + eps)|| (the layer norm
  split over the summands; its bias, b_o and the LN's beta belong to no token);
  pre-LN: ||z_ij|| (the block ends without a norm: "AttnRes-N"). Self-attention:
  [L, Q, K], the residual on the diagonal. Cross-attention: [L, T, S] for the source
  tokens plus `cross_residual` [L, T], the norm of the decoder state's residual term.
* ALTI (Ferrando et al. 2022, "Measuring the Mixing of Contextual Information in the
  Transformer") per block: with T_i(j) the j-th summand of the block's output y_i as
  above (post-LN: after the split layer norm), c_ij = max(0, ||y_i||_1 - ||y_i - T_i(j)||_1),
  normalised to sum 1 over j. Cross-attention has S + 1 summands: the source tokens and
  the residual (the decoder state).
* ALTI+ (Ferrando et al. 2022, "Towards Opening the Black Box of Neural Machine
  Translation"): encoder blocks compose by rollout into R_enc [S, S] (encoder output i
  from source input j); decoder layer l joins its blocks into
  J_l = [C_cross[:, :S] R_enc | C_self * C_cross[:, S]] [T, S + T], and layers compose:
  A_0 = J_0, A_l = [J_l^src + J_l^tgt A_{l-1}^src | J_l^tgt A_{l-1}^tgt]. The result for
  the last layer is `alti_source` [T, S] (each source token's share in the prediction
  made at target step t) and `alti_target` [T, T] (each decoder-input token's share,
  causal); each valid row of the two sums to 1, and `source_share` [T] is the row sum of
  `alti_source`. Feed-forward blocks, the final norm of a pre-LN stack and the
  embedding scale mix no tokens and are left out, as in the authors' code.

Where attnmt differs from the authors' code (mt-upc/transformer-contributions-nmt,
wrappers/transformer_wrapper.py; gorokoba560/norm-analysis-of-transformer):
* The layer norm is split with its exact statistics, sqrt(var(x + out) + eps) with the
  biased variance the layer uses; the ALTI+ code divides by torch's unbiased
  std(x + out + eps), which its own assertion only checks to 1e-3 per element.
* Pre-LN and post-LN are handled as in the ALTI+ code: post-LN folds the block's norm
  into the summands; pre-LN has no norm after the sum, so the summands are the
  attention terms of LN(x_j) and the residual x_i. Kobayashi et al. 2021 only treat
  post-LN (BERT); for pre-LN attnmt's `norm_resln` is their AttnRes-N.
* The value bias b_v stays in f_h (both authors: fairseq's and BERT's value projections
  include it); b_o (and beta) belong to no token but are part of the resultant y_i,
  as in the ALTI+ code.
* Cross-attention enters ALTI+ as in the ALTI+ code, the residual as an (S + 1)-th
  summand; the rollout is theirs, without their per-layer re-normalisation (the rows
  already sum to 1: tested). Kobayashi et al. never treat cross-attention;
  `norm_resln` keeps its residual term apart (`cross_residual`) rather than dropping it.
* The ALTI+ code computes one sentence at a time in PyTorch with hooks; here a batch
  is traced once and the per-sentence measures run under `jax.lax.map`, so memory
  stays at a few sentences' [Q, K, D] vectors whatever the batch size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from data.tokenizer import PAD_ID

DECODER_KINDS = ("decoder_self", "cross")
# How many sentences' [Q, K, D] summand vectors the per-sentence measures hold at once.
SENTENCES_AT_ONCE = 8


class BlockTrace(NamedTuple):
    """What one attention block saw in the teacher-forced pass (a batch).

    x: its input, the residual stream [B, Q, D]; values_in: what its values are projected
    from [B, K, D]; weights: float32 [B, H, Q, K]; summed: x + attention output (b_o
    included) [B, Q, D], the input of a post-LN block's norm (a pre-LN block's output).
    """

    x: jnp.ndarray
    values_in: jnp.ndarray
    weights: jnp.ndarray
    summed: jnp.ndarray


class Trace(NamedTuple):
    """The teacher-forced pass, block by block: `encoder_self`, `decoder_self`, `cross`
    each a list over layers of `BlockTrace`; logits float32 [B, T, V] (equal to the
    model's own pass: tested)."""

    encoder_self: list
    decoder_self: list
    cross: list
    logits: jnp.ndarray


def _attention_block(block, x, attend, values_in=None):
    """Run one residual attention block of the model on x [B, Q, D], recording it.

    block: the layer's `Residual`; attend: h -> (output, weights) with weights returned.
    Returns (block output [B, Q, D], BlockTrace)."""
    seen = {}

    def sublayer(h):
        out, weights = attend(h)
        seen.update(h=h, out=out, weights=weights)
        return out, weights

    y, _ = block(x, sublayer, None)
    values = seen["h"] if values_in is None else values_in
    trace = BlockTrace(x, values, seen["weights"], x + seen["out"])
    return y, trace


def _feed_forward(layer, x):
    y, _ = layer.feed_forward_block(x, lambda h: (layer.feed_forward(h, None), None), None)
    return y


def trace(model, src: jnp.ndarray, tgt_in: jnp.ndarray) -> Trace:
    """The teacher-forced pass of `model` (a `models.transformer.Transformer`, no dropout,
    no head mask, unpacked rows) through the model's own blocks, recording each attention
    block's input, value input, weights and pre-norm sum.

    src: int32 [B, S] (pad 0); tgt_in: int32 [B, T] (bos + tokens, pad 0).
    """
    src_valid, tgt_valid = src != PAD_ID, tgt_in != PAD_ID
    x = model.source_embed(src, jnp.arange(src.shape[1]))
    encoder = []
    for layer in model.encoder_layers:
        x, block = _attention_block(layer.attention_block, x, lambda h, layer=layer: layer.attention(
            h, src_valid, return_weights=True))
        encoder.append(block)
        x = _feed_forward(layer, x)
    memory = x if model.encoder_norm is None else model.encoder_norm(x)
    y = model.target_embed(tgt_in, jnp.arange(tgt_in.shape[1]))
    self_blocks, cross_blocks = [], []
    for layer, kv in zip(model.decoder_layers, model.cross_kv(memory, src_valid), strict=True):
        y, block = _attention_block(layer.self_block, y, lambda h, layer=layer: layer.self_attention(
            h, tgt_valid, return_weights=True))
        self_blocks.append(block)
        y, block = _attention_block(layer.cross_block, y, lambda h, layer=layer, kv=kv:
                                    layer.cross_attention(h, kv, return_weights=True), memory)
        cross_blocks.append(block)
        y = _feed_forward(layer, y)
    if model.decoder_norm is not None:
        y = model.decoder_norm(y)
    return Trace(encoder, self_blocks, cross_blocks, model.target_embed.logits(y))


def value_vectors(attention, values_in: jnp.ndarray) -> jnp.ndarray:
    """f_h(u_j) of every head and key: values_in [K, D_kv] -> float32 [H, K, D_out]
    (the value projection with its bias, then the head's rows of the output projection,
    without its bias)."""
    h, dv = attention.num_heads, attention.value_dim
    w_v = attention.value.kernel[...].astype(jnp.float32)  # [D_kv, H * Dv]
    w_o = attention.out.kernel[...].astype(jnp.float32)  # [H * Dv, D_out]
    v = values_in.astype(jnp.float32) @ w_v
    if attention.value.bias is not None:
        v = v + attention.value.bias[...].astype(jnp.float32)
    v = v.reshape(v.shape[0], h, dv)  # [K, H, Dv]
    return jnp.einsum("khv,hvd->hkd", v, w_o.reshape(h, dv, -1))


def block_measures(attention, norm, pre_ln: bool, block: BlockTrace, residual: str) -> dict:
    """The three per-block measures of one sentence (BlockTrace fields without B).

    attention: the block's `MultiHeadAttention`; norm: its `Residual.norm` (a LayerNorm);
    residual: "diagonal" (self-attention: x_i joins key i) or "column" (cross-attention:
    x_i is an extra summand after the K keys).
    Returns {"norm": [H, Q, K], "norm_resln": [Q, K'], "alti": [Q, K']} with K' = K
    ("diagonal") or K + 1 ("column", the residual last).
    """
    weights = block.weights.astype(jnp.float32)  # [H, Q, K]
    x = block.x.astype(jnp.float32)  # [Q, D]
    f = value_vectors(attention, block.values_in)  # [H, K, D]
    norm_map = weights * jnp.linalg.norm(f, axis=-1)[:, None, :]
    mixed = jnp.einsum("hqk,hkd->qkd", weights, f)  # [Q, K, D]
    # The summands a query row has: the keys it attends to and its residual. The others
    # are zero vectors whose ALTI is 0 but for rounding (the two L1 sums below reduce
    # in different orders), so they are masked to exactly 0.
    attended = (weights > 0).any(0)  # [Q, K]
    if residual == "diagonal":
        eye = jnp.eye(mixed.shape[0], mixed.shape[1], dtype=jnp.float32)
        summands = mixed + eye[:, :, None] * x[:, None, :]
        present = attended | (eye > 0)
    else:
        summands = jnp.concatenate([mixed, x[:, None, :]], axis=1)  # [Q, K + 1, D]
        present = jnp.concatenate([attended, jnp.ones_like(attended[:, :1])], axis=1)
    summed = block.summed.astype(jnp.float32)  # [Q, D]: the sum of the summands + b_o
    if pre_ln:
        resultant = summed
    else:  # the block's norm split over the summands, with the statistics of their sum
        centred = summed - summed.mean(-1, keepdims=True)
        inv_std = jax.lax.rsqrt((centred**2).mean(-1) + norm.epsilon)  # [Q]
        gamma = (jnp.ones(x.shape[-1], jnp.float32) if norm.scale is None
                 else norm.scale[...].astype(jnp.float32))
        summands = (gamma * (summands - summands.mean(-1, keepdims=True))
                    * inv_std[:, None, None])
        resultant = norm(summed).astype(jnp.float32)  # the block's own output
    closeness = (jnp.abs(resultant).sum(-1)[:, None]
                 - jnp.abs(resultant[:, None, :] - summands).sum(-1))  # [Q, K']
    alti = jnp.where(present, jnp.maximum(closeness, 0.0), 0.0)
    alti = alti / jnp.maximum(alti.sum(-1, keepdims=True), jnp.finfo(jnp.float32).tiny)
    return {"norm": norm_map, "norm_resln": jnp.linalg.norm(summands, axis=-1), "alti": alti}


def alti_rollout(encoder: list, decoder_self: list, cross: list) -> tuple[jnp.ndarray, jnp.ndarray]:
    """ALTI+ of one sentence from its per-block ALTI matrices.

    encoder: L_enc x [S, S]; decoder_self: L_dec x [T, T]; cross: L_dec x [T, S + 1]
    (the residual last). Returns (source [T, S], target [T, T]) of the last decoder layer.
    """
    s = cross[0].shape[-1] - 1
    r_enc = jnp.eye(s, dtype=jnp.float32)
    for c in encoder:
        r_enc = c @ r_enc
    source = target = None
    for c_self, c_cross in zip(decoder_self, cross, strict=True):
        j_src = c_cross[:, :s] @ r_enc  # [T, S]
        j_tgt = c_self * c_cross[:, s:]  # [T, T]: through the cross block's residual
        if source is None:
            source, target = j_src, j_tgt
        else:
            source, target = j_src + j_tgt @ source, j_tgt @ target
    return source, target


def _sentence(model, blocks: dict) -> dict:
    """Every measure of one sentence from its block traces (no batch axis)."""
    pre_ln = model.config.pre_ln
    modules = {
        "encoder_self": [(lay.attention, lay.attention_block.norm) for lay in model.encoder_layers],
        "decoder_self": [(lay.self_attention, lay.self_block.norm) for lay in model.decoder_layers],
        "cross": [(lay.cross_attention, lay.cross_block.norm) for lay in model.decoder_layers],
    }
    out, alti = {}, {}
    for kind, layers in modules.items():
        residual = "column" if kind == "cross" else "diagonal"
        per_layer = [block_measures(attn, norm, pre_ln, block, residual)
                     for (attn, norm), block in zip(layers, blocks[kind], strict=True)]
        out[f"norm_{kind}"] = jnp.stack([m["norm"] for m in per_layer])
        resln = jnp.stack([m["norm_resln"] for m in per_layer])
        if kind == "cross":
            out["norm_resln_cross"], out["norm_resln_cross_residual"] = resln[..., :-1], resln[..., -1]
        else:
            out[f"norm_resln_{kind}"] = resln
        alti[kind] = [m["alti"] for m in per_layer]
    out["alti_source"], out["alti_target"] = alti_rollout(alti["encoder_self"],
                                                          alti["decoder_self"], alti["cross"])
    out["source_share"] = out["alti_source"].sum(-1)
    return out


def cross_map(model, src: jnp.ndarray, tgt_in: jnp.ndarray, measure: str) -> jnp.ndarray:
    """What a word aligner reads under `measure`, shaped like the cross-attention weights
    [L_dec, B, H, T, S]: "norm" the norm-based maps; "alti" ALTI+'s source contributions
    `alti_source` on every layer and head (it has neither: any choice reads the same)."""
    c = contributions(model, src, tgt_in)
    if measure == "norm":
        return jnp.moveaxis(c["norm_cross"], 0, 1)
    if measure != "alti":
        raise ValueError(f"measure must be norm or alti here, got {measure!r}")
    layers, heads = len(model.decoder_layers), model.decoder_layers[0].cross_attention.num_heads
    source = c["alti_source"]  # [B, T, S]
    return jnp.broadcast_to(source[None, :, None], (layers, source.shape[0], heads,
                                                    *source.shape[1:]))


def contributions(model, src: jnp.ndarray, tgt_in: jnp.ndarray,
                  sentences_at_once: int = SENTENCES_AT_ONCE) -> dict:
    """Every contribution measure of a teacher-forced batch, batch axis first.

    src: int32 [B, S]; tgt_in: int32 [B, T]. Returns float32 arrays (the names of the map
    file, attention/mapfile.py):
      norm_encoder_self [B, L_enc, H, S, S], norm_decoder_self [B, L_dec, H, T, T],
      norm_cross [B, L_dec, H, T, S];
      norm_resln_encoder_self [B, L_enc, S, S], norm_resln_decoder_self [B, L_dec, T, T],
      norm_resln_cross [B, L_dec, T, S], norm_resln_cross_residual [B, L_dec, T];
      alti_source [B, T, S], alti_target [B, T, T], source_share [B, T].
    Padded rows and columns hold whatever the model computed there (the map file cuts them).
    """
    t = trace(model, src, tgt_in)
    # Batch first for lax.map: each BlockTrace field is [B, ...].
    blocks = {"encoder_self": t.encoder_self, "decoder_self": t.decoder_self, "cross": t.cross}
    return jax.lax.map(lambda b: _sentence(model, b), blocks,
                       batch_size=max(1, min(sentences_at_once, src.shape[0])))
