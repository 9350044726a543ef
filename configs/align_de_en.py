"""Word alignment of German-English: a translation model trained for its
cross-attention, on the Multi30k training pairs plus the bitext to align, here the 508
RWTH gold sentence pairs *without their links* (as fast_align / eflomal / GIZA++
evaluations add the test bitext); the gold links only score (`python -m attention.align
--gold`).

Make the training files once: Multi30k raw text, then the pairs to align repeated
10 times (Europarl sentences among 29k image captions: repeated, they are 15% of
the text, so the tokenizer keeps their words whole -- 1.40 / 1.32 pieces per German /
English gold word against 2.05 / 1.79 when added once -- and the model learns their
vocabulary):

    mkdir -p runs/align_data
    (zcat data/multi30k/train.de.gz; for i in $(seq 10); do sed 's/ ||| .*//' ../shared/data/alignment/de-en/test.de-en; done) > runs/align_data/train.de
    (zcat data/multi30k/train.en.gz; for i in $(seq 10); do sed 's/.* ||| //' ../shared/data/alignment/de-en/test.de-en; done) > runs/align_data/train.en

then eflomal's links of that text, the alignment student's teacher (needs eflomal, the
`bench` extra; 20 s), then train (one run models both directions: the alignment head and
its reverse twin, and the student) and select the reading on the first 100 gold pairs:

    python -m attention.teacher_links --source runs/align_data/train.de \
        --target runs/align_data/train.en --source_lang de --target_lang en \
        > runs/align_data/train.links
    python train.py --config configs/align_de_en.py --workdir runs/align_de_en_links
    python -m attention.align --workdir runs/align_de_en_links --select \
        --pairs ../shared/data/alignment/de-en/test.de-en \
        --gold ../shared/data/alignment/de-en/gold.talp

(`:en-de` swaps the sides, for a run of the other direction, `--reverse_workdir`.)

Another language pair is the same recipe with `:<source>-<target>` (nothing in it is
German-specific): its files go to `data_folder` (`runs/align_data_<a>-<b>`, the codes
sorted). French-English, say, with a `fr ||| en` bitext PAIRS to align and Multi30k's
French and English text beside it (repeat the pairs so that they are a tenth or more of
the text):

    D=runs/align_data_en-fr; mkdir -p $D
    (zcat data/multi30k/train.fr.gz; for i in $(seq 10); do sed 's/ ||| .*//' PAIRS; done) > $D/train.fr
    (zcat data/multi30k/train.en.gz; for i in $(seq 10); do sed 's/.* ||| //' PAIRS; done) > $D/train.en
    python -m attention.teacher_links --source $D/train.fr --target $D/train.en \
        --source_lang fr --target_lang en > $D/train.links
    python train.py --config configs/align_de_en.py:fr-en --workdir runs/align_fr_en
    python -m attention.align --workdir runs/align_fr_en --pairs PAIRS > links.txt

A pair that Multi30k lacks validates on `valid.<code>` files made beside the training
ones (the first 200 pairs, say: `head -200 PAIRS | sed 's/ ||| .*//' > $D/valid.ro`).
Without a `--select` of its own (no gold links to choose on), the command reads the two
heads' and the student's joint posteriors the way the German-English runs selected
(`alignment.aligner.JOINT_READING`).

The model is the CPU recipe's Transformer-tiny with room for Europarl-length sentences
(max_length 160), a case-folding 8,000-piece vocabulary, and the alignment plug-in
(alignment/plugin.py): an HMM head and its reverse twin trained to agree, and a student
layer taught eflomal's links; docs/alignment.md describes each part and how it was chosen.

Expected: 32.4 AER on the 508 RWTH gold pairs at step 1,500 (eflomal 35.5 on the same
text; docs/alignment.md). Cost: about 2 s per step on a 2-core CPU, an hour to 1,600
steps (the curve is nearly flat after 1,000); the same command resumes.
"""

import re

import ml_collections

from configs import alignment_group, multi30k_de_en
from configs.base import MULTI30K_LANGS

DATA = "runs/align_data"  # German-English; another pair's files go to DATA + "_<a>-<b>"
MULTI30K = "data/multi30k"  # validation on Multi30k's when it has both sides


def data_folder(source: str, target: str) -> str:
    """Where the training (and, outside Multi30k, validation) files of a pair are made:
    DATA for German-English (its runs were made there), else DATA_<a>-<b>, the two
    codes sorted (one folder for both directions)."""
    a, b = sorted((source, target))
    return DATA if (a, b) == ("de", "en") else f"{DATA}_{a}-{b}"


def get_config(direction: str = "de-en") -> ml_collections.ConfigDict:
    """The alignment config of `direction`: "de-en" (default), "en-de", or any
    "<source>-<target>" of two language codes (the files of `data_folder`)."""
    if not re.fullmatch(r"[a-z]{2,3}-[a-z]{2,3}", direction) or len(set(direction.split("-"))) < 2:
        raise ValueError(f"direction must be two language codes like 'de-en' or 'fr-en', "
                         f"got {direction!r}")
    source, target = direction.split("-")
    data = data_folder(source, target)
    config = multi30k_de_en.get_config()  # its Transformer-tiny (4+4 layers, d_model 128)
    config.data.dataset = "text"
    config.data.source_lang, config.data.target_lang = source, target
    config.data.train_source, config.data.train_target = (f"{data}/train.{source}",
                                                          f"{data}/train.{target}")
    if source in MULTI30K_LANGS and target in MULTI30K_LANGS:
        valid = (f"{MULTI30K}/val.{source}.gz", f"{MULTI30K}/val.{target}.gz")
    else:  # made beside the training files (the module docstring)
        valid = (f"{data}/valid.{source}", f"{data}/valid.{target}")
    config.data.valid_source, config.data.valid_target = valid
    config.data.test_source, config.data.test_target = config.data.valid_source, \
        config.data.valid_target
    config.data.max_length = 160
    config.data.vocab_size = 8000
    config.data.spm_normalization = "nmt_nfkc_cf"  # lowercase, as statistical aligners train
    config.data.spm_model_type = "unigram"
    config.data.bucket_step = 8  # the finer buckets: less padding, which costs on a CPU
    # Padded buckets, one pair a row: the jumps and the teacher's links are per pair.
    config.data.pack_length = 0
    config.train.batch_tokens = 4096
    config.model.dropout = 0.2
    # The posterior aligner (alignment/head.py, configs/alignment_group.py) ...
    config.alignment = alignment = alignment_group.get_group()
    alignment.jumps = True  # ... an HMM (jump-width biases) ...
    alignment.attention_prior = False  # ... moved by those alone ...
    alignment.reverse = True  # ... with its twin of the other direction
    alignment.student = True  # ... and a layer taught eflomal's links
    alignment.teacher_links = f"{data}/train.links"
    alignment.prior_ramp_steps = 500  # IBM model 1 first, the jumps ramped in
    alignment.agreement = 1.0  # ... then the two heads trained to agree ...
    alignment.agreement_start = 500  # ... on HMM posteriors: from the ramp's end
    # A step budget, resumable across sessions (no time-budget cosine), with the CPU
    # recipe's (configs/multi30k_de_en_cpu.py) learning rate and warmup.
    config.train.num_steps = 8000
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 1000
    config.eval.every_steps = 1000
    config.eval.beam_size = 1
    config.eval.length_penalty = 1.0
    config.checkpoint.every_steps = 250  # a session cut off loses little
    config.checkpoint.keep = 3
    return config
