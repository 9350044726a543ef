"""scripts/gpu_window.{sh,py}, the lent-GPU window's one command, tried on the CPU with the
smoke config: the recipe and seeds phases write their JSONs and bring back the measured
runs' metrics, a later call's sweep goes on from an earlier call's, a later window's from
the results an earlier window brought back, and the shell wrapper hands everything back
as one archive in parts."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gpu_window  # noqa: E402

SMOKE = ("--config", "configs/smoke.py", "--steps", "40", "--log_every", "10")


@pytest.mark.long
def test_recipe_and_seeds_phases_on_the_smoke_config(tmp_path):
    results, work = tmp_path / "out" / "results" / "bench", tmp_path / "work"
    done = subprocess.run(
        [sys.executable, "scripts/gpu_window.py", *SMOKE, "--phases", "recipe,seeds",
         # 30 steps, logs every 10: the window ending at step 30 holds the end's
         # validation, so 10-20 is the steady window.
         "--seeds", "2", "--seed_steps", "30", "--seeds_override=--config.data.pack_length=64",
         # As the recipes: saves every 5 steps over the last 10 (the seeds phase makes none).
         "--override=--config.checkpoint.last_every_steps=5",
         "--results", str(results), "--work", str(work), "--deadline_s", "500"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    recipe = json.loads((results / "gpu_tiny_recipe_time_to_result.json").read_text())
    assert recipe["device"] and recipe["warmup"]["exit_code"] == 0
    run = recipe["run"]
    assert (run["exit_code"], run["last_step"], run["projected"]) == (0, 40, False)
    assert run["launch_to_last_step_s"] == run["launch_to_exit_s"] > 0
    assert run["ms_per_step_steady"] > 0 and "40" in run["valid_bleu"]
    assert set(run["validation_hook_s"]) == {"20", "40"} and min(run["validation_hook_s"].values()) > 0
    assert set(run["validation_parts_s"]) == {"20", "40"}
    assert all(min(parts.values()) > 0 for parts in run["validation_parts_s"].values())
    assert run["seconds_in_hooks"]["validate"] > 0 and run["seconds_in_hooks"]["checkpoint"] > 0

    seeds = json.loads((results / "gpu_seeds_together.json").read_text())
    assert seeds["overrides"] == ["--config.data.pack_length=64"]
    assert seeds["one_seed"]["exit_code"] == 0 and seeds["together"]["exit_code"] == 0
    assert "--together" in seeds["together"]["command"]
    assert "--together" not in seeds["one_seed"]["command"]
    by_seed = seeds["together"]["ms_per_step_by_seed"]
    assert len(by_seed) == 2 and all(ms > 0 for ms in by_seed)
    assert seeds["ratio_together_to_one"] == pytest.approx(
        max(by_seed) / seeds["one_seed"]["ms_per_step"], rel=1e-2)

    # The seeds phase times steps between logs: its runs save once, at their end.
    for workdir in (work / "one_seed", work / "seeds" / "seed0", work / "seeds" / "seed1"):
        assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["30"], workdir

    two = seeds["two_processes"]
    assert [r["exit_code"] for r in two["runs"]] == [0, 0] and len(two["ms_per_step"]) == 2
    assert "ratio_two_processes_to_one" in seeds

    runs = results.parent / "runs"
    for name in ("recipe_run", "seeds_one", "seeds_together_seed0", "seeds_together_seed1"):
        steps = [json.loads(line)["step"] for line in
                 (runs / f"{name}.metrics.jsonl").read_text().splitlines()]
        assert steps[-1] == (40 if name == "recipe_run" else 30), name
    assert {p.name for p in (results.parent / "logs").iterdir()} >= {
        "recipe_warmup.log", "recipe_run.log", "one_seed.log", "seeds.log"}


def write_log(workdir, times_and_steps):
    workdir.mkdir(parents=True)
    (workdir / "metrics.jsonl").write_text("".join(
        json.dumps({"split": "train", "time": t, "step": step}) + "\n"
        for t, step in times_and_steps))


def test_side_by_side_runs_are_timed_over_the_span_they_share(tmp_path):
    """Run a steps alone (10 ms a step) until b starts, then both at 20 ms a step; b goes on
    alone after a ends: only the shared span counts."""
    write_log(tmp_path / "a", [(0.0, 100), (1.0, 200), (2.0, 300), (4.0, 400), (6.0, 500)])
    write_log(tmp_path / "b", [(2.0, 110), (4.0, 210), (6.0, 310), (6.5, 410)])
    assert gpu_window.overlap_ms_per_step([tmp_path / "a", tmp_path / "b"]) == [
        pytest.approx(20.0), pytest.approx(20.0)]
    assert gpu_window.overlap_ms_per_step([tmp_path / "a", tmp_path / "none"]) == [None, None]


def test_the_saves_phase_runs_the_save_benchmark_on_the_windows_config(tmp_path, monkeypatch):
    """Its command (bench/save_stall.py itself is smoke-tested in tests/test_bench.py)."""
    calls = []
    monkeypatch.setattr(gpu_window, "run_process",
                        lambda argv, log, limit: calls.append((argv, log, limit)) or (0, False))
    args = gpu_window.argparse.Namespace(config="configs/smoke.py", results=tmp_path / "bench",
                                         work=tmp_path / "work")
    assert gpu_window.phase_saves(args, lambda: 100.0) == (0, False)
    (tree, tree_log, limit), (flat, flat_log, _) = calls  # the recipe's layout, then flat
    for argv in (tree, flat):
        assert argv[1:3] == ["bench/save_stall.py", "--config"] and argv[3] == "configs/smoke.py"
        assert "--profile" in argv
    assert "--flat_optimizer" not in tree and "--flat_optimizer" in flat
    assert [argv[argv.index("--json") + 1] for argv in (tree, flat)] == [
        str(tmp_path / "bench" / f"gpu_save_stall{layout}.json") for layout in ("", "_flat")]
    assert (tree_log, flat_log) == (tmp_path / "work" / "saves.log",
                                    tmp_path / "work" / "saves_flat.log") and limit == 100.0


def test_a_validation_is_timed_from_the_train_event_of_its_step():
    """The log runs after the step's validation, so the train event of its step holds the
    validation hook's seconds; the attention maps it recorded are not the validation's."""
    log = [{"split": "valid", "step": 100, "time": 13.5},
           {"split": "train", "step": 100, "time": 14.0, "seconds_in_validate": 3.5},
           {"split": "train", "step": 200, "time": 20.0, "seconds_in_validate": 0.0},
           {"split": "valid", "step": 250, "time": 30.0}]
    assert gpu_window.validation_hook_seconds(log) == {"100": 3.5}  # 250 has no train event
    log[0]["seconds_maps"] = 1.25
    assert gpu_window.validation_hook_seconds(log) == {"100": 2.25}


def test_steady_steps_leave_out_the_windows_that_hold_a_validation(tmp_path):
    """A validation at step v runs before v's log: the window ending at v holds it."""
    write_log(tmp_path / "run", [(0.0, 100), (1.0, 200), (5.0, 300), (6.0, 400)])
    with (tmp_path / "run" / "metrics.jsonl").open("a") as file:
        file.write(json.dumps({"split": "valid", "step": 300, "time": 4.5}) + "\n")
    assert gpu_window.steady_ms_per_step(tmp_path / "run") == pytest.approx(10.0)


