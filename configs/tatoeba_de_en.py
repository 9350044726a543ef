"""Tatoeba German -> English from a local manythings.org file.

Reads `data.path` (default `deu-eng.zip` in the current directory; the `deu.txt`
inside it works too). Validation and test are 2,000 pairs each, drawn with a
fixed seed (data/corpora.py):
  python train.py --config configs/tatoeba_de_en.py --workdir runs/tatoeba \\
      --config.data.path=/path/to/deu-eng.zip

Expected result and cost: not measured here (the corpus is not provided); 30,000
updates of base.py's model.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
    """Returns the Tatoeba de->en experiment config."""
    config = base.get_config()
    config.data.dataset = "tatoeba"
    config.data.path = "deu-eng.zip"
    config.data.source_lang = "de"
    config.data.target_lang = "en"
    config.data.valid_size = 2000
    config.data.test_size = 2000
    config.data.vocab_size = 8000

    config.train.num_steps = 30000
    config.train.warmup_steps = 4000
    config.eval.every_steps = 2000
    config.eval.max_sentences = 1000  # validate on a subset; test uses all
    config.checkpoint.every_steps = 2000
    return config
