"""Multi30k English -> French with Transformer-tiny.

4+4 layers, d_model 128, 4 heads, d_ff 256 and heavy dropout (0.3): the small,
strongly regularized model that does best on this 29k-pair corpus.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
    """Returns the Multi30k en->fr experiment config."""
    config = base.get_config()
    config.data.dataset = "multi30k"
    config.data.source_lang = "en"
    config.data.target_lang = "fr"
    config.data.vocab_size = 8000

    config.model.d_model = 128
    config.model.num_heads = 4
    config.model.num_encoder_layers = 4
    config.model.num_decoder_layers = 4
    config.model.d_ff = 256
    config.model.dropout = 0.3

    config.train.num_steps = 8000
    config.train.batch_tokens = 4096
    config.train.learning_rate = 0.005
    config.train.warmup_steps = 2000
    config.train.label_smoothing = 0.1

    config.eval.every_steps = 1000
    config.checkpoint.every_steps = 1000
    return config
