"""scripts/sweep.py: a plan's variants x seeds trained together, read on validation and
collected in one folder, end to end on the smoke config; rerunning skips finished runs,
and so does a sweep given an earlier machine's results; a distillation student trains on
its teacher variant's ensemble translation, here or on a machine without the teacher's
checkpoints."""

import gzip
import json
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import ml_collections
import pytest
from conftest import REPO

from configs import smoke
from data import corpora

sys.path.insert(0, str(REPO / "scripts"))
import sweep  # noqa: E402
import sweep_plan  # noqa: E402

# Every smoke plan's settings: 2 seeds of 4 steps, read greedily on 8 sentences.
SETTINGS = """
seeds = 2
[overrides]  # every run's
"train.num_steps" = 4
"eval.every_steps" = 0
"checkpoint.every_steps" = 2
"eval.max_sentences" = 8
"attention_maps.enabled" = false
[read]
split = "valid"
checkpoint = "last"
beam_size = 1
max_sentences = 8
length_penalties = [1.0]
"""
PLAN = SETTINGS + """[directions]
smoke = "configs/smoke.py"
[[variants]]
name = "base"
[[variants]]
name = "no_dropout"
overrides = { "model.dropout" = 0.0 }
pack = true
length_penalties = [1.0, 1.5]
"""


def test_plan_reading(tmp_path):
    plan_file = tmp_path / "p.toml"
    plan_file.write_text(PLAN)
    plan = sweep_plan.load_plan(plan_file)
    assert plan["seeds"] == [0, 1] and plan["read"]["splits"] == ["valid"]
    runs = sweep_plan.runs_of(plan)
    assert [(r["direction"], r["variant"], r["pack"]) for r in runs] == [
        ("smoke", "base", False), ("smoke", "no_dropout", True)]
    assert runs[1]["overrides"]["model.dropout"] == 0.0  # the plan's and the variant's
    assert runs[1]["overrides"]["train.num_steps"] == 4
    # A variant's own length penalties replace the plan's.
    assert [r["length_penalties"] for r in runs] == [[1.0], [1.0, 1.5]]
    assert "--config.attention_maps.enabled=False" in sweep_plan.override_flags(runs[0]["overrides"])
    assert [r["variant"] for r in sweep_plan.runs_of(plan, {"no_dropout"})] == ["no_dropout"]
    assert plan["nbest"] is None
    with_nbest = PLAN.replace("[directions]", "[directions]\nback = 'configs/smoke.py'") + \
        NBEST.replace("smoke_en_de", "back")
    plan_file.write_text(with_nbest)
    assert sweep_plan.load_plan(plan_file)["nbest"] == {
        "reverse": {"smoke": "back"}, "beam_sizes": [2], "weights": [0, 1000],
        "utilities": ["bleu"], "length_penalty": None, "variants": ["base", "no_dropout"]}
    from evaluation.mbr import UTILITIES
    assert tuple(UTILITIES) == sweep_plan.MBR_UTILITIES
    # The anchors' plan reads: 3 seeds, each variant over its directions.
    anchors = sweep_plan.load_plan(REPO / "scripts" / "plans" / "anchors.toml")
    assert anchors["seeds"] == [0, 1, 2] and len(sweep_plan.runs_of(anchors)) >= 3
    for bad, why in [(with_nbest.replace('"back" }', '"smoke" }'), "reverse must map directi"),
                     (with_nbest.replace('"back" }', '"fr" }'), "reverse must map"),
                     (with_nbest.replace("[2]", "[1]"), "beam_sizes must be integers"),
                     (with_nbest.replace("[0, 1000]", "[-1]"), "weights must be numbers"),
                     (with_nbest.replace('["bleu"]', '["ter"]'), "utilities must be of"),
                     (with_nbest + "variants = ['kd']\n", "unknown variants"),
                     (with_nbest + "beam = 5\n", "takes reverse"),
                     (PLAN.replace("seeds = 2", "seeds = [1, 2]"), "seeds must be"),
                     (PLAN.replace('name = "no_dropout"', 'name = "base"'), "a name of its own"),
                     (PLAN + '[[variants]]\nname = "x"\ndirections = ["fr"]\n', "unknown"),
                     ("seeds = [", "cannot read")]:
        plan_file.write_text(bad)
        with pytest.raises(sweep_plan.PlanError, match=why):
            sweep_plan.load_plan(plan_file)


