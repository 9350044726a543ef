"""A sweep from a plan file, for a lent GPU (or any machine): every variant of the plan
trains its seeds together (`train.py --seeds N --together`), is read on validation with
evaluate.py (every seed, and their mean / standard deviation), and its result JSONs and
metrics are collected in one output folder.

    python scripts/sweep.py PLAN.toml --runs runs/sweep --out $OUT/sweep \
        [--deadline_minutes 12] [--only NAME,...] [--pack] [--earlier results/sweep/PLAN]
        [--parallel N] [--nbest_minutes 3]

The plan file's format: scripts/sweep_plan.py.

A teacher (a variant some later variant names) translates the training split as soon as
its run of a direction is done, its seeds as one ensemble (`evaluate.py --split train
--ensemble`, once: the file is kept in its seed0/eval/ and reused), while its checkpoints
are on the machine; the text comes back gzipped beside its run.json, which records it
("teaches"). A student starts once its teacher's run of the same direction is done and
trains with `data.distilled_targets` set to that text (unpacked from the gzip where the
teacher trained on another machine); its run.json records the teacher's text, command
and BLEU on the training split.

A run is one variant of one direction: its seeds train in `<runs>/<direction>/<variant>/
seed<k>/` (the `--seeds` layout, so `evaluate.py --workdir <runs>/<direction>/<variant>`
summarizes them and `--ensemble` takes them), and everything it brings back goes to
`<out>/<direction>/<variant>/`: run.json (what was run, how training ended, each
evaluation's summary scores), train.log, eval_*.log, seed<k>/{config.json,
metrics.jsonl, eval/*.json}, eval/*.json (the seed summaries), for a teacher
teacher.log and teacher.train.<reading>.ens<N>.hyp.txt.gz (the distilled text) and,
with `pack`, seed<k>.tgz.part* (split into 15 MiB parts). `<out>/sweep.json` lists every
run's run.json, rewritten after each run; a table of the scores is printed at the end.

With an [nbest] table in the plan, once every run has ended, each seed of a run it names
is read once more by `python -m evaluation.nbest`: its n-best lists, reranked with the
channel score of the same seed of the same variant trained the other way (lever 5 of
docs/results.md), both at [read]'s checkpoint; the seeds' mean of each reading goes to
the run.json's "nbest" and the table.

Runs start in plan order, `--parallel` of them side by side (each its own train.py and
evaluate.py processes: on a GPU whose tiny steps leave it idle, N runs may cost about
one), a student once its teacher's run has ended.

Resumable: a run whose run.json says "done" (it finished, or reached its own
`time_limit_minutes`, and was read) is skipped; a run cut off ("cut" by the deadline,
"failed", or the process killed) trains on from its checkpoints when the sweep runs
again (train.py resumes each seed; a run cut by the deadline is read at its newest
checkpoint alone meanwhile). Across machines: `--earlier` names the results folder an earlier
sweep brought back (committed as `results/sweep/<plan>/`); its runs done are copied into
`--out` and skipped, and their distilled texts teach here. The deadline
(`--deadline_minutes`, from the sweep's start) stops training early enough for the
reading (`--read_minutes` per run, default 2) and a teacher's translation
(`--teach_minutes`, default 3), and starts no run after it. train.py and evaluate.py
run as subprocesses of this interpreter; the driver itself needs only the standard
library.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from concurrent import futures
from pathlib import Path

from sweep_plan import TEACH_KEYS, PlanError, load_plan, override_flags, runs_of

REPO = Path(__file__).resolve().parents[1]
PART_BYTES = 15 * 2**20  # what one file handed back from a lent machine may hold
READ_KEYS = ("checkpoint", "average_last", "beam_size", "batch_size", "max_sentences")
# The child processes running now (runs go on side by side with --parallel), and whether
# the sweep was interrupted: then no new child starts, and the running ones get SIGINT.
LIVE: set[subprocess.Popen] = set()
STOPPING = threading.Event()
LOCK = threading.Lock()  # over LIVE and STOPPING
TEACHING: collections.defaultdict = collections.defaultdict(threading.Lock)  # a teacher's decoding


def checkpoint_steps(workdir: Path) -> list[int]:
    folder = workdir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) \
        if folder.is_dir() else []


def run_process(argv: list[str], log: Path, limit_s: float | None,
                env: dict[str, str] | None = None) -> tuple[int, bool]:
    """Runs `argv` from the repository root with stdout and stderr to `log` (and `env` in
    place of this process's environment, when given); after `limit_s` seconds it gets
    SIGINT (train.py saves, then exits 130) and, a minute later, SIGKILL. Returns (exit
    code, whether the limit stopped it); (130, True) without starting it once the sweep is
    stopping."""
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        with LOCK:
            if STOPPING.is_set():
                return 130, True
            # A session of its own: Ctrl-C reaches the sweep alone, which passes one SIGINT
            # on (stop_children; a second would cut a training's save short).
            proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
            LIVE.add(proc)
        try:
            return proc.wait(timeout=limit_s), False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                return proc.wait(timeout=60), True
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait(), True
        finally:
            if proc.poll() is None:  # the sweep itself was interrupted
                proc.kill()
                proc.wait()
            with LOCK:
                LIVE.discard(proc)


def stop_children() -> None:
    """The sweep was interrupted: no child starts any more, and each running one gets
    SIGINT (a training saves), then SIGKILL a minute later."""
    with LOCK:
        STOPPING.set()
        running = list(LIVE)
    for proc in running:
        proc.send_signal(signal.SIGINT)
    for proc in running:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def read_step(parent: Path, seeds: list[int], requested: str, finished: bool) -> str | None:
    """The --checkpoint to read every seed at: `requested` when training finished,
    else the newest step every seed saved (evaluate.py refuses best / last of a seed
    still training); None when the seeds share no step."""
    if finished or str(requested).isdigit():
        return str(requested)
    common = set.intersection(*(set(checkpoint_steps(parent / f"seed{k}")) for k in seeds))
    return str(max(common)) if common else None


def read_settings(read: dict, finished: bool) -> dict:
    """The plan's [read] settings for a run, finished or not: one cut short is read at
    its newest checkpoint alone, as its last-N averaging window (`average_last`, the
    saves before the last step) is not there yet (evaluate.py refuses fewer saves)."""
    return read if finished else {k: v for k, v in read.items() if k != "average_last"}


def summary_scores(path: Path) -> dict:
    """The scores of an evaluate.py seed summary (mean, std, per seed)."""
    summary = json.loads(path.read_text(encoding="utf-8"))
    keys = ("bleu", "bleu_std", "bleu_lc_tok", "bleu_lc_tok_std", "chrf", "chrf_std",
            "per_seed", "checkpoint_steps")
    return {k: summary[k] for k in keys if k in summary}


def collect(parent: Path, target: Path, seeds: list[int]) -> None:
    """Copies the run's small files (configs, metrics, evaluation JSONs) to `target`."""
    for k in seeds:
        seed_dir = parent / f"seed{k}"
        for name in ("config.json", "metrics.jsonl"):
            if (seed_dir / name).is_file():
                (target / f"seed{k}").mkdir(parents=True, exist_ok=True)
                shutil.copy2(seed_dir / name, target / f"seed{k}" / name)
        for path in sorted((seed_dir / "eval").glob("*.json")):
            (target / f"seed{k}" / "eval").mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / f"seed{k}" / "eval" / path.name)
    for path in sorted((parent / "eval").glob("*.json")):
        (target / "eval").mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / "eval" / path.name)


