"""Multi30k German->English within 60 minutes on a 2-core CPU (target: >= 35 BLEU).

The Transformer-tiny of configs/multi30k_de_en.py, tuned for a short run: lighter
dropout (0.2), a smaller unigram vocabulary (6,000), a higher early learning rate
(3e-3 after 1,000 warmup steps), the finer length buckets of base.py (less padding,
which costs time on a CPU), greedy validation every 500 steps. Training stops after
`train.max_minutes` (about 2,000 steps, 9 epochs, on the development machine).

    python train.py --config configs/multi30k_de_en_cpu.py --workdir runs/de_en_cpu
"""

import ml_collections

from configs import multi30k_de_en


def get_config() -> ml_collections.ConfigDict:
    """Returns the CPU-budget Multi30k de->en config."""
    config = multi30k_de_en.get_config()
    config.data.vocab_size = 6000
    config.data.spm_model_type = "unigram"
    config.data.bucket_step = 8
    config.model.dropout = 0.2
    config.train.max_minutes = 60.0
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 1000
    config.eval.every_steps = 500
    config.eval.beam_size = 1
    config.eval.length_penalty = 0.6
    config.checkpoint.every_steps = 500
    return config