def test_read_step_of_a_run_stopped_early(tmp_path):
    for seed, steps in ((0, [2, 4, 6]), (1, [2, 4])):
        for step in steps:
            (tmp_path / f"seed{seed}" / "checkpoints" / str(step)).mkdir(parents=True)
    assert sweep.read_step(tmp_path, [0, 1], "last", finished=True) == "last"
    assert sweep.read_step(tmp_path, [0, 1], "last", finished=False) == "4"
    assert sweep.read_step(tmp_path, [0, 1], "2", finished=False) == "2"


def test_a_run_cut_short_is_read_without_its_averaging_window():
    read = {"split": "valid", "checkpoint": "last", "average_last": 10, "beam_size": 5}
    assert sweep.read_settings(read, finished=True) == read
    cut = sweep.read_settings(read, finished=False)
    assert cut == {"split": "valid", "checkpoint": "last", "beam_size": 5}
    assert sweep.reading_label("valid", "3747", cut, 1.0) == "valid.step3747.beam5.lp1.0"
    assert "--average_last=10" not in sweep.evaluate_argv(
        Path("w"), "valid", "x", "3747", cut, sweep.READ_KEYS)


def test_nbest_reads_each_run_as_its_reading_does():
    """The n-best command reads a finished run at its last-N average and a twin cut short at
    its newest checkpoint alone, as their [read] evaluations did."""
    read = {"checkpoint": "last", "average_last": 10, "max_sentences": 8}
    nbest = {"beam_sizes": [5, 20], "weights": [0.1, 0.3], "utilities": [],
             "length_penalty": 1.25}
    argv = sweep.nbest_argv(Path("fwd"), Path("rev"), "valid",
                            (read, {**sweep.read_settings(read, finished=False),
                                    "checkpoint": "3747"}), nbest, Path("o.json"))
    line = " ".join(argv[1:])
    assert "--workdir fwd --split valid --checkpoint last --average_last 10" in line
    assert "--reverse_workdir rev --reverse_checkpoint 3747 --reverse_average_last 0" in line
    assert "--beam_sizes 5,20 --weights 0.1,0.3 --utilities  --output o.json" in line
    assert line.endswith("--max_sentences 8 --length_penalty 1.25")


def run_sweep(tmp_path, plan: str, *flags: str, machine: str = "", check: bool = True) -> tuple:
    """scripts/sweep.py on the plan's text, which must succeed (with `check`), in
    `runs<machine>` and `out<machine>`: (runs folder, results folder, the command, the
    records of sweep.json, what it printed)."""
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(plan)
    runs, out = tmp_path / f"runs{machine}", tmp_path / f"out{machine}"
    argv = [sys.executable, "scripts/sweep.py", str(plan_file), "--runs", str(runs),
            "--out", str(out), *flags]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 or not check, result.stdout[-3000:] + result.stderr[-3000:]
    return (runs, out, argv, json.loads((out / "sweep.json").read_text())["runs"],
            result.stdout)