def pack(parent: Path, target: Path, seeds: list[int]) -> list[str]:
    """Each seed's newest checkpoint with its tokenizer, config and metrics, as
    `seed<k>.tgz.partNN` files of at most PART_BYTES (`cat seed0.tgz.part* | tar xz`
    restores `seed<k>/` for train.py to resume). Returns the file names."""
    written = []
    for k in seeds:
        seed_dir = parent / f"seed{k}"
        steps = checkpoint_steps(seed_dir)
        if not steps:
            continue
        archive = target / f"seed{k}.tgz"
        with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
            for name in ("config.json", "tokenizer", "metrics.jsonl",
                         f"checkpoints/{steps[-1]}"):
                if (seed_dir / name).exists():
                    tar.add(seed_dir / name, arcname=f"seed{k}/{name}")
        with open(archive, "rb") as whole:
            for part in range(math.ceil(archive.stat().st_size / PART_BYTES)):
                name = f"seed{k}.tgz.part{part:02d}"
                (target / name).write_bytes(whole.read(PART_BYTES))
                written.append(name)
        archive.unlink()
    return written


def reading_label(split: str, step: str, settings: dict, penalty: float | None) -> str:
    """An evaluation's name: `<split>.<step|last|best>[.avgN].beam<K>[.lp<P>]`."""
    return f"{split}.{'step' + step if step.isdigit() else step}" + (
        f".avg{settings['average_last']}" if settings.get("average_last") else "") + (
        f".beam{settings.get('beam_size', 'cfg')}") + (
        f".lp{penalty}" if penalty is not None else "")


