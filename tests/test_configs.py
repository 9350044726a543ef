"""Tests of configs/: experiment files, absl overrides, one-line CLI errors, config.json."""

import json
import re
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from common import cli
from common.errors import UserError
from configs import base, resolved, resume, smoke, validation
from data.corpora import DataError

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ["multi30k_de_en", "multi30k_de_en_cpu", "multi30k_de_en_cpu_kd", "multi30k_en_de",
               "multi30k_en_fr", "tatoeba_de_en", "iwslt2017_de_en", "smoke", "align_de_en"]
REQUIRED = ["data.dataset", "data.source_lang", "data.target_lang", "data.vocab_size",
            "data.max_length", "model.d_model", "model.num_heads", "model.num_encoder_layers",
            "model.num_decoder_layers", "model.d_ff", "model.dropout", "model.attention_dropout",
            "train.num_steps", "train.batch_tokens", "train.learning_rate", "train.warmup_steps",
            "train.seed", "train.label_smoothing", "eval.every_steps", "eval.beam_size",
            "checkpoint.every_steps", "checkpoint.keep", "attention_maps.num_examples"]

# A minimal entry point built like train.py: absl flags + common.cli.
PROGRAM = """
from ml_collections import config_flags
from common import cli
from common.errors import UserError
from configs import resolved

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.")


def main(argv):
    cfg = resolved.resolve_config(_CONFIG)
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
    from configs import alignment_group
    from training.plugins import active_plugins

    cfg = parse(["prog", f"--config={ROOT / 'configs' / f'{name}.py'}"])
    flat, base_flat = resume.flatten_config(cfg), resume.flatten_config(base.get_config())
    if "alignment" in cfg:  # a plug-in's group: its defaults' keys
        base_flat.update(resume.flatten_config({"alignment": alignment_group.get_group().to_dict()}))
    assert set(flat) == set(base_flat)  # no typo adds a key
    assert all(key in flat for key in REQUIRED)
    for key, value in flat.items():  # types stay those of base
        assert type(value) is type(base_flat[key]), key
    validation.validate_config(cfg)
    active_plugins(cfg)


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
    assert (de_en.checkpoint.every_steps, de_en.checkpoint.last_every_steps,
            de_en.checkpoint.keep) == (500, 100, 10)
    assert (de_en.eval.beam_size, de_en.eval.length_penalty, de_en.train.max_minutes) == (5, 1.25, 0.0)
    # Each direction's own selection on validation (docs/results.md: "Seeds", "Lever 3
    # measured: En→Fr's three seeds").
    assert (en_de.eval.length_penalty, en_fr.eval.length_penalty) == (1.25, 1.5)
    assert (en_fr.data.vocab_size, en_fr.data.spm_model_type) == (10000, "bpe")
    # fairseq's init is En→De's alone ("Lever 3 measured: En→De, fairseq's initialisation").
    assert (en_de.model.kernel_init, de_en.model.kernel_init) == ("xavier_uniform", "lecun_normal")
    # The CPU-budget recipe stays the one whose results the README reports.
    cpu = parse(["prog", f"--config={ROOT / 'configs/multi30k_de_en_cpu.py'}"])
    assert (cpu.data.vocab_size, cpu.data.spm_model_type, cpu.data.bucket_step) == (6000, "unigram", 8)
    assert (cpu.model.dropout, cpu.train.learning_rate, cpu.train.max_minutes) == (0.2, 3e-3, 60.0)
    assert (cpu.train.schedule, cpu.eval.length_penalty, cpu.eval.every_steps) == (
        "cosine_budget", 1.0, 2000)
    assert cpu.train.num_steps >= 100_000  # the budget, not a step cap, ends the cosine
    assert (cpu.data.pack_length, cpu.train.batch_tokens) == (64, 3328)  # one packed shape
    assert cpu.train.cpu_devices == 2  # each batch split over the two cores
    # Its distilled twin: the same recipe, only the targets are the vendored teacher's.
    kd = parse(["prog", f"--config={ROOT / 'configs/multi30k_de_en_cpu_kd.py'}"])
    recipe = resume.flatten_config(cpu)
    differ = {key for key, value in resume.flatten_config(kd).items() if recipe[key] != value}
    assert differ == {"data.distilled_targets"} and kd.data.distilled_mix == "replace"
    assert Path(kd.data.distilled_targets) == ROOT / "data/multi30k/distilled/train.de_en_cpu_ens3.en.gz"
    # The alignment config: both directions, the gold pairs' own training files.
    for arg, (src, tgt) in (("", ("de", "en")), (":en-de", ("en", "de"))):
        align = parse(["prog", f"--config={ROOT / 'configs/align_de_en.py'}{arg}"])
        assert (align.data.source_lang, align.data.target_lang) == (src, tgt)
        assert align.data.train_source.endswith(f"train.{src}")
        assert align.data.valid_target.endswith(f"val.{tgt}.gz")
    # Any other pair: its own folder for both directions, Multi30k's validation set when
    # Multi30k has both languages, else files beside the training ones.
    fr_en = parse(["prog", f"--config={ROOT / 'configs/align_de_en.py'}:fr-en"])
    assert fr_en.data.train_source == "runs/align_data_en-fr/train.fr"
    assert fr_en.alignment.teacher_links == "runs/align_data_en-fr/train.links"
    assert fr_en.data.valid_target == "data/multi30k/val.en.gz"
    ro_en = parse(["prog", f"--config={ROOT / 'configs/align_de_en.py'}:en-ro"])
    assert (ro_en.data.train_target, ro_en.data.valid_source) == (
        "runs/align_data_en-ro/train.ro", "runs/align_data_en-ro/valid.en")
    assert ro_en.alignment.reverse and ro_en.alignment.agreement == 1.0
    # The CPU recipe's model and schedule, a step budget instead of its time budget.
    assert (align.model.d_model, align.model.dropout, align.data.spm_model_type) == (
        128, 0.2, "unigram")
    assert (align.train.schedule, align.train.max_minutes, align.train.learning_rate) == (
        "inverse_sqrt", 0.0, 3e-3)


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
    path = resolved.write_config_json(cfg, tmp_path / "run")
    text = path.read_text()
    assert text == resolved.config_to_json(cfg) and text.endswith("\n")
    assert list(json.loads(text)) == sorted(json.loads(text))  # stable, sorted
    loaded = resolved.load_config_json(tmp_path / "run")
    assert resume.flatten_config(loaded) == resume.flatten_config(cfg)
    assert loaded.model.d_model == 40 and resume.config_diff(cfg, loaded) == []
    cfg.unlock()
    cfg.model.d_model = 64
    resolved.write_config_json(cfg, tmp_path / "run")  # replaces, leaves no temp file
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["config.json"]
    assert resolved.load_config_json(tmp_path / "run").model.d_model == 64
    with pytest.raises(UserError, match="not a training workdir"):
        resolved.load_config_json(tmp_path / "elsewhere")


def test_config_diff():
    old, new = base.get_config(), base.get_config()
    new.model.d_model = 512
    new.train.num_steps = 5
    new.eval.beam_size = 4
    new.data.extra = "x"
    assert resume.config_diff(old, new) == [
        ("data.extra", None, "x"), ("eval.beam_size", 1, 4),
        ("model.d_model", 256, 512), ("train.num_steps", 20000, 5)]
    assert resume.config_diff(old, new, ignore=["eval", "train.num_steps", "data.extra"]) == [
        ("model.d_model", 256, 512)]
    assert resume.config_diff(old.to_dict(), json.loads(resolved.config_to_json(old))) == []


@pytest.mark.parametrize(("key", "value", "message"), [
    ("model.num_heads", 3, "d_model=256 is not divisible by model.num_heads=3"),
    ("data.target_lang", "de", "both 'de'"),
    ("data.spm_model_type", "wordpiece", "spm_model_type must be one of unigram, bpe"),
    ("data.spm_normalization", "nfc", "spm_normalization must be one of nmt_nfkc, nmt_nfkc_cf"),
    ("model.embedding_grad", "sorted", "model.embedding_grad must be one of auto, scatter, one_hot"),
])
def test_validate_config_errors(key, value, message):
    cfg = base.get_config()
    group, name = key.split(".")
    cfg[group][name] = value
    with pytest.raises(UserError, match=message):
        validation.validate_config(cfg)


def test_main_guard_describes_os_errors_on_paths(capsys, monkeypatch):
    """An OSError naming a path is the user's: one line in words, keyed by errno. One
    without a path is a bug and keeps its traceback."""
    import errno
    import os

    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    path = "runs/x/eval/a.json"
    expected = {errno.EROFS: f"cannot write {path}: read-only file system",
                errno.ENOTDIR: f"{path}: a part of this path is a file, not a folder",
                errno.ENOENT: f"no such file or folder: {path}",
                errno.EACCES: f"permission denied: {path}",
                errno.ENOSPC: f"no space left on device: {path}",
                errno.EISDIR: f"{path} is a folder, not a file",
                errno.EBUSY: f"{path}: device or resource busy"}
    for code, message in expected.items():
        @cli.main_guard
        def fails(argv, code=code):
            raise OSError(code, os.strerror(code), path)  # the subclass OSError picks

        with pytest.raises(SystemExit) as info:
            fails(["prog"])
        assert info.value.code == 2
        assert capsys.readouterr().err == f"error: {message}\n"
    assert cli.describe_os_error(FileExistsError(errno.EEXIST, "File exists", __file__)) == (
        f"{__file__} is a file, not a folder")

    @cli.main_guard
    def missing_map_file(argv):  # attention.mapfile.load_maps names the path like any OSError
        from attention.mapfile import load_maps

        load_maps("maps.npz")

    with pytest.raises(SystemExit):
        missing_map_file(["prog"])
    assert capsys.readouterr().err == "error: no such file or folder: maps.npz\n"

    @cli.main_guard
    def bug(argv):
        raise OSError(errno.EBADF, "Bad file descriptor")  # no path: not the user's

    with pytest.raises(OSError, match="Bad file descriptor"):
        bug(["prog"])


@pytest.mark.parametrize("content, message", [
    (b'{"data": ', "invalid JSON"), (b"\xff{}", "not UTF-8 text"),
    (b"[1, 2]", "not a training config (a JSON list"), (b'{"data": 3}', "no group data, model"),
])
def test_load_config_json_refuses_a_damaged_file(tmp_path, content, message):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(UserError, match=re.escape(message)):
        resolved.load_config_json(tmp_path)


def test_atomic_writes_name_the_target_and_leftovers_are_cleaned_unless_live(tmp_path,
                                                                            monkeypatch):
    """Temp files and folders are `.<name>.<random>.tmp`; the clean-up removes those (and
    the legacy names) that no running writer holds, and nothing else."""
    import errno
    import fcntl
    import tempfile

    from common import files

    target = tmp_path / "a.json"
    with files.atomic_file(target) as f:
        [tmp] = [p for p in tmp_path.iterdir() if p.name != "a.json"]
        assert files.is_temp_name(tmp.name) and tmp.name.startswith(".a.json.")
        assert files.remove_stale_temp_files(tmp_path) == []  # its writer holds it
        f.write(b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    with pytest.raises(OSError) as info, files.atomic_file(target):  # a full disk on write
        raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.filename == str(target) and target.read_bytes() == b"{}"
    real_mkstemp = tempfile.mkstemp

    def read_only(prefix, suffix, dir):
        raise OSError(errno.EROFS, "Read-only file system", f"{dir}/{prefix}q1w2e3{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(OSError) as info:
        files.write_atomic(target, "x")
    assert info.value.filename == str(target)  # the user's path, not the temporary name
    monkeypatch.setattr(tempfile, "mkstemp", real_mkstemp)

    with files.temp_folder(tmp_path / "tokenizer") as live_folder:
        assert files.is_temp_name(live_folder.name)
        assert live_folder.name.startswith(".tokenizer.")
        stale = [".config.json.abc123.tmp", ".metrics.jsonl.tmp4242"]
        stale_folders = [".tokenizer.xyz.tmp", ".tokenizer-tmp-old"]
        kept = ["notes.tmp", ".hidden", "b.json", ".tmp", ".b.tmp"]
        for name in [*stale, *kept]:
            (tmp_path / name).write_text("x")
        for name in stale_folders:
            (tmp_path / name).mkdir()
            (tmp_path / name / "spm.model").write_text("x")
        live = tmp_path / ".b.json.live01.tmp"
        live.write_text("x")
        with open(live) as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # as a running atomic_file does
            removed = files.remove_stale_temp_files(tmp_path)
        assert sorted(p.name for p in removed) == sorted([*stale, *stale_folders])
        assert live_folder.is_dir() and live.exists()
        assert all((tmp_path / name).exists() for name in kept)
    assert not live_folder.exists()
    assert [p.name for p in files.remove_stale_temp_files(tmp_path)] == [live.name]


def test_atomic_files_get_the_permissions_open_would_give(tmp_path):
    from common.files import write_atomic

    path = write_atomic(tmp_path / "a.json", "{}\n")
    plain = tmp_path / "b.json"
    plain.write_text("{}\n")
    assert (path.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777) != 0o600


def test_the_alignment_group_is_checked_when_its_plugin_is_made():
    from training.plugins import active_plugins

    assert active_plugins(base.get_config()) == ()  # no group, no plug-in
    cfg = smoke.get_config("align")
    active_plugins(cfg)
    cases = [(dict(attention_prior=False), "alignment.attention_prior=False needs "
                                           "alignment.jumps=True"),
             (dict(jumps=True, reverse=True, student=False, agreement=-1.0),
              "alignment.agreement must be at least 0"),
             (dict(reverse=True), "alignment.reverse needs alignment.jumps"),
             (dict(agreement=1.0), "alignment.agreement needs alignment.reverse"),
             (dict(jumps=True, student=True), "alignment.student needs alignment.reverse"),
             (dict(teacher_links="x"), "set alignment.student=True")]
    for values, message in cases:
        cfg = smoke.get_config("align")
        cfg.alignment.update(values)
        with pytest.raises(UserError, match=message):
            active_plugins(cfg)
    cfg = smoke.get_config("align")
    cfg.alignment.jumps, cfg.data.pack_length = True, 256
    with pytest.raises(UserError, match="alignment.jumps needs data.pack_length=0"):
        active_plugins(cfg)
    cfg = smoke.get_config("align")
    cfg.alignment.plugin = "no_such_module"
    with pytest.raises(UserError, match="alignment.plugin: no module 'no_such_module'"):
        active_plugins(cfg)


def test_a_config_json_of_the_old_layout_reads_in_todays(tmp_path):
    """Before the alignment group, every config.json had model.alignment_*, train.align_*
    and data.teacher_links: a run without the head reads without them, a run with it
    with the group (keys it predates at their defaults)."""
    import json

    from configs import alignment_group
    from configs.resolved import config_to_json, load_config_json

    today = json.loads(config_to_json(smoke.get_config()))
    old = json.loads(json.dumps(today))
    old["model"].update(alignment_head=False, alignment_jumps=False,
                        alignment_attention_prior=True, alignment_reverse=False,
                        alignment_student=False)
    old["train"].update(align_prior_ramp_steps=0, align_agreement=0.0, align_agreement_start=0)
    old["data"]["teacher_links"] = ""
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert load_config_json(tmp_path).to_dict() == today

    old["model"].update(alignment_head=True, alignment_jumps=True, alignment_reverse=True)
    del old["train"]["align_agreement_start"]  # a run from before the key
    old["train"]["align_agreement"] = 1.0
    old["data"]["teacher_links"] = "links.txt"
    (tmp_path / "config.json").write_text(json.dumps(old))
    want = smoke.get_config("align")
    want.alignment.update(jumps=True, reverse=True, agreement=1.0, teacher_links="links.txt")
    assert load_config_json(tmp_path).to_dict() == json.loads(config_to_json(want))
    assert alignment_group.upgrade_legacy(json.loads(config_to_json(want))) == json.loads(
        config_to_json(want))  # today's layout: unchanged


# --- every key's range (configs/ranges.py) -------------------------------------------

def _outside(key: str) -> list:
    """Values of `key`'s type just outside its range in configs/ranges.py (NaN too)."""
    from configs import ranges

    allowed, default = ranges.RANGES[key], resume.flatten_config(base.get_config())[key]
    if isinstance(allowed, ranges.Choice):
        return ["no-such-choice"]
    if not isinstance(allowed, ranges.Interval):
        return []
    step = 1 if isinstance(default, int) else 0.5
    kind = type(default)
    values = [] if isinstance(default, int) else [float("nan")]
    if allowed.low is not None:
        values.append(kind(allowed.low) if allowed.low_open else kind(allowed.low - step))
    if allowed.high is not None:
        values.append(kind(allowed.high) if allowed.high_open else kind(allowed.high + step))
    return values


