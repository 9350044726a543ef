"""Word alignment as a training plug-in (training/plugins.py): the alignment heads and
student trained beside translation, switched on by the `alignment` config group
(configs/alignment_group.py).

  * `AlignmentConfig`: the group, typed and checked;
  * `AlignmentTransformer`: the translation model plus the heads, under the top-level
    parameter names alignment_head, alignment_reverse and alignment_student (those of
    the checkpoints written when they lived in models/transformer.py);
  * `AlignmentPlugin`: their losses, gradient groups, and the teacher links' input file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from alignment.head import AlignmentHead, agreed_pair, agreement_log_likelihood, head_log_likelihood
from alignment.student import AlignmentStudent, link_teachers, log_posteriors, student_cross_entropy
from alignment.teacher_links import links_field, read_teacher_links, teacher_piece_links
from attention import segment_mask
from common.errors import UserError
from configs.alignment_group import GROUP
from configs.model import ModelConfig
from data.tokenizer import EOS_ID, PAD_ID
from models.transformer import Features, Transformer
from training.plugins import PLUGIN_KEY, Plugin

TEACHER_LINKS = "teacher_links"  # the batch field, and the fingerprint's name


@dataclasses.dataclass(frozen=True)
class AlignmentConfig:
    """The `alignment` group (configs/alignment_group.py documents each key); hashable, so
    the model keeps it as a static attribute."""

    jumps: bool = False
    attention_prior: bool = True
    reverse: bool = False
    student: bool = False
    prior_ramp_steps: int = 0
    agreement: float = 0.0
    agreement_start: int = 0
    teacher_links: str = ""

    @classmethod
    def from_config(cls, cfg: ml_collections.ConfigDict) -> AlignmentConfig:
        """The group of the experiment config `cfg`, checked with the data settings it
        depends on; UserError naming the key."""
        values = {k: v for k, v in cfg[GROUP].items() if k != PLUGIN_KEY}
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UserError(f"unknown {GROUP} config key(s): {', '.join(unknown)}")
        config = cls(**values)
        config.check(cfg.data)
        return config

    def check(self, data: ml_collections.ConfigDict) -> None:
        """Refuses settings that contradict each other or the `data` group."""
        for name in ("prior_ramp_steps", "agreement", "agreement_start"):
            if getattr(self, name) < 0:
                raise UserError(f"{GROUP}.{name} must be at least 0, got {getattr(self, name)}")
        needs = [
            (not self.attention_prior and not self.jumps, "alignment.attention_prior=False "
             "needs alignment.jumps=True (without either the head's prior is uniform: IBM "
             "model 1)"),
            (self.reverse and not self.jumps, "alignment.reverse needs alignment.jumps=True "
             "(the reverse head is an HMM moved by jump biases)"),
            (self.student and not self.reverse, "alignment.student needs alignment.reverse=True "
             "(it reads both heads' lexical tables, and without alignment.teacher_links they "
             "teach it)"),
            (self.teacher_links and not self.student, "alignment.teacher_links teaches the "
             "alignment student: set alignment.student=True"),
            (self.teacher_links and (data.spm_sampling_alpha or data.pack_length),
             "alignment.teacher_links needs data.spm_sampling_alpha=0 and data.pack_length=0 "
             "(the links are mapped onto each pair's one segmentation, one pair per row)"),
            (self.agreement and not self.reverse, "alignment.agreement needs "
             "alignment.reverse=True (the agreement is between the head and its reverse twin)"),
            (self.jumps and data.pack_length, "alignment.jumps needs data.pack_length=0: its "
             "chain would run across the pairs packed into one row"),
        ]
        for bad, message in needs:
            if bad:
                raise UserError(message)


class AlignmentTransformer(Transformer):
    """The translation model with the word-alignment heads (alignment/head.py) and student
    (alignment/student.py) beside it, on stop-gradient inputs.

    Args:
      config: the model config (configs/model.py).
      alignment: which heads, `AlignmentConfig`.
    """

    def __init__(self, config: ModelConfig, alignment: AlignmentConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.alignment = alignment
        # The word-alignment mixture (alignment/head.py), trained beside translation ...
        self.alignment_head = AlignmentHead(config, rngs=rngs, jumps=alignment.jumps,
                                            attention_prior=alignment.attention_prior)
        # ... and its twin of the other direction (target -> source), alignment.reverse ...
        self.alignment_reverse = (AlignmentHead(config, rngs=rngs, reverse=True,
                                                jumps=alignment.jumps)
                                  if alignment.reverse else None)
        # ... and the context-aware layer the two teach (alignment/student.py).
        self.alignment_student = (AlignmentStudent(config, rngs=rngs)
                                  if alignment.student else None)

    def alignment_terms(self, features: Features, src, tgt_out, *, src_segments=None,
                        tgt_segments=None, prior_weight: float | jnp.ndarray = 1.0):
        """The heads' and the student's outputs over one translation pass.

        features: `Transformer.features` of (src int32 [B, S], tgt_in); tgt_out: int32
        [B, T], the pieces the decoder rows predict; src_segments int32 [B, S],
        tgt_segments int32 [B, T] of packed rows, or None; prior_weight as in
        `alignment.head.head_log_likelihood` (1: the model's own). Returns (the head's
        log p(y_j | x, y_<j) float32 [B, T] (rows past a target's end are to be weighted
        0), with alignment.reverse the reverse head's log p(x_i | y, x_<i) float32 [B, S]
        (rows past a source's end to be weighted 0; else None), the terms:
        "alignment_log_prior" log a(i | x, y_<j) and "alignment_log_lexical"
        log t(y_j | x_i), float32 [B, T, S] (NEG_INF where masked; kept in logs, so a
        posterior that weights the prior differently is read without underflow), with
        alignment.jumps "alignment_transition_bias" [B, S + 1, S]
        (`AlignmentHead.transition_bias`), and the reverse head's the same with
        "alignment_reverse_" names, rows and columns swapped ([B, S, T] and [B, T + 1, T];
        the target's `</s>` its NULL word), and with alignment.student
        "alignment_student_log_posterior" [B, T, S] and
        "alignment_student_reverse_log_posterior" [B, S, T], its scores read both ways
        (alignment/student.py)).
        """
        memory, src_valid, states = features.memory, features.src_valid, features.states
        if src_segments is None:
            mask = jnp.broadcast_to(src_valid[:, None, :], (*tgt_out.shape, src.shape[1]))
        else:
            mask = segment_mask(tgt_segments, src_segments)[:, 0]
        rows = self.source_embed.tokens.embedding[...][src] * self.source_embed.d_model**0.5
        head = self.alignment_head
        log_prior, log_lexical = head.log_terms(states, memory, rows, tgt_out, mask)
        bias = head.transition_bias(src == EOS_ID)  # None for the mixture
        log_likelihood = head_log_likelihood(log_prior, log_lexical, mask, bias, prior_weight)
        terms = {"alignment_log_prior": log_prior, "alignment_log_lexical": log_lexical,
                 **({} if bias is None else {"alignment_transition_bias": bias})}
        reverse_log_likelihood = None
        target_rows = (self.target_embed.tokens.embedding[...][tgt_out]
                       * self.target_embed.d_model**0.5)
        if self.alignment_reverse is not None:  # the same, target -> source
            reverse = self.alignment_reverse
            reverse_mask = jnp.broadcast_to((tgt_out != PAD_ID)[:, None, :],
                                            (*src.shape, tgt_out.shape[1]))
            r_prior, r_lexical = reverse.log_terms(None, None, target_rows, src, reverse_mask)
            r_bias = reverse.transition_bias(tgt_out == EOS_ID)
            reverse_log_likelihood = head_log_likelihood(r_prior, r_lexical, reverse_mask,
                                                          r_bias, prior_weight)
            terms.update(alignment_reverse_log_prior=r_prior,
                         alignment_reverse_log_lexical=r_lexical,
                         alignment_reverse_transition_bias=r_bias)
        if self.alignment_student is not None:  # its scores read both ways
            scores = self.alignment_student(states, target_rows, memory, rows, log_lexical,
                                            terms["alignment_reverse_log_lexical"], src_valid,
                                            tgt_out != PAD_ID)
            forward, backward = log_posteriors(scores, src_valid, tgt_out != PAD_ID)
            terms.update(alignment_student_log_posterior=forward,
                         alignment_student_reverse_log_posterior=backward)
        return log_likelihood, reverse_log_likelihood, terms

    def forward_with_alignment(self, src, tgt_in, tgt_out, *, src_segments=None,
                               tgt_segments=None, src_positions=None, tgt_positions=None,
                               dropout_rng=None, return_weights: bool = False,
                               prior_weight: float | jnp.ndarray = 1.0):
        """The training pass plus the alignment terms (`alignment_terms`).

        src: int32 [B, S]; tgt_in, tgt_out: int32 [B, T] (decoder input and the pieces its
        rows predict); packing arguments as in `__call__`. Returns (logits float32
        [B, T, V], the head's log-likelihood [B, T], the reverse head's [B, S] or None,
        the weights of `__call__` with return_weights (else none) plus the terms).
        """
        features = self.features(src, tgt_in, src_segments=src_segments,
                                 tgt_segments=tgt_segments, src_positions=src_positions,
                                 tgt_positions=tgt_positions, dropout_rng=dropout_rng,
                                 return_weights=return_weights)
        log_likelihood, reverse_log_likelihood, terms = self.alignment_terms(
            features, src, tgt_out, src_segments=src_segments, tgt_segments=tgt_segments,
            prior_weight=prior_weight)
        weights = {**features.weights, **terms} if return_weights else terms
        return (self.target_embed.logits(features.states), log_likelihood,
                reverse_log_likelihood, weights)


class AlignmentPlugin(Plugin):
    """The heads' training (module docstring): their negative log-likelihoods, the
    agreement term and the student's cross-entropies added to the loss."""

    # The heads' gradients never shrink translation's update (their inputs are
    # stop-gradient, so translation trains exactly as without them), translation's never
    # shrink theirs, and the student never changes how its teachers train.
    param_groups = (("alignment_head", "alignment_reverse"), ("alignment_student",))
    # The heads are part of the model; the links its student was taught.
    locked_on_resume = tuple(f"{GROUP}.{key}" for key in (
        PLUGIN_KEY, "jumps", "attention_prior", "reverse", "student", "teacher_links"))

    def __init__(self, config: AlignmentConfig):
        self.config = config
        self.word_links = None  # read_inputs' links, for batch_fields

    def build_model(self, config: ModelConfig, rngs: nnx.Rngs) -> AlignmentTransformer:
        return AlignmentTransformer(config, self.config, rngs=rngs)

    def read_inputs(self, pairs: int) -> dict[str, str]:
        if not self.config.teacher_links:
            return {}
        self.word_links, sha256 = read_teacher_links(self.config.teacher_links, pairs)
        return {TEACHER_LINKS: sha256}

    def batch_fields(self, tokenizer, source_ids, target_ids,
                     dropped: int) -> dict[str, Callable]:
        if self.word_links is None:
            return {}
        links = teacher_piece_links(self.word_links, tokenizer, source_ids, target_ids, dropped)
        return {TEACHER_LINKS: links_field(links)}

    def weights(self, step: jax.Array | int) -> tuple:
        """(the prior's weight, ramped 0 -> 1 over alignment.prior_ramp_steps; the agreement
        term's, alignment.agreement from alignment.agreement_start on) at 0-based `step`:
        floats where they are constant, else traced scalars."""
        c = self.config
        prior = jnp.minimum(1.0, step / c.prior_ramp_steps) if c.prior_ramp_steps else 1.0
        agreement = (jnp.where(step >= c.agreement_start, c.agreement, 0.0)
                     if c.agreement else 0.0)
        return prior, agreement

    def aux_losses(self, model: AlignmentTransformer, batch: dict, features: Features,
                   step: jax.Array | int) -> tuple[jax.Array, dict]:
        """The head's negative log-likelihood (and its reverse head's, over the source
        pieces), "align_nll_sum"; with alignment.agreement, that times the negative
        `alignment.head.agreement_log_likelihood` (the lexical tables trained on the links
        both heads agree on; "align_agreement_sum", one more forward-backward pass of each
        chain); with alignment.student the student's cross-entropies, its two readings
        against the two heads' agreed posteriors or, when the batch has "teacher_links"
        (uint8 [B, T, S]), against those links (`alignment.student.link_teachers`), weight
        1, "align_student_sum". Every input is stop-gradient: translation's gradient is as
        without them. Returns (their weighted sum, the sums)."""
        prior_weight, agreement_weight = self.weights(step)
        src, tgt_out = batch["src"], batch["tgt_out"]
        head_ll, reverse_ll, terms = model.alignment_terms(
            features, src, tgt_out, src_segments=batch.get("src_segments"),
            tgt_segments=batch.get("tgt_segments"), prior_weight=prior_weight)
        sums = {"align_nll_sum": -jnp.sum(head_ll * (tgt_out != PAD_ID))}
        if reverse_ll is not None:  # alignment.reverse: the source pieces' too
            sums["align_nll_sum"] -= jnp.sum(reverse_ll * (src != PAD_ID))
        total = sums["align_nll_sum"]
        agreement = reverse_ll is not None and (isinstance(agreement_weight, jax.Array)
                                                or bool(agreement_weight))
        student = terms.get("alignment_student_log_posterior")
        links = batch.get(TEACHER_LINKS) if student is not None else None
        agreed = (agreed_pair(terms, src, tgt_out, prior_weight)
                  if agreement or (student is not None and links is None) else None)
        if agreement:
            sums["align_agreement_sum"] = -agreement_log_likelihood(terms, src, tgt_out,
                                                                    agreed=agreed)
            total = total + agreement_weight * sums["align_agreement_sum"]
        if student is not None:  # taught by the links, else where the heads agree
            teachers = agreed if links is None else link_teachers(links, src, tgt_out)
            real_tgt, real_src = ((batch[k] != PAD_ID) & (batch[k] != EOS_ID)
                                  for k in ("tgt_out", "src"))
            sums["align_student_sum"] = (
                student_cross_entropy(student, teachers[0], real_tgt)
                + student_cross_entropy(terms["alignment_student_reverse_log_posterior"],
                                        teachers[1], real_src))
            total = total + sums["align_student_sum"]
        return total, sums


def make_plugin(cfg: ml_collections.ConfigDict) -> AlignmentPlugin:
    """The plug-in of an experiment config with the `alignment` group (training/plugins.py)."""
    return AlignmentPlugin(AlignmentConfig.from_config(cfg))