def evaluate_argv(workdir: Path, split: str, label: str, step: str, settings: dict,
                  keys: tuple[str, ...]) -> list[str]:
    """evaluate.py's command line of one reading: `settings[key]` for each key given."""
    argv = [sys.executable, "evaluate.py", "--workdir", str(workdir), "--split", split,
            "--name", label, "--checkpoint", step]
    return argv + [f"--{key}={settings[key]}" for key in keys
                   if key != "checkpoint" and settings.get(key) is not None]


def teacher_text(direction: str, teacher: str, plan: dict, runs_dir: Path, out: Path,
                 deadline: float | None, keep_seconds: float) -> dict | None:
    """The teacher run's seeds, as one ensemble, translating the training split (the text a
    student trains on): decoded once (`evaluate.py --split train --ensemble`) into the
    teacher's seed0/eval/, handed back gzipped beside its run.json, and recorded there as
    "teaches" {"label", "text", "checkpoint", scores}; a machine without the teacher's
    checkpoints (a later lent machine, given the earlier results with `--earlier`) unpacks
    that text instead of decoding. Returns {"variant", "file", "label", "text",
    "checkpoint", ...} ("exit_code" when it was decoded), or None when it cannot be had
    here: the teacher is not done, neither its text nor its checkpoints are here, or the
    deadline leaves less than `keep_seconds` and a minute after the decoding."""
    with TEACHING[(direction, teacher)]:  # two students of one teacher may ask at once
        seeds, parent = plan["seeds"], runs_dir / direction / teacher
        folder = out / direction / teacher
        record = json.loads((folder / "run.json").read_text()) \
            if (folder / "run.json").is_file() else {}
        if record.get("status") != "done":
            print(f"sweep: {direction}/{teacher} is not done: it teaches nothing yet",
                  flush=True)
            return None
        known = record.get("teaches")
        if known:
            hyp = (parent / "seed0" / "eval" / f"{known['label']}.hyp.txt").resolve()
            if not hyp.is_file() and (folder / known["text"]).is_file():
                hyp.parent.mkdir(parents=True, exist_ok=True)
                tmp = hyp.with_name(hyp.name + ".tmp")
                with gzip.open(folder / known["text"], "rb") as packed, open(tmp, "wb") as text:
                    shutil.copyfileobj(packed, text)
                os.replace(tmp, hyp)
            if hyp.is_file():
                return {**known, "file": str(hyp)}
        if not checkpoint_steps(parent / "seed0"):
            print(f"sweep: {direction}/{teacher} teaches nothing here: neither its "
                  "checkpoints nor its translation of the training split are on this "
                  "machine", flush=True)
            return None
        settings = plan["distill"]
        step = read_step(parent, seeds, settings.get("checkpoint", "last"),
                         record["train"]["ended"] == "finished")
        label = "teacher." + reading_label("train", step, settings,
                                           settings.get("length_penalty")) + f".ens{len(seeds)}"
        hyp = (parent / "seed0" / "eval" / f"{label}.hyp.txt").resolve()
        info = {"variant": teacher, "label": label, "text": f"{label}.hyp.txt.gz",
                "checkpoint": step}
        if not hyp.is_file():  # evaluate.py writes it whole or not at all
            limit = None if deadline is None else deadline - time.time() - keep_seconds - 60
            if limit is not None and limit < 30:
                print(f"sweep: {direction}/{teacher}: no time left to translate the "
                      "training split", flush=True)
                return None
            argv = evaluate_argv(parent / "seed0", "train", label, step, settings, TEACH_KEYS)
            argv += ["--ensemble", ",".join(str(parent / f"seed{k}") for k in seeds[1:])
                     ] if len(seeds) > 1 else []
            start = time.time()
            code, cut = run_process(argv, folder / "teacher.log", limit)
            info.update(command=" ".join(argv[1:]), exit_code=code, cut=cut,
                        seconds=round(time.time() - start, 1))
            print(f"sweep: {direction}/{teacher} translated the training split (exit {code}"
                  f"{', deadline' if cut else ''}, {info['seconds']:.0f} s)", flush=True)
            if not hyp.is_file():
                return {**info, "file": str(hyp)}  # the decoding failed: see teacher.log
        result = hyp.with_name(f"{label}.json")
        if result.is_file():
            info.update({k: v for k, v in json.loads(result.read_text()).items()
                         if k in ("bleu", "bleu_lc_tok", "chrf", "num_sentences")})
        with open(hyp, "rb") as text, gzip.open(folder / info["text"], "wb") as packed:
            shutil.copyfileobj(text, packed)
        record["teaches"] = info
        write_json(folder / "run.json", record)
        return {**info, "file": str(hyp)}


