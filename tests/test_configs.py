"""Tests of configs/: experiment files, absl overrides, one-line CLI errors, config.json."""

import json
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from configs import base, cli
from configs.errors import UserError
from data.corpora import DataError

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ["multi30k_de_en", "multi30k_de_en_cpu", "multi30k_en_de", "multi30k_en_fr",
               "tatoeba_de_en", "iwslt2017_de_en", "smoke"]
REQUIRED = ["data.dataset", "data.source_lang", "data.target_lang", "data.vocab_size",
            "data.max_length", "model.d_model", "model.num_heads", "model.num_encoder_layers",
            "model.num_decoder_layers", "model.d_ff", "model.dropout", "model.attention_dropout",
            "train.num_steps", "train.batch_tokens", "train.learning_rate", "train.warmup_steps",
            "train.seed", "train.label_smoothing", "eval.every_steps", "eval.beam_size",
            "checkpoint.every_steps", "checkpoint.keep", "attention_maps.num_examples"]

# A minimal entry point built like train.py: absl flags + configs.cli.
PROGRAM = """
from ml_collections import config_flags
from configs import cli
from configs.errors import UserError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.")


def main(argv):
    cfg = cli.resolve_config(_CONFIG)
    if cfg.data.path == "fail":
        raise UserError("something the user did")
    print(cfg.model.d_model, cfg.train.learning_rate, cfg.data.target_lang)


if __name__ == "__main__":
    cli.run(main)
"""


def parse(argv: list[str]) -> ml_collections.ConfigDict:
    """Parses argv with a fresh FlagValues, as absl does for a real program."""
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv)
    values(argv)
    return holder.value


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_files_load_and_validate(name):
    cfg = parse(["prog", f"--config={ROOT / 'configs' / f'{name}.py'}"])
    flat, base_flat = cli.flatten_config(cfg), cli.flatten_config(base.get_config())
    assert set(flat) == set(base_flat)  # no typo adds a key
    assert all(key in flat for key in REQUIRED)
    for key, value in flat.items():  # types stay those of base
        assert type(value) is type(base_flat[key]), key
    cli.validate_config(cfg)


def test_experiment_specifics():
    en_fr = parse(["prog", f"--config={ROOT / 'configs/multi30k_en_fr.py'}"])
    assert (en_fr.model.d_model, en_fr.model.num_encoder_layers, en_fr.model.d_ff) == (128, 4, 256)
    assert (en_fr.model.dropout, en_fr.train.learning_rate, en_fr.train.num_steps) == (
        0.3, 0.005, 8000)
    smoke = parse(["prog", f"--config={ROOT / 'configs/smoke.py'}"])
    assert smoke.model.d_model == 32 and smoke.train.num_steps == 40
    assert smoke.data.max_train_sentences == 2000
    tatoeba = parse(["prog", f"--config={ROOT / 'configs/tatoeba_de_en.py'}"])
    assert (tatoeba.data.dataset, tatoeba.data.path) == ("tatoeba", "deu-eng.zip")
    iwslt = parse(["prog", f"--config={ROOT / 'configs/iwslt2017_de_en.py'}"])
    assert (iwslt.data.dataset, iwslt.data.hf_config) == ("hf", "iwslt2017-de-en")
    en_de = parse(["prog", f"--config={ROOT / 'configs/multi30k_en_de.py'}"])
    assert (en_de.data.source_lang, en_de.data.target_lang) == ("en", "de")
    assert (en_de.data.vocab_size, en_de.data.spm_model_type) == (8000, "unigram")
    # The selected recipe: BPE 10k, checkpoints an epoch apart for --average_last 10, beam 5.
    de_en = parse(["prog", f"--config={ROOT / 'configs/multi30k_de_en.py'}"])
    assert (de_en.data.vocab_size, de_en.data.spm_model_type, de_en.model.dropout) == (10000, "bpe", 0.3)
    assert (de_en.checkpoint.every_steps, de_en.checkpoint.keep) == (100, 10)
    assert (de_en.eval.beam_size, de_en.eval.length_penalty, de_en.train.max_minutes) == (5, 1.0, 0.0)
    # The CPU-budget recipe stays the one whose results the README reports.
    cpu = parse(["prog", f"--config={ROOT / 'configs/multi30k_de_en_cpu.py'}"])
    assert (cpu.data.vocab_size, cpu.data.spm_model_type, cpu.data.bucket_step) == (6000, "unigram", 8)
    assert (cpu.model.dropout, cpu.train.learning_rate, cpu.train.max_minutes) == (0.2, 3e-3, 60.0)


