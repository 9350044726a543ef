"""The model shipped in pretrained/ is the real one: evaluate.py reads it as a workdir,
unchanged, and translates the first 100 test sentences to the BLEU its result file
states (results/pretrained_de_en_cpu_test100.json, written by the same command)."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import run_script

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "pretrained" / "de_en_cpu"
STATED = ROOT / "results" / "pretrained_de_en_cpu_test100.json"


def first_lines(path: Path, n: int) -> str:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return "".join(next(f) for _ in range(n))


@pytest.mark.slow  # beam search over the whole test set: 25-30 s
@pytest.mark.skipif(not MODEL.is_dir(), reason="no shipped model in pretrained/de_en_cpu")
def test_shipped_model_translates_the_test_set_to_its_stated_bleu(tmp_path):
    stated = json.loads(STATED.read_text(encoding="utf-8"))
    workdir = tmp_path / "de_en_cpu"  # a copy: evaluate.py writes eval/ into the workdir
    shutil.copytree(MODEL, workdir, ignore=shutil.ignore_patterns("eval"))
    data = ROOT / "data" / "multi30k"
    (tmp_path / "src.de").write_text(first_lines(data / "test_2016_flickr.de.gz", 100))
    (tmp_path / "ref.en").write_text(first_lines(data / "test_2016_flickr.en.gz", 100))
    result = run_script("evaluate.py", "--workdir", str(workdir),
                        "--source", str(tmp_path / "src.de"),
                        "--reference", str(tmp_path / "ref.en"),
                        "--beam_size", str(stated["decoding"]["beam_size"]),
                        "--length_penalty", str(stated["decoding"]["length_penalty"]),
                        "--name", "test100")
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads((workdir / "eval" / "test100.json").read_text(encoding="utf-8"))
    assert got["checkpoint_step"] == stated["checkpoint_step"]
    assert got["num_sentences"] == 100
    # Same parameters, same decoding: BLEU agrees up to float summation order across
    # CPUs; a model that loaded wrongly scores far off.
    assert got["bleu"] == pytest.approx(stated["bleu"], abs=0.3)
    assert got["chrf"] == pytest.approx(stated["chrf"], abs=0.3)


@pytest.mark.skipif(not MODEL.is_dir(), reason="no shipped model in pretrained/de_en_cpu")
def test_shipped_model_translates_stdin(tmp_path):
    workdir = tmp_path / "de_en_cpu"
    shutil.copytree(MODEL, workdir, ignore=shutil.ignore_patterns("eval"))
    result = run_script("evaluate.py", "--workdir", str(workdir), "--source", "-",
                        "--beam_size", "5", "--save_attention", "1",
                        input="Ein Hund rennt durch den Schnee.\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()  # one English line
    assert list((workdir / "eval").glob("*.attention.npz"))


def test_training_refuses_to_resume_an_exported_model(tmp_path):
    """An exported checkpoint holds no optimizer state: train.py says so in one line."""
    if not MODEL.is_dir():
        pytest.skip("no shipped model in pretrained/de_en_cpu")
    workdir = tmp_path / "de_en_cpu"
    shutil.copytree(MODEL, workdir, ignore=shutil.ignore_patterns("eval"))
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    result = run_script("train.py", "--config", "configs/multi30k_de_en_cpu.py",
                        "--workdir", str(workdir))
    assert result.returncode == 2
    assert "exported" in result.stderr and result.stderr.count("\n") == 1
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before
