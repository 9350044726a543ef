"""Multi30k German->English within 60 minutes on a 2-core CPU, distilled from an ensemble.

configs/multi30k_de_en_cpu.py unchanged, trained on a teacher's translations instead of the
references (sequence-level knowledge distillation, Kim & Rush 2016: `data.distilled_mix =
"replace"`). The teacher is that recipe's three 2-core hours (seeds 0-2) as one ensemble,
beam 5, length penalty 1.0, translating the 29,000 training sources; its text ships in
data/multi30k/distilled/ (how it was made: the README there), so a run pays none of the
teacher's three hours of training and 21 minutes of decoding.

Expected: test_2016_flickr 42.39 ± 0.20 cased / 42.66 lc-tok BLEU, validation 44.09 ± 0.46
(mean of 3 seeds, 6,011 to 7,344 steps in the hour on 2-core AMD EPYC and Intel Xeon
machines; README table): +1.31 over the recipe on validation, +0.16 on test.
Cost: 60 minutes of training, as the recipe.

    python train.py --config configs/multi30k_de_en_cpu_kd.py --workdir runs/de_en_cpu_kd
    python evaluate.py --workdir runs/de_en_cpu_kd --split test --beam_size 5 --checkpoint last
"""

from pathlib import Path

import ml_collections

from configs import multi30k_de_en_cpu

TEACHER = Path(__file__).resolve().parents[1] / "data/multi30k/distilled/train.de_en_cpu_ens3.en.gz"


def get_config() -> ml_collections.ConfigDict:
    """Returns the distilled CPU-budget Multi30k de->en config."""
    config = multi30k_de_en_cpu.get_config()
    config.data.distilled_targets = str(TEACHER)
    config.data.distilled_mix = "replace"
    return config