def nbest_argv(seed_dir: Path, reverse_dir: Path, split: str, reads: tuple[dict, dict],
               nbest: dict, output: Path) -> list[str]:
    """`python -m evaluation.nbest`'s command line for one seed and its reverse twin, each
    read as its `reads` entry says ({"checkpoint", "average_last"?}); `batch_size` and
    `max_sentences` are the run's."""
    run, reverse = reads
    argv = [sys.executable, "-m", "evaluation.nbest", "--workdir", str(seed_dir), "--split",
            split, "--checkpoint", run["checkpoint"],
            "--average_last", str(run.get("average_last") or 0),
            "--reverse_workdir", str(reverse_dir), "--reverse_checkpoint", reverse["checkpoint"],
            "--reverse_average_last", str(reverse.get("average_last") or 0),
            "--beam_sizes", ",".join(map(str, nbest["beam_sizes"])),
            "--weights", ",".join(map(str, nbest["weights"])),
            "--utilities", ",".join(nbest["utilities"]), "--output", str(output)]
    if run.get("batch_size"):
        argv += ["--batch_size", str(run["batch_size"])]
    if run.get("max_sentences"):
        argv += ["--max_sentences", str(run["max_sentences"])]
    return argv + (["--length_penalty", str(nbest["length_penalty"])]
                   if nbest["length_penalty"] is not None else [])


def seed_means(results: dict[int, dict]) -> list[dict]:
    """Each reading of the seeds' n-best results (evaluation.nbest JSONs, by seed): the
    mean and sample standard deviation over the seeds of its scores, and the seeds'."""
    out = []
    for i, first in enumerate(next(iter(results.values()))["readings"]):
        row = {k: first[k] for k in ("label", "beam_size", "selection")}
        for key in ("bleu", "bleu_lc_tok", "chrf"):
            xs = [r["readings"][i][key] for r in results.values()]
            row[key] = statistics.fmean(xs)
            row[f"{key}_std"] = statistics.stdev(xs) if len(xs) > 1 else None
        row["per_seed"] = {f"seed{k}": {key: r["readings"][i][key]
                                        for key in ("bleu", "bleu_lc_tok", "chrf", "changed")}
                           for k, r in results.items()}
        out.append(row)
    return out


