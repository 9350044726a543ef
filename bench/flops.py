"""Model FLOPs of a training step of `models.transformer.Transformer` (for MFU).

FLOP formula (model FLOPs of one training step, forward + backward = 3 x forward,
counted on non-pad tokens only, so padding earns no credit):

    F_step = 6 * (P_src * N_src + P_tgt * N_tgt)
           + 12 * d_model * sum_i [ L_enc * S_i^2 + L_dec * (T_i^2 + T_i * S_i) ]

  P_src   matmul parameters applied to source tokens: every Linear kernel of the
          encoder, plus the key and value kernels of every decoder cross-attention
          (they project the encoder output);
  P_tgt   matmul parameters applied to target tokens: every other decoder Linear
          kernel (self-attention Q/K/V/O, cross-attention Q/O, feed-forward) plus the
          tied output projection (vocab x d_model); the embedding lookup is a gather,
          not a matmul, and is not counted; matmul_params = P_src + P_tgt;
  N_src, N_tgt  non-pad source / target (tgt_out: tokens + eos) tokens of the step;
  S_i, T_i      non-pad source / target length of pair i (sums run over the pairs);
  attention     per attention layer and query token, Q K^T and A V cost 2 * 2 * T_k *
          d_model FLOPs forward (T_k = keys attended: S_i for encoder self- and decoder
          cross-attention, T_i for decoder self-attention, full T_i^2 without halving
          for the causal mask); x 3 for forward + backward = 12 * d_model * T_k.
  Biases, layer norms, softmax, dropout, the loss and the optimizer are not counted,
  nor the embedding gradient written as a one-hot matmul on GPU (models/layers.py).
  When every N_src = N_tgt = N this is 6 * matmul_params * N + the attention terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data.tokenizer import PAD_ID

Batch = dict[str, np.ndarray]
FLOP_FORMULA = ("F_step = 6 * (P_src * N_src + P_tgt * N_tgt) + 12 * d_model * sum_i "
                "[L_enc * S_i^2 + L_dec * (T_i^2 + T_i * S_i)]; P_src = encoder Linear kernels "
                "+ decoder cross-attention key/value kernels, P_tgt = other decoder Linear "
                "kernels + tied output projection (vocab x d_model); N, S_i, T_i non-pad")



@dataclass(frozen=True)
class FlopCounter:
    """The model's matmul parameters split by the tokens they multiply (see docstring)."""

    src_params: int
    tgt_params: int
    d_model: int
    encoder_layers: int
    decoder_layers: int

    @property
    def matmul_params(self) -> int:
        return self.src_params + self.tgt_params

    def train_flops(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> float:
        """F_step of the module docstring for pairs of these source/target lengths."""
        s = np.asarray(src_lengths, np.float64)
        t = np.asarray(tgt_lengths, np.float64)
        dense = 6.0 * (self.src_params * s.sum() + self.tgt_params * t.sum())
        attention = 12.0 * self.d_model * np.sum(
            self.encoder_layers * s**2 + self.decoder_layers * (t**2 + t * s))
        return float(dense + attention)

    def batch_flops(self, batch: Batch) -> tuple[float, float]:
        """(F_step on the pairs' own lengths, F_step on the rows as computed) of one batch:
        padded rows count their full length, packed rows (data/packing.py) their full
        length too, attention included, while the first figure counts each pair alone."""
        src, tgt = batch["src"], batch["tgt_out"]
        real = self.train_flops(*pair_lengths(batch))
        rows = src.shape[0]
        padded = self.train_flops(np.full(rows, src.shape[1]), np.full(rows, tgt.shape[1]))
        return real, padded


def pair_lengths(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """Non-pad (source, target) lengths of every pair of a padded or packed batch."""
    if "src_segments" not in batch:
        return (np.count_nonzero(batch["src"] != PAD_ID, axis=1),
                np.count_nonzero(batch["tgt_out"] != PAD_ID, axis=1))
    src_seg, tgt_seg = batch["src_segments"], batch["tgt_segments"]
    pairs = [(r, k) for r in range(src_seg.shape[0]) for k in range(1, int(src_seg[r].max()) + 1)]
    return (np.array([np.count_nonzero(src_seg[r] == k) for r, k in pairs]),
            np.array([np.count_nonzero(tgt_seg[r] == k) for r, k in pairs]))


def count_matmul_params(model) -> FlopCounter:
    """Splits the Linear kernels of a `models.transformer.Transformer` into P_src / P_tgt
    and adds the tied output projection (the target embedding table) to P_tgt."""
    from flax import nnx

    src = tgt = 0
    for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = [str(p) for p in path]
        if names[-1] != "kernel":
            continue
        size = int(np.prod(value.shape))
        if names[0] == "encoder_layers" or (
                "cross_attention" in names and names[-2] in ("key", "value")):
            src += size
        elif names[0] == "decoder_layers":
            tgt += size
        else:
            raise ValueError(f"unexpected Linear kernel {'.'.join(names)}")
    tgt += int(np.prod(model.target_embed.tokens.embedding.shape))
    return FlopCounter(src, tgt, model.target_embed.d_model, len(model.encoder_layers),
                       len(model.decoder_layers))
