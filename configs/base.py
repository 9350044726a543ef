"""Defaults shared by every experiment; each experiment file starts from here.

A recipe may add a plug-in's group beside these (training/plugins.py: a group whose
`plugin` key names the module that trains it); the base config has none.

Every field has a fixed type (ml_collections checks overrides against it), so
unset strings are "" and "off" numbers are 0, never None.

Override any field on the command line:
  python train.py --config configs/multi30k_de_en.py --config.model.d_model=512
"""

import ml_collections

# data.dataset values; each has a loader in data/corpora.py.
DATASETS = ("multi30k", "tatoeba", "text", "hf")
# The languages of the vendored Multi30k (data/multi30k/), data.source_lang / target_lang.
MULTI30K_LANGS = ("de", "en", "fr")
# SentencePiece normalisation rules offered (data.spm_normalization); the first is its default.
NORMALIZATIONS = ("nmt_nfkc", "nmt_nfkc_cf")
# data.text_protocol values (data/protocol.py): the text trained on and scored. "raw" is the
# corpus as released; "lc_norm_tok" the Multi30k literature's lowercased,
# punctuation-normalised, Moses-tokenised text.
TEXT_PROTOCOLS = ("raw", "lc_norm_tok")
# train.schedule values (training/step.py); after a linear warmup in each case.
SCHEDULES = ("inverse_sqrt", "cosine", "constant", "cosine_budget")
# train.patience_metric values: the validation figure patience and "best" follow.
PATIENCE_METRICS = ("bleu", "loss")


