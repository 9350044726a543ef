"""scripts/export_pretrained.py: the compact copy translates as its run does, holds no
machine's folders in its config, and never overwrites."""

import json
import shutil

from conftest import run_module, run_script

from configs.multi30k_de_en_cpu_kd import TEACHER


def test_an_export_translates_as_its_run_and_names_repository_paths_relatively(
        smoke_workdir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(smoke_workdir, run, ignore=shutil.ignore_patterns("eval"))
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    # As a distilled config writes it: the teacher's text by its absolute path.
    config["data"]["distilled_targets"] = str(TEACHER)
    config["data"]["valid_source"] = "/elsewhere/val.de"  # outside the repository: kept
    (run / "config.json").write_text(json.dumps(config), encoding="utf-8")
    out = tmp_path / "exported"
    result = run_module("scripts.export_pretrained", "--workdir", str(run), "--out", str(out),
                        "--dtype", "float32")
    assert result.returncode == 0, result.stderr[-3000:]
    exported = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert exported["data"]["distilled_targets"] == (
        "data/multi30k/distilled/train.de_en_cpu_ens3.en.gz")
    assert exported["data"]["valid_source"] == "/elsewhere/val.de"
    assert {k: v for k, v in exported.items() if k != "data"} == {
        k: v for k, v in config.items() if k != "data"}
    assert not (out.parent / "exported.partial").exists()

    source = tmp_path / "src.txt"
    source.write_text("ein Hund läuft .\nzwei Männer spielen Fußball .\n", encoding="utf-8")
    hyps = {}
    for name, workdir in (("run", run), ("exported", out)):
        result = run_script("evaluate.py", "--workdir", str(workdir), "--source", str(source),
                            "--beam_size", "2", "--checkpoint", "last", "--name", "two")
        assert result.returncode == 0, result.stderr[-3000:]
        hyps[name] = (workdir / "eval" / "two.hyp.txt").read_text(encoding="utf-8")
    assert hyps["exported"] == hyps["run"]  # float32: the same parameters, the same text

    again = run_module("scripts.export_pretrained", "--workdir", str(run), "--out", str(out))
    assert again.returncode != 0 and "already exists" in again.stderr
    assert again.stderr.strip().count("\n") == 0
