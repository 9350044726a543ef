"""Smoke test: a tiny model on 2,000 Multi30k pairs; runs in seconds on CPU.

Used by the end-to-end tests. It learns next to nothing; it only exercises
training, evaluation, checkpointing, resume and attention-map saving.

Expected: nothing worth reading. Cost: 40 steps, seconds on a CPU.
"""

import ml_collections

from configs import alignment_group, base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    """Returns the smoke-test config; `variant` "align" adds the alignment group."""
    if variant not in ("", "align"):
        raise ValueError(f"variant must be '' or 'align', got {variant!r}")
    config = base.get_config()
    config.data.dataset = "multi30k"
    config.data.source_lang = "de"
    config.data.target_lang = "en"
    config.data.max_train_sentences = 2000
    config.data.vocab_size = 200  # small enough for 2,000 pairs of text
    config.data.max_length = 64
    config.data.bucket_step = 16  # few shapes: fewer compilations

    config.model.d_model = 32
    config.model.num_heads = 2
    config.model.num_encoder_layers = 1
    config.model.num_decoder_layers = 1
    config.model.d_ff = 64
    config.model.dropout = 0.1

    config.train.num_steps = 40
    config.train.batch_tokens = 512
    config.train.warmup_steps = 10
    config.train.log_every_steps = 10

    config.eval.every_steps = 20
    config.eval.batch_size = 64
    config.eval.max_sentences = 32

    config.checkpoint.every_steps = 20
    config.checkpoint.keep = 2

    config.attention_maps.num_examples = 1
    # The maps are saved; drawing their PNGs would cost a smoke run a third of its CPU
    # (tests/test_previews.py trains one that draws them).
    config.attention_maps.previews = False
    if variant == "align":
        config.alignment = alignment_group.get_group()
    return config
