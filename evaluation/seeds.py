"""Seeds as an axis of an experiment: `train.py --seeds N` trains seeds 0..N-1 of one
config (`train.seed = k`) into `<parent>/seed<k>/`, and `evaluate.py --workdir <parent>`
evaluates every seed run and summarizes its scores over seeds (mean and sample standard
deviation), so that a difference between recipes can be told from run-to-run noise.
`evaluate.py --seed_results F1,F2,.. --output OUT` makes the same summary from stored
per-seed results (`summarize_files`), for seeds trained in different sessions or on
different machines whose checkpoints are no longer side by side.

Light (no JAX): evaluate.py checks its inputs before importing JAX.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

from common.errors import UserError
from common.files import write_atomic
from configs.resolved import CONFIG_JSON, load_config_json
from evaluation.loading import checkpoint_dir, unfinished_training

SEED_DIR = re.compile(r"seed(\d+)")
# The scores summarized, in the summary's key order (bleu_lc_tok with --compat_lc_tok).
SCORES = ("bleu", "bleu_lc_tok", "chrf")
# How each score was computed (sacreBLEU signatures, the lc-tok preprocessing): the seeds
# of one summary must agree on them, and the summary carries them beside its means.
SIGNATURES = ("bleu_signature", "bleu_lc_tok_signature", "bleu_lc_tok_preprocessing",
              "chrf_signature")


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


def check_seed_runs(runs: list[Path], checkpoint: str | None) -> None:
    """Before any seed run is evaluated: each has a config.json and checkpoints, and under
    `best` / `last` (`checkpoint` None or a name, not a step) each has finished training,
    or the mean would take a half-trained seed as it stands. UserError names the first
    run that fails."""
    for run in runs:
        load_config_json(run)
        checkpoint_dir(run)
    if not (checkpoint or "").isdigit():
        for run in runs:
            if where := unfinished_training(run):
                raise UserError(f"{run} has not finished training ({where}): resume it with "
                                "its train.py command, or name one step for every seed "
                                "with --checkpoint STEP")


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


def summary_record(results: list[dict], *, name: str, workdir: str | None,
                   json_path: str | Path, seed_files: list[str]) -> dict:
    """The summary JSON of per-seed results (evaluate.py's docstring): `summarize`'s
    scores, the `SIGNATURES` of the first seed's scores (all seeds share them), then name,
    workdir (the seeds' parent), num_seeds, split, source, reference, checkpoint_steps (per
    seed), decoding, files {json, seeds} and time."""
    first = results[0]
    summary = summarize(results)
    summary.update({key: first[key] for key in SIGNATURES if key in first})
    summary.update(name=name, workdir=workdir, num_seeds=len(results), split=first["split"],
                   source=first["source"], reference=first["reference"],
                   checkpoint_steps=[r["checkpoint"]["steps"] for r in results],
                   decoding=first["decoding"],
                   files={"json": str(json_path), "seeds": seed_files}, time=time.time())
    return summary


def shared_fields(result: dict) -> dict:
    """What the stored results of one recipe's seeds must share to be summarized as one:
    the text scored, the decoding, the checkpoint rule (the steps themselves may differ)
    and how the scores were computed, by name ("decoding.beam_size" for a nested key)."""
    decoding, checkpoint = result["decoding"], result["checkpoint"]
    return {**{key: result.get(key) for key in ("source_lang", "target_lang", "split",
                                                "source", "reference", "num_sentences")},
            "decoding.beam_size": decoding.get("beam_size"),
            "decoding.length_penalty": decoding.get("length_penalty"),
            "checkpoint.requested": checkpoint.get("requested"),
            "checkpoint.averaged": checkpoint.get("averaged"),
            "averaged_checkpoints": len(checkpoint.get("steps", ())),
            "scores": [k for k in SCORES if k in result],
            **{key: result.get(key) for key in SIGNATURES}}


def load_seed_result(path: str | Path) -> dict:
    """One seed's stored evaluate.py JSON; UserError for a file that is not the scored
    result of one run (a summary, an ensemble, translations without a reference)."""
    path = Path(path)
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(result, dict) or "per_seed" in result or not {
            "workdir", "bleu", "checkpoint", "decoding", "split"} <= result.keys():
        raise UserError(f"{path}: not the evaluate.py JSON of one training run")
    if "ensemble" in result:
        raise UserError(f"{path}: the result of an ensemble, not of one seed")
    if result["bleu"] is None:
        raise UserError(f"{path}: has no scores (translated without a reference)")
    return result


def summarize_files(paths: list[str | Path], output: str | Path) -> dict:
    """The summary over seeds (`summary_record`) of stored per-seed evaluate.py JSON
    files, written atomically to `output` (a .json file; its stem is the summary's name).

    The files must come from different runs and agree on `shared_fields`. Raises
    UserError, before anything is written, for a file that is not such a result.
    """
    output = Path(output)
    if not paths:
        raise UserError("--seed_results needs at least one evaluate.py JSON file")
    if output.suffix != ".json":
        raise UserError(f"--output {output}: must be a .json file")
    if any(output.resolve() == Path(p).resolve() for p in paths):
        raise UserError(f"--output {output} is one of the --seed_results files")
    results = [load_seed_result(p) for p in paths]
    first = shared_fields(results[0])
    for path, result in zip(paths[1:], results[1:], strict=True):
        other = shared_fields(result)
        for key in first:
            if other[key] != first[key]:
                raise UserError(f"{path} has {key} {other[key]!r}, {paths[0]} has "
                                f"{first[key]!r}: not the same evaluation of seeds of one recipe")
    workdirs = [r["workdir"] for r in results]
    if len(set(workdirs)) < len(workdirs):
        raise UserError(f"--seed_results: two files come from the same run ({workdirs})")
    parents = {str(Path(w).parent) for w in workdirs}
    summary = summary_record(results, name=output.stem,
                             workdir=parents.pop() if len(parents) == 1 else None,
                             json_path=output, seed_files=[str(p) for p in paths])
    write_atomic(output, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
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
