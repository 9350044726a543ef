"""scripts/sweep.py: a plan's variants x seeds trained together, read on validation and
collected in one folder, end to end on the smoke config; rerunning skips finished runs."""

import json
import subprocess
import sys
import tarfile

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import sweep  # noqa: E402

PLAN = """
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
[directions]
smoke = "configs/smoke.py"
[[variants]]
name = "base"
[[variants]]
name = "no_dropout"
overrides = { "model.dropout" = 0.0 }
pack = true
"""


def test_plan_reading(tmp_path):
    plan_file = tmp_path / "p.toml"
    plan_file.write_text(PLAN)
    plan = sweep.load_plan(plan_file)
    assert plan["seeds"] == [0, 1] and plan["read"]["splits"] == ["valid"]
    runs = sweep.runs_of(plan)
    assert [(r["direction"], r["variant"], r["pack"]) for r in runs] == [
        ("smoke", "base", False), ("smoke", "no_dropout", True)]
    assert runs[1]["overrides"]["model.dropout"] == 0.0  # the plan's and the variant's
    assert runs[1]["overrides"]["train.num_steps"] == 4
    assert "--config.attention_maps.enabled=False" in sweep.override_flags(runs[0]["overrides"])
    assert [r["variant"] for r in sweep.runs_of(plan, {"no_dropout"})] == ["no_dropout"]
    # The anchors' plan reads: 3 seeds, each variant over its directions.
    anchors = sweep.load_plan(REPO / "scripts" / "plans" / "anchors.toml")
    assert anchors["seeds"] == [0, 1, 2] and len(sweep.runs_of(anchors)) >= 3
    for bad, why in [(PLAN.replace("seeds = 2", "seeds = [1, 2]"), "seeds must be"),
                     (PLAN.replace('name = "no_dropout"', 'name = "base"'), "a name of its own"),
                     (PLAN + '[[variants]]\nname = "x"\ndirections = ["fr"]\n', "unknown"),
                     ("seeds = [", "cannot read")]:
        plan_file.write_text(bad)
        with pytest.raises(sweep.PlanError, match=why):
            sweep.load_plan(plan_file)


def test_read_step_of_a_run_stopped_early(tmp_path):
    for seed, steps in ((0, [2, 4, 6]), (1, [2, 4])):
        for step in steps:
            (tmp_path / f"seed{seed}" / "checkpoints" / str(step)).mkdir(parents=True)
    assert sweep.read_step(tmp_path, [0, 1], "last", finished=True) == "last"
    assert sweep.read_step(tmp_path, [0, 1], "last", finished=False) == "4"
    assert sweep.read_step(tmp_path, [0, 1], "2", finished=False) == "2"


@pytest.mark.slow
def test_smoke_sweep_end_to_end_and_resumed(tmp_path):
    plan_file = tmp_path / "smoke_plan.toml"
    plan_file.write_text(PLAN)
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [sys.executable, "scripts/sweep.py", str(plan_file), "--runs", str(runs),
            "--out", str(out)]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    records = json.loads((out / "sweep.json").read_text())["runs"]
    assert [(r["variant"], r["status"]) for r in records] == [("base", "done"),
                                                              ("no_dropout", "done")]
    for record in records:
        assert record["train"] == {**record["train"], "exit_code": 0, "ended": "finished",
                                   "steps": {"seed0": 4, "seed1": 4}}
        (evaluation,) = record["evaluations"]
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
