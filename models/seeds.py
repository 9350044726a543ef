"""Seeds as an axis of an experiment: `train.py --seeds N` trains seeds 0..N-1 of one
config (`train.seed = k`) into `<parent>/seed<k>/`, and `evaluate.py --workdir <parent>`
evaluates every seed run and summarizes its scores over seeds (mean and sample standard
deviation), so that a difference between recipes can be told from run-to-run noise.

Light (no JAX): evaluate.py checks its inputs before importing JAX.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from configs.cli import CONFIG_JSON
from configs.errors import UserError

SEED_DIR = re.compile(r"seed(\d+)")
# The scores summarized, in the summary's key order (bleu_lc_tok with --compat_lc_tok).
SCORES = ("bleu", "bleu_lc_tok", "chrf")


def seed_workdir(parent: str | Path, seed: int) -> Path:
    """Where seed `seed` of a `--seeds` run trains: `<parent>/seed<k>`."""
    return Path(parent) / f"seed{seed}"


def seed_workdirs(parent: str | Path) -> list[Path]:
    """The seed runs under `parent`: its `seed<k>/` folders that hold a config.json, by k."""
    parent = Path(parent)
    found = []
    if parent.is_dir():
        for path in parent.iterdir():
            match = SEED_DIR.fullmatch(path.name)
            if match and (path / CONFIG_JSON).is_file():
                found.append((int(match[1]), path))
    return [path for _, path in sorted(found)]


def seed_runs_of(workdir: str | Path) -> list[Path]:
    """[] for a training workdir (it has a config.json), the seed runs of a parent of
    `--seeds` runs; UserError for a folder that is neither."""
    workdir = Path(workdir)
    if (workdir / CONFIG_JSON).is_file():
        return []
    runs = seed_workdirs(workdir)
    if not runs:
        raise UserError(f"{workdir / CONFIG_JSON} not found: {workdir} is not a training "
                        f"workdir (nor a parent of --seeds runs: no seed<k>/{CONFIG_JSON})")
    return runs


def summarize(results: list[dict]) -> dict:
    """The scores of per-seed evaluation results (evaluate.py's JSON) over the seeds.

    Returns, in this key order: the mean of each score in `SCORES` the results carry
    (`bleu`, `bleu_lc_tok`), their sample standard deviations (`bleu_std`, ...; ddof 1,
    None for one seed), the same for `chrf`, then `per_seed` {score: [value per seed]}
    and the seed `workdirs`. A score that is None (no reference) stays None.
    """
    present = [k for k in SCORES if k in results[0]]
    values = {k: [r.get(k) for r in results] for k in present}

    def mean_std(key: str) -> dict:
        xs = values[key]
        if any(x is None for x in xs):
            return {key: None, f"{key}_std": None}
        return {key: statistics.fmean(xs),
                f"{key}_std": statistics.stdev(xs) if len(xs) > 1 else None}

    stats = {k: mean_std(k) for k in present}
    bleus = [k for k in present if k != "chrf"]
    summary = {k: stats[k][k] for k in bleus}  # the means first, then their deviations
    summary.update({f"{k}_std": stats[k][f"{k}_std"] for k in bleus})
    if "chrf" in stats:
        summary.update(stats["chrf"])
    summary["per_seed"] = values
    summary["workdirs"] = [r["workdir"] for r in results]
    return summary


def summary_lines(summary: dict) -> list[str]:
    """What evaluate.py prints for a parent of seed runs: each score's mean, deviation
    and per-seed values, and the file written."""
    labels = {"bleu": "BLEU", "bleu_lc_tok": "BLEU (lowercased Moses-tokenized, compat)",
              "chrf": "chrF2"}
    n = len(summary["workdirs"])
    lines = []
    for key, label in labels.items():
        if summary.get(key) is None:
            continue
        std = summary[f"{key}_std"]
        spread = f" ± {std:.2f} (sample std)" if std is not None else ""
        seeds = ", ".join(f"{x:.2f}" for x in summary["per_seed"][key])
        lines.append(f"{label} = {summary[key]:.2f}{spread} over {n} seed(s): {seeds}")
    lines.append(f"wrote {summary['files']['json']}")
    return lines