def sweep_nbest(records: list[dict], plan: dict, runs_dir: Path, out: Path,
                deadline: float | None) -> list[dict]:
    """The plan's [nbest] readings (sweep_plan.py) once every run has ended: each done run
    of a variant and direction it names, whose reverse direction's run of the same variant
    is done too and has its checkpoints here, decodes each seed's n-best lists and reranks
    them with the same seed of the reverse run. The results go to `<seed>/eval/<label>.json`
    (collected as the readings are) and the run.json's "nbest": each seed's command and
    exit code, and the seeds' mean per reading. A run read so before is skipped. Returns
    the records, those read updated."""
    nbest = plan.get("nbest")
    if not nbest:
        return records
    done = {(r["direction"], r["variant"]): r for r in records if r.get("status") == "done"}
    seeds, read = plan["seeds"], plan["read"]
    updated = []
    for record in records:
        name, reverse = f"{record['direction']}/{record['variant']}", \
            nbest["reverse"].get(record["direction"])
        twin = done.get((reverse, record["variant"]))
        if record.get("status") != "done" or twin is None or record.get("nbest") or \
                record["variant"] not in nbest["variants"]:
            updated.append(record)
            continue
        parent, reverse_parent = Path(record["workdir"]), Path(twin["workdir"])
        if not all(checkpoint_steps(d / f"seed{k}") for d in (parent, reverse_parent)
                   for k in seeds):
            print(f"sweep: {name}: no n-best here (its or {reverse}'s checkpoints are not on "
                  "this machine)", flush=True)
            updated.append(record)
            continue
        # Each run read as [read] reads it: one cut short at its newest checkpoint alone.
        reads = []
        for r, folder in ((record, parent), (twin, reverse_parent)):
            finished = r["train"]["ended"] == "finished"
            reads.append({**read_settings(read, finished),
                          "checkpoint": read_step(folder, seeds, read["checkpoint"], finished)})
        if any(r["checkpoint"] is None for r in reads):
            print(f"sweep: {name}: no n-best (a run's seeds share no checkpoint)", flush=True)
            updated.append(record)
            continue
        split, step, penalty = read["splits"][0], reads[0]["checkpoint"], nbest["length_penalty"]
        label = f"nbest.{split}.{'step' + step if step.isdigit() else step}" + (
            f".avg{reads[0]['average_last']}" if reads[0].get("average_last") else "") + (
            f".lp{penalty}" if penalty is not None else "") + f".reverse_{reverse}"
        target, results, codes, commands = out / name, {}, {}, {}
        for k in seeds:
            output = parent / f"seed{k}" / "eval" / f"{label}.json"
            output.parent.mkdir(parents=True, exist_ok=True)
            argv = nbest_argv(parent / f"seed{k}", reverse_parent / f"seed{k}", split,
                              tuple(reads), nbest, output)
            left = None if deadline is None else deadline - time.time()
            if left is not None and left < 60:
                print(f"sweep: {name}: no time left for the n-best of seed {k}", flush=True)
                break
            commands[f"seed{k}"] = " ".join(argv[1:])
            codes[f"seed{k}"], _ = run_process(argv, target / "nbest.log", left)
            if codes[f"seed{k}"] == 0 and output.is_file():
                results[k] = json.loads(output.read_text(encoding="utf-8"))
        if len(results) == len(seeds):
            record["nbest"] = {"label": label, "reverse": f"{reverse}/{record['variant']}",
                               "commands": commands, "exit_codes": codes,
                               "readings": seed_means(results)}
            collect(parent, target, seeds)
            write_json(target / "run.json", record)
        print(f"sweep: {name} {label}: " + (
            f"{len(record['nbest']['readings'])} readings" if "nbest" in record else
            f"incomplete (exit codes {codes}; see nbest.log)"), flush=True)
        updated.append(record)
    return updated


