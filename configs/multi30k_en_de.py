"""Multi30k English -> German: the de->en recipe with the direction swapped."""

import ml_collections

from configs import multi30k_de_en


def get_config() -> ml_collections.ConfigDict:
    """Returns the Multi30k en->de experiment config."""
    config = multi30k_de_en.get_config()
    config.data.source_lang = "en"
    config.data.target_lang = "de"
    return config
