"""Multi30k German -> English, the README default; sized for a 2-core CPU.

A 3+3-layer Transformer (d_model 256, 4 heads, d_ff 1024) on a joint 8k
SentencePiece vocabulary.
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
    config.data.vocab_size = 8000

    config.model.d_model = 256
    config.model.num_heads = 4
    config.model.num_encoder_layers = 3
    config.model.num_decoder_layers = 3
    config.model.d_ff = 1024
    config.model.dropout = 0.1

    # About 150 steps per epoch at 4096 tokens: 10k steps is ~65 epochs.
    config.train.num_steps = 10000
    config.train.batch_tokens = 4096
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 2000
    config.train.label_smoothing = 0.1

    config.eval.every_steps = 1000
    config.checkpoint.every_steps = 1000
    return config