def copy_earlier(earlier: Path, out: Path) -> list[str]:
    """Copies each run that an earlier sweep's results folder (`--earlier`: brought back
    from another machine) holds as done into `out`, unless `out` has that run already, so
    the sweep skips it and its record, text and scores come back again. Returns the runs
    copied, as `<direction>/<variant>`."""
    copied = []
    for record_path in sorted(earlier.glob("*/*/run.json")):
        name = f"{record_path.parent.parent.name}/{record_path.parent.name}"
        if json.loads(record_path.read_text()).get("status") != "done" or \
                (out / name / "run.json").exists():
            continue
        shutil.copytree(record_path.parent, out / name, dirs_exist_ok=True)
        copied.append(name)
    return copied


def write_json(path: Path, value) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def sweep_run(run: dict, plan: dict, runs_dir: Path, out: Path, deadline: float | None,
              read_minutes: float, pack_all: bool, teach_minutes: float = 0.0) -> dict | None:
    """Trains, reads and collects one run (module docstring); returns its run.json
    record, or None when the deadline left no time to start it. Under a deadline, a
    run's training stops early enough for its readings (`read_minutes`) and, for a
    teacher, its translation of the training split (`teach_minutes`)."""
    name = f"{run['direction']}/{run['variant']}"
    parent, target = runs_dir / run["direction"] / run["variant"], out / name
    record_path = target / "run.json"
    earlier = json.loads(record_path.read_text()) if record_path.is_file() else {}
    if earlier.get("status") == "done":
        print(f"sweep: {name} done before, skipped", flush=True)
        return earlier
    read_seconds = 60 * read_minutes
    keep = read_seconds + (60 * teach_minutes if run["teaches"] else 0)
    if deadline is not None and deadline - time.time() - keep < 30:
        print(f"sweep: {name} not started ({deadline - time.time():.0f} s left)", flush=True)
        return None
    target.mkdir(parents=True, exist_ok=True)
    seeds, overrides, teacher = plan["seeds"], dict(run["overrides"]), None
    if run["teacher"]:
        teacher = teacher_text(run["direction"], run["teacher"], plan, runs_dir, out,
                               deadline, read_seconds)
        if teacher is None:
            print(f"sweep: {name} not started", flush=True)
            return None
        overrides["data.distilled_targets"] = teacher["file"]
    record = {"direction": run["direction"], "variant": run["variant"],
              "config": run["config"], "overrides": overrides, "seeds": seeds,
              "workdir": str(parent), "status": "training",
              **({"teacher": teacher} if teacher else {})}
    if teacher and not Path(teacher["file"]).is_file():
        record["status"] = "failed"  # the teacher's decoding failed: see teacher.log
        write_json(record_path, record)
        return record
    write_json(record_path, record)

    limit, by_deadline = 60 * run["time_limit_minutes"] or None, False
    if deadline is not None:
        left = max(deadline - time.time() - keep, 1)
        if limit is None or left < limit:
            limit, by_deadline = left, True
    start = time.time()
    argv = [sys.executable, "train.py", "--config", run["config"], "--workdir", str(parent),
            "--seeds", str(len(seeds)), "--together", *override_flags(overrides)]
    code, stopped = run_process(argv, target / "train.log", limit)
    finished = code == 0 and not stopped
    record["train"] = {"exit_code": code, "started": round(start, 1),
                       "seconds": round(time.time() - start, 1),
                       "ended": "finished" if finished else
                       ("deadline" if by_deadline else "time limit") if stopped else
                       "interrupted" if STOPPING.is_set() else "error",
                       "steps": {f"seed{k}": (checkpoint_steps(parent / f"seed{k}") or [None])[-1]
                                 for k in seeds}}
    print(f"sweep: {name} trained ({record['train']['ended']}, exit {code}, "
          f"{record['train']['seconds']:.0f} s, steps {record['train']['steps']})", flush=True)

    read = read_settings({**plan["read"], "length_penalties": run["length_penalties"]},
                         finished)
    record["evaluations"] = []
    step = read_step(parent, seeds, read["checkpoint"], finished)
    for split in read["splits"]:
        for penalty in read["length_penalties"]:
            if step is None:
                break
            label = reading_label(split, step, read, penalty)
            argv = evaluate_argv(parent, split, label, step, read, READ_KEYS)
            argv += ["--compat_lc_tok"] if read.get("compat_lc_tok") else []
            argv += ["--length_penalty", str(penalty)] if penalty is not None else []
            left = None if deadline is None else max(deadline - time.time(), 1)
            code, cut = run_process(argv, target / f"eval_{label}.log", left)
            evaluation = {"name": label, "split": split, "length_penalty": penalty,
                          "checkpoint": step, "exit_code": code}
            if code == 0 and (parent / "eval" / f"{label}.json").is_file():
                evaluation.update(summary_scores(parent / "eval" / f"{label}.json"))
            record["evaluations"].append(evaluation)
            print(f"sweep: {name} {label}: " + (
                f"BLEU {evaluation['bleu']:.2f}" if "bleu" in evaluation else
                f"failed (exit {code}{', deadline' if cut else ''}; see eval_{label}.log)"),
                flush=True)
    collect(parent, target, seeds)
    if run["pack"] or pack_all:
        record["packed"] = pack(parent, target, seeds)
    # A run done is skipped when the sweep runs again; one cut by the deadline trains on
    # from its checkpoints (where they still are); a failed one is tried again.
    read_all = bool(record["evaluations"]) and all(
        "bleu" in e for e in record["evaluations"])
    ended = record["train"]["ended"]
    record["status"] = "cut" if ended == "deadline" else "done" if ended in (
        "finished", "time limit") and read_all else "failed"
    write_json(record_path, record)
    if record["status"] == "done" and run["teaches"]:  # now, while its checkpoints are here
        teacher_text(run["direction"], run["variant"], plan, runs_dir, out, deadline, 0)
        record = json.loads(record_path.read_text())
    return record