def test_overrides_through_absl_flags():
    argv = ["prog", f"--config={ROOT / 'configs/smoke.py'}", "--config.model.d_model=64",
            "--config.train.learning_rate=2e-3", "--config.data.path=/x/deu.txt",
            "--config.model.pre_ln=false", "--config.model.dropout=0"]
    cfg = parse(argv)
    assert cfg.model.d_model == 64 and cfg.train.learning_rate == 0.002
    assert cfg.data.path == "/x/deu.txt" and cfg.model.pre_ln is False
    assert cfg.model.dropout == 0.0 and isinstance(cfg.model.dropout, float)
    with pytest.raises(TypeError):  # locked and typed: wrong types rejected in code too
        cfg.model.d_model = "big"


def run_program(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, str(program), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_cli_success_and_one_line_errors(tmp_path):
    smoke = "--config=configs/smoke.py"
    ok = run_program(tmp_path, smoke, "--config.model.d_model=48",
                     "--config.data.target_lang=fr", "--config.data.source_lang=en")
    assert ok.returncode == 0 and ok.stdout.split() == ["48", "0.001", "fr"], ok.stderr
    assert_one_line_error(run_program(tmp_path, smoke, "--config.model.d_modle=3"),
                          "unknown config key config.model.d_modle",
                          "did you mean config.model.d_model?")
    assert_one_line_error(run_program(tmp_path, smoke, "--config.train.batch_tokens=lots"),
                          "--config.train.batch_tokens=lots", "expected int")
    assert_one_line_error(run_program(tmp_path, "--config=configs/nope.py"),
                          "config file not found: configs/nope.py")
    assert_one_line_error(run_program(tmp_path, smoke, "--config.data.dataset=wmt99"),
                          "unknown dataset 'wmt99'")
    assert_one_line_error(run_program(tmp_path, smoke, "--config.data.path=fail"),
                          "something the user did")


def test_main_guard(capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)

    @cli.main_guard
    def bad_data(argv):
        raise DataError("f.txt: invalid UTF-8 on line 3")

    with pytest.raises(SystemExit) as info:
        bad_data(["prog"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "error: f.txt: invalid UTF-8 on line 3\n"

    @cli.main_guard
    def bug(argv):
        raise ZeroDivisionError("a bug keeps its traceback")

    with pytest.raises(ZeroDivisionError):
        bug(["prog"])
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(DataError):
        bad_data(["prog"])


def test_config_json_round_trip(tmp_path):
    cfg = parse(["prog", f"--config={ROOT / 'configs/smoke.py'}", "--config.model.d_model=40"])
    path = cli.write_config_json(cfg, tmp_path / "run")
    text = path.read_text()
    assert text == cli.config_to_json(cfg) and text.endswith("\n")
    assert list(json.loads(text)) == sorted(json.loads(text))  # stable, sorted
    loaded = cli.load_config_json(tmp_path / "run")
    assert cli.flatten_config(loaded) == cli.flatten_config(cfg)
    assert loaded.model.d_model == 40 and cli.config_diff(cfg, loaded) == []
    cfg.unlock()
    cfg.model.d_model = 64
    cli.write_config_json(cfg, tmp_path / "run")  # replaces, leaves no temp file
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["config.json"]
    assert cli.load_config_json(tmp_path / "run").model.d_model == 64
    with pytest.raises(UserError, match="not a training workdir"):
        cli.load_config_json(tmp_path / "elsewhere")


def test_config_diff():
    old, new = base.get_config(), base.get_config()
    new.model.d_model = 512
    new.train.num_steps = 5
    new.eval.beam_size = 4
    new.data.extra = "x"
    assert cli.config_diff(old, new) == [
        ("data.extra", None, "x"), ("eval.beam_size", 1, 4),
        ("model.d_model", 256, 512), ("train.num_steps", 20000, 5)]
    assert cli.config_diff(old, new, ignore=["eval", "train.num_steps", "data.extra"]) == [
        ("model.d_model", 256, 512)]
    assert cli.config_diff(old.to_dict(), json.loads(cli.config_to_json(old))) == []


def test_validate_config_errors():
    cfg = base.get_config()
    cfg.model.num_heads = 3
    with pytest.raises(UserError, match="d_model=256 is not divisible by model.num_heads=3"):
        cli.validate_config(cfg)
    cfg = base.get_config()
    cfg.data.target_lang = "de"
    with pytest.raises(UserError, match="both 'de'"):
        cli.validate_config(cfg)
    cfg = base.get_config()
    cfg.data.spm_model_type = "wordpiece"
    with pytest.raises(UserError, match="spm_model_type must be one of unigram, bpe"):
        cli.validate_config(cfg)
    cfg = base.get_config()
    cfg.model.embedding_grad = "sorted"
    with pytest.raises(UserError, match="model.embedding_grad must be one of auto, scatter, one_hot"):
        cli.validate_config(cfg)