def get_config() -> ml_collections.ConfigDict:
    """Returns the base config with groups data, model, train, eval,
    attention_maps and checkpoint."""
    config = ml_collections.ConfigDict()

    config.data = data = ml_collections.ConfigDict()
    data.dataset = "multi30k"  # multi30k | tatoeba | text | hf (data/corpora.py)
    data.source_lang = "de"
    data.target_lang = "en"
    data.data_dir = ""  # multi30k: folder of the .gz files ("" = data/multi30k/)
    data.path = ""  # tatoeba: deu-eng.zip or deu.txt
    data.valid_size = 2000  # tatoeba: held-out pairs (fixed-seed split)
    data.test_size = 2000
    data.train_source = ""  # text: parallel files, plain or .gz
    data.train_target = ""
    data.valid_source = ""
    data.valid_target = ""
    data.test_source = ""
    data.test_target = ""
    data.hf_name = ""  # hf: datasets.load_dataset(hf_name, hf_config, ...)
    data.hf_config = ""
    data.hf_revision = ""
    data.hf_data_files = ""  # "path" or "train=a.jsonl,validation=b.jsonl,test=c.jsonl"
    data.hf_cache_dir = ""
    # The training split encoded once into memory-mapped ids, reused by resumes and by
    # every run on the same data (data/cache.py); "" = $XDG_CACHE_HOME/attnmt/data.
    data.cache_dir = ""
    data.max_train_sentences = 0  # keep only the first N training pairs (0 = all)
    # Sequence-level knowledge distillation (data/corpora.py `with_distilled`): a teacher's
    # translation of every training source, one per line (evaluate.py --source on the
    # training source file writes it); "replace" trains on the teacher's targets, "add" on
    # the original pairs and the teacher's. "" = off.
    data.distilled_targets = ""
    data.distilled_mix = "replace"  # replace | add
    # raw | lc_norm_tok: what the tokenizer trains on, the model translates and BLEU scores
    # (data/protocol.py); Multi30k reads its official lc.norm.tok files (data/multi30k/tok/),
    # other datasets pass through sacremoses (lowercase, normalise punctuation, tokenise).
    data.text_protocol = "raw"
    data.vocab_size = 8000
    data.joint_vocab = True  # one SentencePiece model for both sides
    data.spm_model_type = "unigram"  # unigram | bpe
    data.character_coverage = 1.0
    # nmt_nfkc_cf also case-folds every text the tokenizer encodes (output is lowercase)
    data.spm_normalization = "nmt_nfkc"  # nmt_nfkc | nmt_nfkc_cf
    data.spm_max_sentences = 300_000  # tokenizer trained on a sample of at most this
    data.max_length = 128  # training pairs longer than this (incl. eos) ...
    data.long_pairs = "drop"  # ... are dropped, or "truncate"d; eval never truncates
    data.bucket_step = 8  # padded lengths are multiples of this
    # Subword regularisation of the training side (data/sampling.py), seeded from
    # (train.seed, epoch); 0 = off; eval keeps the best segmentation. Unigram models draw
    # every pair's segmentation from its n best with probability ~ P^alpha (Kudo 2018); BPE
    # models skip each merge with probability alpha (BPE-dropout, Provilkov et al. 2020).
    data.spm_sampling_alpha = 0.0  # unigram: 0.1 to 0.5 in Kudo's paper; BPE: 0.1 in theirs
    data.spm_nbest_size = 16  # l, the segmentations drawn from (2 to 64; unigram only)
    # Training: 0 = padded length buckets (one train program per bucket); L > 0 = every
    # batch one packed shape, rows of max(L, longest pair) positions, batch_tokens // L of
    # them (data/packing.py): one train program, but a batch then holds ~0.93 instead of
    # ~0.66 real tokens per position, so matching a padded recipe's update takes fewer
    # batch_tokens (bench/README.md, "One packed shape").
    data.pack_length = 0

    config.model = model = ml_collections.ConfigDict()
    model.d_model = 256
    model.num_heads = 4
    model.num_encoder_layers = 3
    model.num_decoder_layers = 3
    model.d_ff = 1024
    model.dropout = 0.1
    model.attention_dropout = 0.0
    model.activation = "relu"
    model.pre_ln = True
    model.kernel_init = "lecun_normal"  # lecun_normal (Flax) | xavier_uniform (fairseq)
    model.positions = "sinusoidal"  # sinusoidal | learned
    model.max_positions = 1024  # learned positions only: longest sequence
    model.share_embeddings = True
    model.dtype = "float32"
    model.param_dtype = "float32"
    model.attention_impl = "auto"
    model.embedding_grad = "auto"  # configs/model.py documents every model field

    config.train = train = ml_collections.ConfigDict()
    train.num_steps = 20000
    train.batch_tokens = 4096  # per step, all devices together
    train.learning_rate = 1e-3  # peak, reached at the end of warmup
    train.warmup_steps = 4000
    # inverse_sqrt | cosine (to 1% at num_steps) | constant | cosine_budget (to 1% when
    # max_minutes runs out, whatever step that is: for time-budgeted recipes)
    train.schedule = "inverse_sqrt"
    train.weight_decay = 0.0
    train.grad_clip = 1.0
    train.adam_b1 = 0.9
    train.adam_b2 = 0.98
    train.adam_eps = 1e-9  # fairseq's Adam: 1e-8
    # Adam's moments as one vector each, the parameters raveled (training/step.py
    # `flat_adamw`): the same update, a train state of 179 arrays instead of 523 for the
    # tiny model, so each step's dispatch and each save handle fewer buffers. A checkpoint
    # holds one layout: a run keeps the value it started with.
    train.flat_optimizer = False
    train.seed = 0
    train.label_smoothing = 0.1
    # Micro-batches whose gradients make one update (1 = off): batch_tokens x this per
    # update. Every step count (num_steps, warmup_steps, every_steps) counts micro-batches.
    train.grad_accum_steps = 1
    # R-Drop (Liang et al. 2021): weight of the symmetric KL between two dropout passes of
    # each batch (0 = off; their IWSLT De-En setting is 5). Doubles a step's compute.
    train.rdrop_alpha = 0.0
    train.log_every_steps = 50
    train.patience = 0  # stop after this many validations without a better figure (0 = off)
    # The validation figure that patience and the "best" checkpoint follow: "bleu" (higher
    # is better) or "loss" (the label-smoothed loss per target token, lower is better:
    # fairseq's default, which the Multi30k anchors stop on with patience 10).
    train.patience_metric = "bleu"
    train.max_minutes = 0.0  # stop after this much training time (0 = off)
    # N > 0: the host CPU as N JAX devices, each batch split over them (data parallel, the
    # same update); 0 = JAX's single CPU device. No effect on accelerators' devices.
    train.cpu_devices = 0

    config.eval = eval_ = ml_collections.ConfigDict()
    eval_.every_steps = 1000
    eval_.beam_size = 1
    eval_.length_penalty = 0.6
    eval_.batch_size = 128
    eval_.max_sentences = 0  # validate on the first N sentences (0 = all)
    # False: validation is the teacher-forced loss alone (no decoding, BLEU or attention
    # maps), cheap enough to run every epoch as fairseq does; needs patience_metric "loss".
    eval_.decode = True
    # Compile validation's programs on background threads from the launch, while training
    # runs, instead of at the first validation (evaluation/precompile.py).
    eval_.precompile = True
    # lc_norm_tok only: evaluate.py also writes Moses-detokenised hypotheses and scores them
    # against the raw references (lowercase output: not comparable with a cased BLEU).
    eval_.detokenize = False

    config.checkpoint = checkpoint = ml_collections.ConfigDict()
    checkpoint.every_steps = 1000
    checkpoint.keep = 5
    # > 0: the last `keep` saves before train.num_steps also come this many steps apart
    # (what evaluate.py --average_last keep averages), while every_steps, the cadence a
    # resume needs, can be sparse: on a GPU each save stalls the step for about a second.
    checkpoint.last_every_steps = 0

    config.attention_maps = maps = ml_collections.ConfigDict()
    maps.enabled = True
    maps.num_examples = 4  # the first N validation sentences, at every eval
    maps.contributions = False  # also norm-based maps and ALTI+ (models/contributions.py)
    maps.previews = True  # PNGs of each map file, TensorBoard images of their means

    return config
