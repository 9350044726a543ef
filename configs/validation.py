"""Config validation: the checks that a value's type alone cannot make, run before any
work (train.py, evaluate.py and every command that reads a config). Each key's own range
is in one table (configs/ranges.py); here are the checks across keys."""

import ml_collections

from common.errors import UserError
from configs.base import DATASETS
from configs.model import ModelConfig
from configs.ranges import check_ranges


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks values that types alone cannot; raises UserError naming the key."""
    data = config.data
    if data.dataset not in DATASETS:
        raise UserError(f"unknown dataset {data.dataset!r} (known: {', '.join(DATASETS)})")
    check_ranges(config)  # every key's own range, in one table (configs/ranges.py)
    if data.source_lang == data.target_lang:
        raise UserError(f"data.source_lang and data.target_lang are both {data.source_lang!r}")
    if config.train.schedule == "cosine_budget" and config.train.max_minutes <= 0:
        raise UserError("train.schedule=cosine_budget decays over the time budget: set "
                        "train.max_minutes")
    if data.spm_model_type == "bpe" and data.spm_sampling_alpha >= 1:
        raise UserError(f"data.spm_sampling_alpha is BPE-dropout's probability of skipping a "
                        f"merge for a BPE model: below 1, got {data.spm_sampling_alpha}")
    if data.spm_sampling_alpha and data.spm_model_type == "unigram" and \
            not 2 <= data.spm_nbest_size <= 1024:
        raise UserError(f"data.spm_nbest_size must be 2 to 1024 with sampling on, got "
                        f"{data.spm_nbest_size}")
    if config.eval.get("detokenize", False) and data.get("text_protocol", "raw") == "raw":
        raise UserError("eval.detokenize undoes data.text_protocol=lc_norm_tok's tokenisation; "
                        "raw text is never tokenised")
    if not config.eval.get("decode", True) and config.train.patience and \
            config.train.get("patience_metric", "bleu") == "bleu":
        raise UserError("train.patience counts validations without a better BLEU, which "
                        "eval.decode=False does not compute: set train.patience_metric=loss")
    if config.model.share_embeddings and not data.joint_vocab:
        raise UserError("model.share_embeddings needs one joint vocabulary (data.joint_vocab=True)")
    # The model's own checks (sizes, divisibility, choices), before any file is written.
    ModelConfig.from_config(config.model, src_vocab_size=data.vocab_size,
                            tgt_vocab_size=data.vocab_size)