@pytest.mark.slow  # the driver's one end-to-end run in CI; its other runs are marked long
def test_smoke_sweep_end_to_end_and_resumed(tmp_path):
    """Both runs side by side (`--parallel 2`): each as it would be alone."""
    runs, out, argv, records, _ = run_sweep(tmp_path, PLAN, "--parallel", "2")
    assert [(r["variant"], r["status"]) for r in records] == [("base", "done"),
                                                              ("no_dropout", "done")]
    first, second = (r["train"] for r in records)
    assert second["started"] < first["started"] + first["seconds"]  # they overlapped
    for record in records:
        assert record["train"] == {**record["train"], "exit_code": 0, "ended": "finished",
                                   "steps": {"seed0": 4, "seed1": 4}}
        evaluation, *more = record["evaluations"]
        assert [e["name"] for e in more] == (  # no_dropout's own length penalties
            ["valid.last.beam1.lp1.5"] if record["variant"] == "no_dropout" else [])
        assert evaluation["name"] == "valid.last.beam1.lp1.0"
        assert len(evaluation["per_seed"]["bleu"]) == 2 and evaluation["bleu"] is not None
        target = out / "smoke" / record["variant"]
        summary = json.loads((target / "eval" / "valid.last.beam1.lp1.0.json").read_text())
        assert summary["num_seeds"] == 2 and summary["bleu"] == evaluation["bleu"]
        for k in (0, 1):
            config = json.loads((target / f"seed{k}" / "config.json").read_text())
            assert config["train"]["seed"] == k and config["train"]["num_steps"] == 4
            assert (target / f"seed{k}" / "eval" / "valid.last.beam1.lp1.0.json").is_file()
            steps = [json.loads(line)["step"] for line in
                     (target / f"seed{k}" / "metrics.jsonl").read_text().splitlines()]
            assert max(steps) == 4
        assert "--together" in (target / "train.log").read_text()
    dropout = [json.loads((out / "smoke" / v / "seed0" / "config.json").read_text())
               ["model"]["dropout"] for v in ("base", "no_dropout")]
    assert dropout == [0.1, 0.0]
    # pack = true: each seed's newest checkpoint, tokenizer and config, in parts.
    assert records[1]["packed"] == ["seed0.tgz.part00", "seed1.tgz.part00"]
    with tarfile.open(out / "smoke" / "no_dropout" / "seed1.tgz.part00") as tar:
        names = tar.getnames()
    assert {"seed1/config.json", "seed1/tokenizer/spm.model", "seed1/checkpoints/4"} <= set(names)

    # Rerunning skips what is done: nothing is trained or evaluated again.
    log = (out / "smoke" / "base" / "train.log").read_text()
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("done before, skipped") == 2
    assert (out / "smoke" / "base" / "train.log").read_text() == log


REVERSE_CONFIG = """from configs import smoke


def get_config():
    config = smoke.get_config()
    config.data.source_lang, config.data.target_lang = "en", "de"
    return config
"""
NBEST = """[nbest]
reverse = { smoke = "smoke_en_de" }
beam_sizes = [2]
weights = [0, 1000]
utilities = ["bleu"]
"""


@pytest.mark.long  # a run of scripts/sweep.py: four smoke trainings and their readings
def test_nbest_reranks_each_seed_with_the_same_seed_trained_the_other_way(tmp_path):
    """[nbest]: once both directions' runs are done, each seed of the forward one reads
    its n-best lists reranked with the same seed of the reverse run (evaluation.nbest), at
    [read]'s checkpoint; the run.json holds the seeds' mean of each reading, and the same
    command again reads nothing twice."""
    (tmp_path / "smoke_en_de.py").write_text(REVERSE_CONFIG)
    plan = SETTINGS + NBEST + f"""[directions]
smoke = "configs/smoke.py"
smoke_en_de = "{tmp_path / 'smoke_en_de.py'}"
[[variants]]
name = "base"
"""
    runs, out, argv, records, printed = run_sweep(tmp_path, plan)
    forward, backward = records
    assert [(r["direction"], r["status"]) for r in records] == [("smoke", "done"),
                                                                ("smoke_en_de", "done")]
    assert "nbest" not in backward  # en->de has no reverse in the plan
    label = "nbest.valid.last.reverse_smoke_en_de"
    nbest = forward["nbest"]
    assert nbest["label"] == label and nbest["reverse"] == "smoke_en_de/base"
    assert nbest["exit_codes"] == {"seed0": 0, "seed1": 0}
    assert "--reverse_workdir " + str(runs / "smoke_en_de" / "base" / "seed1") in \
        nbest["commands"]["seed1"]
    selections = ["top1", "mbr-bleu", "reverse0", "reverse1000"]
    assert [r["label"] for r in nbest["readings"]] == [f"beam2.{s}" for s in selections]
    per_seed = {}
    for k in (0, 1):
        result = json.loads((out / "smoke" / "base" / f"seed{k}" / "eval" / f"{label}.json")
                            .read_text())
        # the same seed of the reverse run, read as the forward one: its newest checkpoint
        assert Path(result["reverse"]["workdir"]) == runs / "smoke_en_de" / "base" / f"seed{k}"
        assert result["workdir"] == str(runs / "smoke" / "base" / f"seed{k}")
        assert result["checkpoint"]["steps"] == result["reverse"]["checkpoint"]["steps"] == [4]
        assert result["num_sentences"] == 8
        per_seed[k] = {r["label"]: r for r in result["readings"]}
    for reading in nbest["readings"]:
        values = [per_seed[k][reading["label"]]["bleu_lc_tok"] for k in (0, 1)]
        assert reading["bleu_lc_tok"] == pytest.approx(sum(values) / 2)
        assert reading["per_seed"]["seed1"]["bleu_lc_tok"] == values[1]
    # top1 is beam search's own answer: reranking at weight 0 keeps it, changing nothing
    assert per_seed[0]["beam2.reverse0"]["changed"] == per_seed[0]["beam2.top1"]["changed"] == 0
    assert "n-best beam2.reverse1000" in printed

    log = (out / "smoke" / "base" / "nbest.log").read_text()
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (out / "smoke" / "base" / "nbest.log").read_text() == log


