"""Export a trained run as a compact, inference-only workdir (the repository's
`pretrained/` models):

    python -m scripts.export_pretrained --workdir runs/de_en_cpu_kd_seed2 --out pretrained/de_en_cpu \
        [--checkpoint last] [--dtype float16]

The new workdir holds config.json, tokenizer/, one checkpoint with the parameters alone
in `--dtype` (training/checkpoint.py `export`: no optimizer state) and the attention maps
of the run's last validation (attention/*.npz, no PNGs). Paths in config.json that lie inside
this repository (a distilled config's teacher text) are written relative to its root, so a
shipped workdir names no machine's folders. evaluate.py, attention.inspect,
attention.align and attention.heads read it as they read any run; train.py refuses to
resume it. `--out` must not exist: nothing is overwritten.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import ml_collections
from absl import flags, logging

from common import cli
from common.errors import UserError
from configs import resolved

flags.DEFINE_string("workdir", None, "The trained run to export.")
flags.DEFINE_string("out", None, "The new workdir (must not exist).")
flags.DEFINE_string("checkpoint", "last", "best | last | STEP.")
flags.DEFINE_enum("dtype", "float16", ["float16", "bfloat16", "float32"],
                  "Storage dtype of the parameters.")
FLAGS = flags.FLAGS
REPO = Path(__file__).resolve().parents[1]


def repo_relative(tree):
    """`tree` (config.json's JSON) with every absolute path inside the repository made
    relative to its root; other values unchanged."""
    if isinstance(tree, dict):
        return {k: repo_relative(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [repo_relative(v) for v in tree]
    if isinstance(tree, str) and Path(tree).is_absolute() and Path(tree).is_relative_to(REPO):
        return Path(tree).relative_to(REPO).as_posix()
    return tree


def export(workdir: Path, out: Path, checkpoint: str, dtype: str) -> int:
    """Writes the compact copy of `workdir` into `out` (module docstring); returns its step."""
    from evaluation.loading import load_params
    from training import checkpoint as ckpt

    if out.exists():
        raise UserError(f"{out} already exists; give a new --out")
    cfg = resolved.load_config_json(workdir)
    loaded = load_params(workdir, checkpoint, cfg=cfg)
    step = loaded.steps[-1]
    manager = ckpt.make_manager(workdir / "checkpoints", cfg.checkpoint.keep, read_only=True)
    meta = ckpt.restore_meta(manager, step)
    meta.pop(ckpt.CHECKSUM_KEY, None)
    staging = out.with_name(out.name + ".partial")  # renamed into place when complete
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tree = json.loads((workdir / resolved.CONFIG_JSON).read_text(encoding="utf-8"))
    resolved.write_config_json(ml_collections.ConfigDict(repo_relative(tree)), staging)
    shutil.copytree(workdir / "tokenizer", staging / "tokenizer")
    ckpt.export(staging / "checkpoints", step, loaded.params, meta, dtype)
    maps = sorted((workdir / "attention").glob("valid_step*.npz"))
    if maps:
        last = maps[-1].name.split("_")[1]  # stepNNNNNNN
        (staging / "attention").mkdir()
        for path in maps:
            if path.name.split("_")[1] == last:
                shutil.copy2(path, staging / "attention" / path.name)
    staging.rename(out)
    return step


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads and writes
    if not FLAGS.workdir or not FLAGS.out:
        raise UserError("--workdir and --out are required")
    step = export(Path(FLAGS.workdir), Path(FLAGS.out), FLAGS.checkpoint, FLAGS.dtype)
    print(f"exported step {step} of {FLAGS.workdir} to {FLAGS.out}", file=sys.stderr)


if __name__ == "__main__":
    cli.run(main)