def test_the_hooks_seconds_are_summed_over_the_runs_train_events():
    train = [{"step": 50, "seconds_in_log": 0.25, "seconds_in_checkpoint": 0.0},
             {"step": 100, "seconds_in_log": 0.5, "seconds_in_checkpoint": 1.75, "loss": 2.0}]
    assert gpu_window.hook_seconds(train) == {"log": 0.75, "checkpoint": 1.75}


def test_the_sweep_runs_side_by_side_only_where_the_window_measured_it_pays():
    ratio = lambda r: {"ratio_two_processes_to_one": r}  # noqa: E731
    assert gpu_window.sweep_parallel("auto", ratio(1.2)) == 2
    assert gpu_window.sweep_parallel("auto", ratio(1.7)) == 1
    assert gpu_window.sweep_parallel("auto", ratio(None)) == 1
    assert gpu_window.sweep_parallel("auto", None) == 1  # no seeds phase in this call
    assert gpu_window.sweep_parallel("3", ratio(1.7)) == 3


PLAN = """
seeds = 1
[overrides]
"train.num_steps" = 4
"eval.every_steps" = 0
"checkpoint.every_steps" = 2
"attention_maps.enabled" = false
[read]
beam_size = 1
max_sentences = 8
[directions]
smoke = "configs/smoke.py"
[[variants]]
name = "base"
"""