TEACHER_PLAN = SETTINGS + """[distill]
length_penalty = 0.6
[directions]
smoke = "configs/smoke.py"
[[variants]]
name = "base"
[[variants]]
name = "kd"
teacher = "base"
overrides = { "data.distilled_mix" = "replace" }
"""


def test_a_student_plan_names_an_earlier_teacher_of_the_same_text(tmp_path):
    plan_file = tmp_path / "p.toml"
    plan_file.write_text(TEACHER_PLAN)
    plan = sweep_plan.load_plan(plan_file)
    assert [(r["teacher"], r["teaches"]) for r in sweep_plan.runs_of(plan)] == [
        (None, True), ("base", False)]
    # The teacher decodes as the plan reads, at its own length penalty.
    assert plan["distill"] == {"checkpoint": "last", "beam_size": 1, "length_penalty": 0.6}
    lc = '"data.text_protocol" = "lc_norm_tok"'
    for bad, why in [
            (TEACHER_PLAN.replace('teacher = "base"', 'teacher = "kd"'), "not a variant listed before"),
            (TEACHER_PLAN.replace('teacher = "base"', 'teacher = "x"'), "not a variant listed before"),
            (TEACHER_PLAN.replace('[directions]\n', '[directions]\nother = "configs/smoke.py"\n')
             .replace('name = "base"', 'name = "base"\ndirections = ["smoke"]'), "does not"),
            (TEACHER_PLAN.replace('"replace" }', f'"replace", {lc} }}'), "text_protocol"),
            (TEACHER_PLAN.replace('"replace" }', '"replace", "data.distilled_targets" = "t" }'),
             "set by the sweep"),
            (TEACHER_PLAN.replace("length_penalty = 0.6", "beam = 4"), r"\[distill\] takes")]:
        plan_file.write_text(bad)
        with pytest.raises(sweep_plan.PlanError, match=why):
            sweep_plan.load_plan(plan_file)


# Two decoding batches (smoke: eval.batch_size 64); an untrained teacher decodes every line
# to its length limit, so each pair costs.
PAIRS = 100