def sweep_all(runs: list[dict], plan: dict, runs_dir: Path, out: Path,
              deadline: float | None, read_minutes: float, pack_all: bool, parallel: int,
              on_record, teach_minutes: float = 0.0) -> list[dict]:
    """`sweep_run` on every run, up to `parallel` of them side by side (one thread each,
    whose train.py and evaluate.py are child processes), started in plan order; a student
    starts once its teacher's run of the same direction has ended. Returns the run.json
    records in plan order (a run the deadline left unstarted has none); `on_record` gets
    them so far after each run ends."""
    records: dict[int, dict] = {}  # by plan index
    pending, running = list(enumerate(runs)), {}
    with futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        try:
            while pending or running:
                busy = {(runs[i]["direction"], runs[i]["variant"]) for i in running}
                for i, run in list(pending):
                    if len(running) >= parallel:
                        break
                    if (run["direction"], run["teacher"]) in busy:
                        continue  # its teacher is still training
                    pending.remove((i, run))
                    busy.add((run["direction"], run["variant"]))
                    running[i] = pool.submit(sweep_run, run, plan, runs_dir, out, deadline,
                                             read_minutes, pack_all, teach_minutes)
                done, _ = futures.wait(running.values(),
                                       return_when=futures.FIRST_COMPLETED)
                for i in [i for i, job in running.items() if job in done]:
                    if (record := running.pop(i).result()) is not None:
                        records[i] = record
                        on_record([records[k] for k in sorted(records)])
        except BaseException:  # Ctrl-C, a driver's SIGINT, a run's error: the threads
            stop_children()    # end soon after, their trainings saved
            raise
    return [records[k] for k in sorted(records)]