@pytest.mark.long
def test_a_later_calls_sweep_skips_what_an_earlier_call_did(tmp_path):
    """The sweep trains in folders kept between calls (--sweep_runs, --sweep_out); each
    call hands back every result so far, its own and the earlier calls'. A later window,
    on a fresh machine, goes on from what an earlier one brought back (--sweep_earlier:
    by default results/sweep/<plan>, where the hand-back lands in the repository)."""
    (tmp_path / "plan.toml").write_text(PLAN)
    argv = [sys.executable, "scripts/gpu_window.py", "--phases", "sweep",
            "--plan", str(tmp_path / "plan.toml"), "--work", str(tmp_path / "work"),
            "--sweep_earlier", str(tmp_path / "first" / "results" / "sweep" / "plan")]
    for call, machine in (("first", "a"), ("second", "a"), ("later window", "b")):
        results = tmp_path / call / "results" / "bench"
        done = subprocess.run([*argv, "--results", str(results),
                               "--sweep_runs", str(tmp_path / machine / "runs"),
                               "--sweep_out", str(tmp_path / machine / "kept")],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        record = json.loads((results.parent / "sweep" / "plan" / "smoke" / "base" / "run.json")
                            .read_text())
        assert record["status"] == "done" and record["evaluations"][0]["bleu"] is not None
    logs = [(tmp_path / call / "results" / "logs" / "sweep.log").read_text()
            for call in ("first", "second", "later window")]
    assert "done before, skipped" not in logs[0]
    assert all("done before, skipped" in log for log in logs[1:])
    assert "1 run(s) done earlier" in logs[2] and not (tmp_path / "b" / "runs").exists()


def test_the_sweep_runs_the_variants_named(tmp_path):
    """--sweep_only reaches sweep.py as --only (e.g. the plan's `recipe` variant alone);
    without it every variant runs, in the seconds the window has left."""
    import argparse

    args = argparse.Namespace(plan="scripts/plans/anchors.toml", sweep_runs=tmp_path / "r",
                              sweep_out=tmp_path / "o", sweep_only="recipe", sweep_pack=False,
                              sweep_earlier=tmp_path / "missing")
    argv = gpu_window.sweep_argv(args, 300, 1)
    assert argv[argv.index("--only") + 1] == "recipe"
    assert argv[argv.index("--deadline_minutes") + 1] == "5.00"
    assert "--earlier" not in argv  # no earlier results here
    args.sweep_only = ""
    assert "--only" not in gpu_window.sweep_argv(args, 300, 1)


def test_the_wrapper_hands_back_one_archive_in_parts(tmp_path):
    """gpu_window.sh (no phase): the machine check of device_env.sh passes here, and what
    gpu_window.py left under $OUT/results comes back as gpu_window.tgz.part00, ..."""
    shims = tmp_path / "bin"
    shims.mkdir()
    shim = shims / "python3"  # device_env.sh and gpu_window.sh call `python3`
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "NO_WHL": "1",
           "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "scripts/gpu_window.sh", "--phases", "",
                           "--work", str(tmp_path / "work")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_window.tgz.part00"]
    whole = tmp_path / "whole.tgz"
    whole.write_bytes(b"".join(p.read_bytes() for p in sorted(out.glob("gpu_window.tgz.part*"))))
    with tarfile.open(whole) as archive:
        assert "results/bench" in archive.getnames()


def test_the_compile_phase_runs_each_variant_cold_with_its_flags(tmp_path, monkeypatch):
    """Each variant: its own workdir and empty compilation cache, its flags after the
    window's (XLA reads the last of a repeated flag), and its run's figures collected."""
    calls = []

    def fake_run(argv, log, limit, env=None):
        workdir = Path(argv[argv.index("--workdir") + 1])
        calls.append((argv, env, (workdir.parent / "xla_cache").exists()))
        workdir.mkdir(parents=True)
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
            {"split": "train", "step": 100, "time": 1.0, "compile_seconds": 20.0},
            {"split": "train", "step": 200, "time": 2.0, "compile_seconds": 20.5,
             "seconds_in_validate": 0.0, "seconds_in_checkpoint": 0.0},
            {"split": "valid", "step": 300, "time": 3.5, "bleu": 12.5},
            {"split": "train", "step": 300, "time": 4.0, "compile_seconds": 20.5,
             "seconds_in_validate": 1.5, "seconds_in_checkpoint": 0.25}]))
        return 0, False

    monkeypatch.setattr(gpu_window, "run_process", fake_run)
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    stale = tmp_path / "work" / "compile" / "fast" / "xla_cache"
    stale.mkdir(parents=True)  # an earlier call's programs must not make the launch warm
    args = gpu_window.argparse.Namespace(
        config="configs/smoke.py", override=["--config.data.pack_length=64"], compile_steps=300,
        compile_variant=["window=", "fast=--xla_gpu_autotune_level=4"], log_every=100,
        results=tmp_path / "bench", work=tmp_path / "work")
    result = gpu_window.phase_compile(args, lambda: 100.0)

    assert [env["XLA_FLAGS"] for _, env, _ in calls] == [
        "--xla_gpu_autotune_level=0", "--xla_gpu_autotune_level=0 --xla_gpu_autotune_level=4"]
    assert [env["JAX_COMPILATION_CACHE_DIR"] for _, env, _ in calls] == [
        str(tmp_path / "work" / "compile" / name / "xla_cache") for name in ("window", "fast")]
    assert [cache_left for _, _, cache_left in calls] == [False, False]
    for argv, _, _ in calls:
        assert "--config.train.num_steps=300" in argv and "--config.data.pack_length=64" in argv
        assert "--config.checkpoint.last_every_steps=0" in argv
    run = result["runs"]["fast"]
    assert (run["compile_seconds"], run["ms_per_step_steady"]) == (20.5, 10.0)
    assert run["valid_bleu"] == {"300": 12.5} and run["seconds_in_hooks"]["checkpoint"] == 0.25
    assert run["validation_hook_s"] == {"300": 1.5}
    assert (tmp_path / "runs" / "compile_fast.metrics.jsonl").is_file()


@pytest.mark.parametrize("variant", ["--xla_foo=1", "fast", "=--xla_foo=1"])
def test_a_compile_variant_without_a_name_is_refused_before_anything_runs(tmp_path, capsys,
                                                                         variant):
    code = gpu_window.main(["--phases", "compile", f"--compile_variant={variant}",
                            "--results", str(tmp_path / "r"), "--work", str(tmp_path / "w")])
    assert code == 2 and "NAME=XLA_FLAGS" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()