@pytest.mark.long
def test_a_student_trains_on_its_teachers_ensemble_translation(tmp_path):
    """Teacher (2 seeds) -> `evaluate.py --split train --ensemble` -> student, on a small
    `text` corpus with a blank source line: the teacher writes one line per training pair
    as read, and the student's data is exactly that text. With `--parallel 2` the student
    waits for its teacher."""
    sources, targets = corpora.read_split(smoke.get_config().data, "train")
    sources, targets = sources[:PAIRS], targets[:PAIRS]
    sources[3] = ""
    valid = corpora.read_split(smoke.get_config().data, "valid")
    for name, lines in {"train.de": sources, "train.en": targets,
                        "val.de": valid[0][:16], "val.en": valid[1][:16]}.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = {"data.dataset": '"text"', "data.max_train_sentences": 0,
            **{f"data.{split}_{side}": f'"{tmp_path / f"{file}.{lang}"}"'
               for split, file in (("train", "train"), ("valid", "val"))
               for side, lang in (("source", "de"), ("target", "en"))}}
    plan = TEACHER_PLAN.replace('"train.num_steps" = 4', '"train.num_steps" = 4\n' + "\n".join(
        f'"{k}" = {v}' for k, v in data.items()))
    runs, out, argv, records, _ = run_sweep(tmp_path, plan, "--parallel", "2")
    assert [(r["variant"], r["status"]) for r in records] == [("base", "done"), ("kd", "done")]
    teacher = records[1]["teacher"]
    label = "teacher.train.last.beam1.lp0.6.ens2"
    hyp = runs / "smoke" / "base" / "seed0" / "eval" / f"{label}.hyp.txt"
    assert teacher["file"] == str(hyp.resolve()) and teacher["exit_code"] == 0
    assert teacher["num_sentences"] == PAIRS and teacher["bleu"] is not None
    # The teacher translated as soon as it was done; its run.json records the text.
    assert records[0]["teaches"] == {k: v for k, v in teacher.items() if k != "file"}
    assert teacher["label"] == label and teacher["text"] == f"{label}.hyp.txt.gz"
    lines = hyp.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == PAIRS and lines[3] == ""  # the blank source's line is kept, empty
    decoded = json.loads(hyp.with_name(hyp.name.replace(".hyp.txt", ".json")).read_text())
    assert decoded["split"] == "train" and len(decoded["ensemble"]) == 2
    assert decoded["decoding"]["length_penalty"] == 0.6
    with gzip.open(out / "smoke" / "base" / teacher["text"], "rt") as f:
        assert f.read() == hyp.read_text(encoding="utf-8")
    for k in (0, 1):
        config = json.loads((runs / "smoke" / "kd" / f"seed{k}" / "config.json").read_text())
        assert config["data"]["distilled_targets"] == teacher["file"]
        got = corpora.load_corpus(ml_collections.ConfigDict(config["data"]), "train")
        keep = [i for i in range(PAIRS) if sources[i] and lines[i]]
        assert got == ([sources[i] for i in keep], [lines[i] for i in keep])

    # The student again (its record gone): the teacher's file is reused, not decoded again.
    (out / "smoke" / "kd" / "run.json").unlink()
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "translated the training split" not in again.stdout
    record = json.loads((out / "smoke" / "kd" / "run.json").read_text())
    assert record["teacher"]["file"] == teacher["file"] and record["teacher"]["exit_code"] == 0

    # Another machine, given these results without the student's (`--earlier`): the
    # teacher is skipped, and the student trains on its text, unpacked: no checkpoint of
    # the teacher is there to decode with.
    shutil.rmtree(out / "smoke" / "kd")
    runs2, out2, _, records2, printed = run_sweep(tmp_path, plan, "--earlier", str(out),
                                                  machine="2")
    assert "1 run(s) done earlier" in printed and "base done before, skipped" in printed
    assert "translated the training split" not in printed
    assert [(r["variant"], r["status"]) for r in records2] == [("base", "done"), ("kd", "done")]
    assert not (runs2 / "smoke" / "base" / "seed0" / "checkpoints").exists()
    unpacked = runs2 / "smoke" / "base" / "seed0" / "eval" / f"{label}.hyp.txt"
    assert records2[1]["teacher"]["file"] == str(unpacked.resolve())
    assert unpacked.read_text(encoding="utf-8") == hyp.read_text(encoding="utf-8")
    config = json.loads((runs2 / "smoke" / "kd" / "seed0" / "config.json").read_text())
    assert config["data"]["distilled_targets"] == str(unpacked.resolve())


def test_runs_done_on_an_earlier_machine_are_copied_and_nothing_else(tmp_path):
    earlier, out = tmp_path / "earlier", tmp_path / "out"
    for name, status in (("a/done", "done"), ("a/failed", "failed"), ("b/here", "done")):
        (earlier / name / "seed0").mkdir(parents=True)
        (earlier / name / "run.json").write_text(json.dumps({"status": status}))
        (earlier / name / "seed0" / "metrics.jsonl").write_text("{}\n")
    (out / "b" / "here").mkdir(parents=True)  # this machine's own record wins
    (out / "b" / "here" / "run.json").write_text(json.dumps({"status": "training"}))
    assert sweep.copy_earlier(earlier, out) == ["a/done"]
    assert (out / "a" / "done" / "seed0" / "metrics.jsonl").read_text() == "{}\n"
    assert not (out / "a" / "failed").exists()
    assert json.loads((out / "b" / "here" / "run.json").read_text())["status"] == "training"


