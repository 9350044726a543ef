"""Multi30k German->English, the README default: the CPU-budget recipe.

A Transformer-tiny-sized model (4+4 layers, d_model 128, 4 heads, d_ff 256) with a
small joint SentencePiece vocabulary, sized so that 60 minutes of training on a
2-core CPU covers ~20 epochs of Multi30k (SPEC §6: >= 35 BLEU on test_2016 within
60 minutes). Training stops at `train.max_minutes`; raise it (or set it to 0) and
`train.num_steps` on faster hardware.

    python train.py --config configs/multi30k_de_en.py --workdir runs/de_en
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
    """Returns the Multi30k de->en experiment config."""
    config = base.get_config()
    config.data.dataset = "multi30k"
    config.data.source_lang = "de"
    config.data.target_lang = "en"
    config.data.vocab_size = 6000

    config.model.d_model = 128
    config.model.num_heads = 4
    config.model.num_encoder_layers = 4
    config.model.num_decoder_layers = 4
    config.model.d_ff = 256
    config.model.dropout = 0.2

    config.train.num_steps = 8000
    config.train.max_minutes = 60.0
    config.train.batch_tokens = 4096
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 1000
    config.train.label_smoothing = 0.1

    config.eval.every_steps = 500
    config.checkpoint.every_steps = 500
    config.checkpoint.keep = 10  # evaluate.py --average_last 10
    return config
