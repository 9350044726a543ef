"""Reranking an n-best list with a reverse model: the direct model's score plus a weight
times the channel score, log p(source | candidate), of a model trained the other way
(Li & Jurafsky 2016's mutual-information reranking; the "channel" term of Yee et al.
2019's noisy-channel reranking, without its language model).

Both terms are GNMT-normalised as beam search normalises (models/beam_search.py):

    direct(y)  = log p(y | x) / gnmt_penalty(|y| + 1, alpha)  (beam search's own score)
    channel(y) = log p(x | y) / gnmt_penalty(|x| + 1, alpha)
    score(y)   = direct(y) + weight * channel(y)

so weight 0 keeps beam search's answer, and the channel's scale does not grow with the
source's length. The direct term is the search's own score; the channel's log-prob comes
from teacher forcing (`models.translate.sequence_log_probs`). The candidate with the
highest score wins, the better-ranked one on a tie.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.errors import UserError


def rerank_select(direct: list[np.ndarray], channel: list[np.ndarray], weight: float) -> list[int]:
    """Per sentence, the index of the highest `direct + weight * channel` (the earlier on a
    tie; an empty list gives -1). direct, channel: per sentence, float [K] per candidate."""
    chosen = []
    for d, c in zip(direct, channel, strict=True):
        total = np.asarray(d, np.float64) + weight * np.asarray(c, np.float64)
        chosen.append(int(np.argmax(total)) if len(total) else -1)  # argmax: the first maximum
    return chosen


def check_reverse(forward_cfg, reverse_cfg, reverse_workdir: Path) -> None:
    """UserError unless the reverse run translates the forward run's target language into
    its source language."""
    want = (forward_cfg.data.target_lang, forward_cfg.data.source_lang)
    got = (reverse_cfg.data.source_lang, reverse_cfg.data.target_lang)
    if got != want:
        raise UserError(f"--reverse_workdir {reverse_workdir} translates {got[0]}->{got[1]}; "
                        f"the reverse of the run is {want[0]}->{want[1]}")


def channel_scores(reverse, sources: list[str], candidates: list[list[str]], *, alpha: float,
                   batch_size: int, bucket_step: int) -> list[np.ndarray]:
    """Per sentence, float [K]: channel(y) of each candidate (module docstring).

    reverse: (model, tokenizer) of the reverse run, which reads the candidates as its
    source and scores the sentence's source line as its target.
    """
    from models.beam_search import gnmt_penalty
    from models.translate import sequence_log_probs

    model, tokenizer = reverse
    owner = [i for i, c in enumerate(candidates) for _ in c]  # the sentence of each candidate
    back_src = tokenizer.encode_source([text for c in candidates for text in c])
    back_tgt = tokenizer.encode_target(sources)
    channel = sequence_log_probs(model, back_src, [back_tgt[i] for i in owner],
                                 batch_size=batch_size, bucket_step=bucket_step)
    channel = channel / np.asarray(gnmt_penalty(np.array([len(back_tgt[i]) + 1 for i in owner]),
                                                alpha), np.float64)
    bounds = np.cumsum([0, *(len(c) for c in candidates)])
    return [channel[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