def table(records: list[dict]) -> str:
    """One line per run and evaluation: the mean +- std over seeds."""
    lines = [f"{'run':40s} {'reading':44s} {'BLEU':>13s} {'lc-tok':>13s} {'chrF':>13s}"]

    def cell(e: dict, key: str) -> str:
        if e.get(key) is None:
            return f"{'-':>13s}"
        std = e.get(f"{key}_std")
        return f"{e[key]:7.2f}" + (f" ±{std:4.2f}" if std is not None else "      ")

    for r in records:
        run = f"{r['direction']}/{r['variant']} ({r.get('train', {}).get('ended', '?')})"
        for e in r.get("evaluations") or [{"name": "-"}]:
            lines.append(f"{run:40s} {e['name']:44s} {cell(e, 'bleu')} "
                         f"{cell(e, 'bleu_lc_tok')} {cell(e, 'chrf')}")
        for e in (r.get("nbest") or {}).get("readings", []):
            lines.append(f"{run:40s} {'n-best ' + e['label']:44s} {cell(e, 'bleu')} "
                         f"{cell(e, 'bleu_lc_tok')} {cell(e, 'chrf')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plan", type=Path, help="the plan file (.toml)")
    parser.add_argument("--runs", type=Path, default=None,
                        help="where the runs train (default runs/<plan name>)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where results are collected (default $OUT/<plan name>, else "
                             "<runs>/results)")
    parser.add_argument("--deadline_minutes", type=float, default=None,
                        help="the sweep's end, from its start: no run starts after it")
    parser.add_argument("--read_minutes", type=float, default=2.0,
                        help="time kept for each run's evaluations under a deadline")
    parser.add_argument("--teach_minutes", type=float, default=3.0,
                        help="time kept under a deadline for a teacher's translation of the "
                             "training split, right after its reading")
    parser.add_argument("--nbest_minutes", type=float, default=3.0,
                        help="time kept under a deadline for the plan's [nbest] readings, "
                             "after every run")
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument("--pack", action="store_true", help="pack every run's checkpoints")
    parser.add_argument("--parallel", type=int, default=1,
                        help="runs trained side by side (each its own processes) [1]")
    parser.add_argument("--earlier", type=Path, default=None,
                        help="an earlier sweep's results folder (from another machine): its "
                             "runs done are copied into --out and skipped")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        print(f"error: --parallel {args.parallel}: must be at least 1", file=sys.stderr)
        return 2
    start = time.time()
    try:
        plan = load_plan(args.plan)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stem = args.plan.stem
    runs_dir = args.runs or Path("runs") / stem
    out = args.out or (Path(os.environ["OUT"]) / stem if os.environ.get("OUT")
                       else runs_dir / "results")
    if args.earlier is not None and not args.earlier.is_dir():
        print(f"error: --earlier {args.earlier}: not a folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if args.earlier is not None:
        copied = copy_earlier(args.earlier, out)
        print(f"sweep: {len(copied)} run(s) done earlier, from {args.earlier}: "
              f"{', '.join(copied) or '-'}", flush=True)
    deadline = None if args.deadline_minutes is None else start + 60 * args.deadline_minutes
    only = {n for n in args.only.split(",") if n} or None

    def on_record(so_far: list[dict]) -> None:
        write_json(out / "sweep.json", {"plan": str(args.plan), "runs": so_far})

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    # Set here, not inherited: a process started with SIGINT ignored (a test runner's
    # worker, nohup) would otherwise never hear its driver's SIGINT.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)
    try:
        # With [nbest], training and reading end early enough for the n-best readings.
        runs_deadline = None if deadline is None else \
            deadline - (60 * args.nbest_minutes if plan["nbest"] else 0)
        records = sweep_all(runs_of(plan, only), plan, runs_dir, out, runs_deadline,
                            args.read_minutes, args.pack, args.parallel, on_record,
                            args.teach_minutes)
        records = sweep_nbest(records, plan, runs_dir, out, deadline)
        on_record(records)
    except KeyboardInterrupt:  # sweep_all stopped every training (saved): the same
        print("sweep: interrupted", file=sys.stderr, flush=True)  # command resumes them
        return 130
    print(table(records), flush=True)
    print(f"sweep: {len(records)} run(s) in {time.time() - start:.0f} s; results in {out}",
          flush=True)
    return 0 if all(r.get("status") == "done" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
