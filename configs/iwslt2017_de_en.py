"""IWSLT 2017 German -> English (TED talks) from the Hugging Face hub; needs network.

`datasets` >= 4 no longer runs the dataset's loading script, so this reads the
hub's automatic Parquet export of it (revision "refs/convert/parquet"). Its
`translation` column ({"de": ..., "en": ...}) is what data/corpora.py expects.

Expected result and cost: not measured here (no network). It trains a 6+6-layer,
d_model 512 model for 50,000 updates of 8,192 tokens: a GPU recipe.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
    """Returns the IWSLT 2017 de->en experiment config."""
    config = base.get_config()
    config.data.dataset = "hf"
    config.data.hf_name = "IWSLT/iwslt2017"
    config.data.hf_config = "iwslt2017-de-en"
    config.data.hf_revision = "refs/convert/parquet"
    config.data.source_lang = "de"
    config.data.target_lang = "en"
    config.data.vocab_size = 10000

    config.model.d_model = 512
    config.model.num_heads = 8
    config.model.num_encoder_layers = 6
    config.model.num_decoder_layers = 6
    config.model.d_ff = 1024
    config.model.dropout = 0.3

    config.train.num_steps = 50000
    config.train.batch_tokens = 8192
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 4000
    config.eval.every_steps = 2500
    config.eval.beam_size = 4
    config.checkpoint.every_steps = 2500
    return config