def _range_cases() -> list:
    from configs import ranges

    return [pytest.param(key, value, id=f"{key}={value}") for key in ranges.RANGES
            for value in _outside(key)]


# Values of the right type that mean nothing, each with what its error line must say.
MEANINGLESS = [
    ("train.max_minutes", -1.0, "train.max_minutes must be at least 0, got -1.0 (0 = no time"),
    ("train.seed", 2**32, "train.seed must be in [0, 4294967295], got 4294967296"),
    ("train.seed", -1, "train.seed must be in [0, 4294967295], got -1"),
    ("train.learning_rate", 0.0, "train.learning_rate must be above 0, got 0.0"),
    ("train.label_smoothing", 1.0, "train.label_smoothing must be in [0, 1), got 1.0"),
    ("train.adam_b2", 1.0, "train.adam_b2 must be in [0, 1), got 1.0"),
    ("data.character_coverage", 0.5, "data.character_coverage must be in [0.98, 1], got 0.5"),
    ("data.valid_size", 0, "data.valid_size must be at least 1, got 0"),
    ("checkpoint.keep", 0, "checkpoint.keep must be at least 1, got 0"),
    ("eval.length_penalty", -0.6, "eval.length_penalty must be at least 0, got -0.6"),
    ("train.schedule", "linear", "train.schedule must be one of inverse_sqrt, cosine,"),
]