def test_an_earlier_folder_that_is_not_there_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "plan.toml").write_text(PLAN)
    done = subprocess.run([sys.executable, "scripts/sweep.py", str(tmp_path / "plan.toml"),
                           "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                           "--earlier", str(tmp_path / "nowhere")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().endswith("not a folder")
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.toml"]


@pytest.mark.long
def test_an_interrupted_sweep_stops_its_trainings_saved_and_the_same_command_goes_on(tmp_path):
    """SIGINT to the sweep (as gpu_window.py sends at its deadline): each training running
    gets one SIGINT and saves, nothing new starts, the sweep exits 130; the same command
    then resumes the run from that checkpoint to the end."""
    plan = tmp_path / "plan.toml"
    # 600 steps: the SIGINT (sent at step 20) lands long before the end on any machine
    # that runs these tests, and the resumed run is short.
    plan.write_text(PLAN.replace('"train.num_steps" = 4', '"train.num_steps" = 600')
                    .replace('"checkpoint.every_steps" = 2', '"checkpoint.every_steps" = 500'))
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [sys.executable, "scripts/sweep.py", str(plan), "--runs", str(runs), "--out",
            str(out), "--only", "base"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    metrics = runs / "smoke" / "base" / "seed1" / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.is_file() and '"step": 20' in metrics.read_text()):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130 and stderr.strip().splitlines() == ["sweep: interrupted"]
    record = json.loads((out / "smoke" / "base" / "run.json").read_text())
    assert record["train"]["ended"] == "interrupted" and record["status"] == "failed"
    assert record["evaluations"] == [] or all(e["exit_code"] == 130
                                              for e in record["evaluations"])
    saved = {k: sweep.checkpoint_steps(runs / "smoke" / "base" / f"seed{k}") for k in (0, 1)}
    assert all(steps and 20 <= steps[-1] < 600 for steps in saved.values()), saved
    assert not (runs / "smoke" / "base" / "eval").exists()  # no evaluation started

    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    record = json.loads((out / "smoke" / "base" / "run.json").read_text())
    assert record["status"] == "done" and record["train"]["steps"] == {"seed0": 600,
                                                                       "seed1": 600}
    log = (out / "smoke" / "base" / "train.log").read_text()
    assert f"resuming from step {saved[0][-1]}" in log


@pytest.mark.long
def test_a_run_at_its_own_time_limit_is_done_and_one_cut_by_the_deadline_goes_on(tmp_path):
    """`time_limit_minutes` is part of a variant: reached, the run is read and done, and a
    rerun skips it. The sweep's deadline is not: its run is read at its newest
    checkpoint, marked "cut", and the same command trains it on from there."""
    plan = PLAN.replace('"train.num_steps" = 4', '"train.num_steps" = 100000').replace(
        '"checkpoint.every_steps" = 2', '"checkpoint.every_steps" = 20').replace(
        'name = "base"', 'name = "base"\ntime_limit_minutes = 0.5')
    deadline = ("--deadline_minutes", "1.25", "--read_minutes", "0.25")
    runs, _, _, records, printed = run_sweep(tmp_path, plan, *deadline, "--only", "no_dropout",
                                             check=False)
    assert [(r["variant"], r["train"]["ended"], r["status"]) for r in records] == [
        ("no_dropout", "deadline", "cut")], printed
    cut = records[0]  # read at the newest step both seeds saved (each saved where the
    # deadline's SIGINT found it); the deadline may cut a reading too
    common = set.intersection(*(set(sweep.checkpoint_steps(runs / "smoke" / "no_dropout" / s))
                                for s in ("seed0", "seed1")))
    assert cut["evaluations"][0]["checkpoint"] == str(max(common))

    # Both side by side: base stops at its own limit, no_dropout at the deadline again,
    # trained on from where it was cut. The deadline leaves base room to be read even
    # where the driver's SIGKILL a minute after an unheeded SIGINT ended it (seen once on
    # a loaded CI machine, before training/together.py's main thread waited in slices;
    # the logs' tails below say where the runs were, if it recurs).
    _, out, argv, records, printed = run_sweep(
        tmp_path, plan, "--deadline_minutes", "2", "--read_minutes", "0.25", "--parallel", "2",
        check=False)
    logs = "".join(f"\n--- {log.parent.name} train.log, its end:\n{log.read_text()[-1500:]}"
                   for log in sorted((out / "smoke").glob("*/train.log")))
    assert [(r["variant"], r["train"]["ended"], r["status"]) for r in records] == [
        ("base", "time limit", "done"), ("no_dropout", "deadline", "cut")], printed + logs
    log = (out / "smoke" / "no_dropout" / "train.log").read_text()
    assert f"resuming from step {cut['train']['steps']['seed0']}" in log
    again = subprocess.run([*argv, "--only", "base"], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "base done before, skipped" in again.stdout
