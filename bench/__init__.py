"""Benchmark scripts: matmul peak, training throughput and MFU, decoding speed.

Run them as scripts from the repository root (see bench/README.md); they are not tests.
"""

import json
from pathlib import Path


def write_json(path: Path, result: dict) -> None:
    """Write a benchmark's result as indented JSON, creating the parent folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


def load_config_file(path: str | Path):
    """A config file's `get_config()` (a recipe named by path, as train.py's --config)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def finish(args, run, print_table) -> dict:
    """What every benchmark's main does after parsing: `run(args)`, print its table and,
    with --json, write the result. Bad input (a UserError) is one `error:` line, exit 2."""
    import sys

    from absl import logging as absl_logging

    from common.errors import UserError

    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's read-only-manager chatter
    try:
        result = run(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print_table(result)
    if args.json:
        write_json(args.json, result)
    return result


def load_run(workdir: Path, checkpoint: str, split: str, max_sentences: int = 0):
    """A trained run loaded as evaluate.py loads it (config.json, tokenizer, orbax
    checkpoint) and the first `max_sentences` (0 = all) pairs of `split` of its dataset.
    Returns (cfg, tokenizer, loaded params: evaluation.loading.load_params's, sources,
    references)."""
    from configs import resolved
    from data.corpora import load_corpus
    from evaluation.loading import load_params, load_tokenizer

    cfg = resolved.load_config_json(workdir)
    tokenizer = load_tokenizer(workdir, cfg)
    loaded = load_params(workdir, checkpoint, cfg=cfg, tokenizer=tokenizer)
    sources, references = load_corpus(cfg.data, split)
    if max_sentences:
        sources, references = sources[:max_sentences], references[:max_sentences]
    return cfg, tokenizer, loaded, sources, references