def test_every_key_of_the_base_config_has_a_range():
    from configs import ranges

    assert set(ranges.RANGES) == set(resume.flatten_config(base.get_config()))


@pytest.mark.parametrize("key, value, message", MEANINGLESS)
def test_meaningless_values_are_refused_naming_the_key(key, value, message):
    cfg = base.get_config()
    group, name = key.split(".")
    cfg[group][name] = value
    with pytest.raises(UserError) as info:
        validation.validate_config(cfg)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("key, value", _range_cases())
def test_every_value_outside_its_range_is_one_error_line_and_writes_nothing(
        key, value, tmp_path, capsys):
    """train.train on a config with one value just outside its range (or NaN, or an
    unknown choice), run as the command line runs it: exit 2, one `error:` line naming
    the key, no workdir."""
    import train

    cfg = base.get_config()
    group, name = key.split(".")
    cfg[group][name] = value
    workdir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        cli.main_guard(lambda argv: train.train(cfg, workdir))([])
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(lines) == 1, lines
    expected = "error: unknown dataset" if key == "data.dataset" else f"error: {key} must be "
    assert lines[0].startswith(expected), lines[0]
    assert not workdir.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key, value", [
    ("train.max_minutes", 0.0), ("train.seed", 2**32 - 1), ("data.character_coverage", 0.98),
    ("eval.every_steps", 0), ("train.log_every_steps", 0), ("data.pack_length", 0)])
def test_values_at_the_edge_of_their_range_are_accepted(key, value):
    cfg = base.get_config()
    group, name = key.split(".")
    cfg[group][name] = value
    validation.validate_config(cfg)
