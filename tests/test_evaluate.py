"""evaluate.py end to end on the smoke model (journey 2; bad input, nothing half-written).

The smoke model translates badly (BLEU ~0), so the scores are checked against sacreBLEU
recomputed on the written files, and once against a reference equal to the hypotheses
(BLEU 100). Every run works on a copy of the session's smoke workdir.
"""

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from conftest import REPO, run_script

N_SENTENCES = 40


def _lines(path: Path) -> list[str]:
    """Lines as evaluate.py writes them: '\\n'-terminated, nothing else splits a line."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


def _multi30k(split_file: str, lang: str) -> list[str]:
    with gzip.open(REPO / "data" / "multi30k" / f"{split_file}.{lang}.gz", "rt",
                   encoding="utf-8") as f:
        return [line.strip() for line in f.read().split("\n")[:N_SENTENCES]]


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return lines[0]


def _evaluate(workdir: Path, *args: str, input: str | None = None):
    """Runs evaluate.py like conftest.run_script, optionally feeding `input` on stdin."""
    if input is None:
        return run_script("evaluate.py", "--workdir", str(workdir), *args)
    return subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--workdir", str(workdir),
                           *args], cwd=REPO, input=input, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("config.json", "tokenizer", "checkpoints"):
        (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def workdir(smoke_workdir, tmp_path_factory) -> Path:
    """A copy of the smoke run (config, tokenizer, checkpoints) that evaluate.py may write to."""
    return _copy_run(smoke_workdir, tmp_path_factory.mktemp("eval") / "run")


@pytest.fixture(scope="module")
def split_run(workdir):
    """`--split test` on the first sentences, greedy, with --compat_lc_tok and maps."""
    result = _evaluate(workdir, "--split", "test", "--max_sentences", str(N_SENTENCES),
                       "--beam_size", "1", "--compat_lc_tok", "--save_attention", "2",
                       "--name", "split")
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_split_scores_equal_sacrebleu_on_the_files(workdir, split_run):
    out = workdir / "eval"
    hyps = _lines(out / "split.hyp.txt")
    refs = _multi30k("test_2016_flickr", "en")
    assert len(hyps) == N_SENTENCES
    result = json.loads((out / "split.json").read_text())
    assert result["num_sentences"] == N_SENTENCES and result["split"] == "test"
    assert result["decoding"]["beam_size"] == 1 and result["decoding"]["decode"] == "greedy"
    assert result["decoding"]["length_penalty"] == 0.6
    assert result["checkpoint_step"] == result["checkpoint"]["steps"][-1]
    assert result["timing"]["decode_seconds"] > 0 and result["timing"]["sentences_per_sec"] > 0

    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    metric = sacrebleu.metrics.BLEU()
    metric.corpus_score(hyps, [refs])
    signature = str(metric.get_signature())
    assert result["bleu_signature"] == signature
    assert "BLEU = " in split_run.stdout and signature in split_run.stdout
    assert "chrF2 = " in split_run.stdout and "sentences/s" in split_run.stdout

    from sacremoses import MosesTokenizer

    moses = MosesTokenizer(lang="en")
    lc_tok = [[moses.tokenize(x.lower(), escape=False, return_str=True) for x in side]
              for side in (hyps, refs)]
    expected = sacrebleu.metrics.BLEU(tokenize="none").corpus_score(lc_tok[0], [lc_tok[1]])
    assert result["bleu_lc_tok"] == pytest.approx(expected.score, abs=1e-9)
    assert "tok:none" in result["bleu_lc_tok_signature"]


def test_save_attention_greedy(workdir, split_run):
    from attention.mapfile import load_maps, validate_maps

    path = workdir / "eval" / "split.attention.npz"
    maps = load_maps(path)
    validate_maps(maps)
    assert maps.num_examples == 2 and maps.decode == "greedy"
    result = json.loads((workdir / "eval" / "split.json").read_text())
    assert maps.step == result["checkpoint_step"]
    assert result["files"]["attention"] == str(path)
    assert list((workdir / "eval").glob("split.attention.ex1.cross.*.png"))


def test_stdin_gives_the_same_translations(workdir, split_run):
    """Same sentences through stdin, scored against the split run's hypotheses: the
    translations come out on stdout, identical, so chrF is 100 (BLEU too, unless the
    smoke model's one-word outputs leave no 4-grams)."""
    sources = _multi30k("test_2016_flickr", "de")
    result = _evaluate(workdir, "--source", "-", "--reference",
                       str(workdir / "eval" / "split.hyp.txt"), "--beam_size", "1",
                       input="\n".join(sources) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    expected = _lines(workdir / "eval" / "split.hyp.txt")
    assert result.stdout.split("\n")[:-1] == expected
    assert "chrF2 = 100.00" in result.stderr  # the summary goes to stderr in stdin mode
    steps = json.loads((workdir / "eval" / "split.json").read_text())["checkpoint"]["steps"]
    data = json.loads((workdir / "eval" / f"stdin.step{steps[-1]}.greedy.json").read_text())
    assert data["source"] == "<stdin>" and data["chrf"] == pytest.approx(100.0)
    assert data["bleu_details"]["precisions"][0] == pytest.approx(100.0)
    assert data["bleu"] == pytest.approx(sacrebleu.corpus_bleu(expected, [expected]).score)


def test_empty_and_very_long_lines_beam(workdir, tmp_path):
    sources = _multi30k("test_2016_flickr", "de")
    long_line = " ".join((" ".join(sources).split() * 10)[:300])
    lines = [sources[0], "", sources[1], long_line, "", sources[2]]
    src = tmp_path / "mixed.de"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = _evaluate(workdir, "--source", str(src), "--beam_size", "2", "--batch_size", "2",
                       "--save_attention", "2", "--name", "mixed")
    assert result.returncode == 0, result.stderr[-3000:]
    hyps = _lines(workdir / "eval" / "mixed.hyp.txt")
    assert len(hyps) == len(lines)
    assert [h == "" for h in hyps] == [line == "" for line in lines]
    assert len(hyps[3].split()) > 0  # the long line is translated, not skipped
    data = json.loads((workdir / "eval" / "mixed.json").read_text())
    assert data["bleu"] is None and data["num_sentences"] == 6 and data["num_empty"] == 2
    assert data["decoding"]["decode"] == "beam" and data["decoding"]["beam_size"] == 2

    from attention.mapfile import load_maps, validate_maps

    maps = load_maps(workdir / "eval" / "mixed.attention.npz")
    validate_maps(maps)
    assert maps.decode == "beam" and maps.num_examples == 2


def test_length_penalty_defaults_to_the_config(workdir, tmp_path):
    """The recipe's tuned eval.length_penalty is what evaluate.py uses unless told otherwise;
    a penalty given is in the default name, so readings at two penalties both stay on disk."""
    run = _copy_run(workdir, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["eval"]["length_penalty"] = 1.3
    (run / "config.json").write_text(json.dumps(config))
    args = ("--split", "test", "--max_sentences", "4", "--beam_size", "2")
    for extra in ((), ("--length_penalty", "0.2"), ("--length_penalty", "1.3")):
        result = _evaluate(run, *args, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
    names = sorted(path.name for path in (run / "eval").glob("*.json"))
    assert len(names) == 3, names
    for name in names:
        data = json.loads((run / "eval" / name).read_text())
        suffix = name.removeprefix(f"test.step{data['checkpoint_step']}.beam2").removesuffix(".json")
        expected = {"": 1.3, ".lp0.2": 0.2, ".lp1.3": 1.3}[suffix]
        assert data["decoding"]["length_penalty"] == expected and data["name"] + ".json" == name


def test_average_last_is_the_elementwise_mean(workdir):
    import jax

    from common.errors import UserError
    from evaluation.loading import load_params

    a, b = (load_params(workdir, str(s)) for s in _saved_steps(workdir)[-2:])
    averaged = load_params(workdir, None, average_last=2)
    assert averaged.steps == _saved_steps(workdir)[-2:]
    expected = jax.tree.map(lambda x, y: (np.asarray(x) + np.asarray(y)) / 2, a.params, b.params)
    pairs = zip(jax.tree.leaves(expected), jax.tree.leaves(averaged.params), strict=True)
    for want, got in pairs:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
    assert any(not np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True))
    too_many = len(_saved_steps(workdir)) + 1
    with pytest.raises(UserError, match=f"only {too_many - 1} checkpoint"):
        load_params(workdir, None, average_last=too_many)


def _saved_steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


# ------------------------------------------------------------------------- bad input


def test_input_errors(workdir, tmp_path):
    empty_run = tmp_path / "no_checkpoints"
    empty_run.mkdir()
    shutil.copy2(workdir / "config.json", empty_run)
    shutil.copytree(workdir / "tokenizer", empty_run / "tokenizer")
    line = _one_error_line(_evaluate(empty_run, "--split", "test"))
    assert "no checkpoint" in line
    assert not (empty_run / "eval").exists()

    missing = tmp_path / "missing.de"
    assert str(missing) in _one_error_line(_evaluate(workdir, "--source", str(missing)))

    src, ref = tmp_path / "three.de", tmp_path / "two.en"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    ref.write_text("a\nb\n", encoding="utf-8")
    line = _one_error_line(_evaluate(workdir, "--source", str(src), "--reference", str(ref)))
    assert all(s in line for s in (str(src), "3", str(ref), "2"))

    bad = tmp_path / "latin1.de"
    bad.write_bytes("gut\nschön\n".encode("latin-1"))
    line = _one_error_line(_evaluate(workdir, "--source", str(bad)))
    assert str(bad) in line and "line 2" in line and "UTF-8" in line
    assert not list((workdir / "eval").glob("three*")) and not list((workdir / "eval").glob("latin1*"))


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_truncated_checkpoint(smoke_workdir, tmp_path):
    run = _copy_run(smoke_workdir, tmp_path / "run")
    step = _saved_steps(run)[-1]
    files = sorted((p for p in (run / "checkpoints" / str(step) / "state").rglob("*")
                    if p.is_file()), key=lambda p: p.stat().st_size)
    damaged = files[-1]  # the largest file: array data
    damaged.write_bytes(damaged.read_bytes()[:100])
    before = _digests(run)
    line = _one_error_line(_evaluate(run, "--checkpoint", "last", "--max_sentences", "4"))
    assert f"step {step}" in line and "truncated or damaged" in line
    assert _digests(run) == before  # nothing changed, nothing written


def test_tokenizer_that_does_not_fit_the_checkpoint(smoke_workdir, tmp_path):
    from data.tokenizer import train_tokenizer

    run = _copy_run(smoke_workdir, tmp_path / "run")
    sources, targets = _multi30k("val", "de"), _multi30k("val", "en")
    train_tokenizer(sources + targets, run / "tokenizer" / "spm", vocab_size=100)
    line = _one_error_line(_evaluate(run, "--max_sentences", "4"))
    assert "does not fit" in line and "tokenizer" in line and "vocab 100/100" in line


# ------------------------------------------------------------- maps of a very long line


def _same_budget_sentences(tokenizer, count: int) -> list[str]:
    """`count` test sentences of at most 60 pieces that share one decoding budget, so
    recording their maps together equals recording each alone (even for the smoke
    model, whose hypotheses run to the budget)."""
    from models.search import max_target_length

    by_budget: dict[int, list[str]] = {}
    for sentence in _multi30k("test_2016_flickr", "de"):
        n = len(tokenizer.encode_source([sentence])[0])
        if n <= 60:
            by_budget.setdefault(max_target_length(n, multiple=8), []).append(sentence)
    return next(group[:count] for group in by_budget.values() if len(group) >= count)


def test_long_line_maps_are_bounded(workdir, tmp_path):
    """One line far longer than the rest: the hypotheses are complete and in order, the
    map file holds every saved sentence in input order, each short one's maps equal
    recording it alone (not decoded beside the long one), the file is no larger than
    the float32 valid regions, and the long line's preview is skipped with a notice."""
    from attention.mapfile import load_maps, validate_maps
    from configs import resolved
    from evaluation.corpus import translate_lines
    from evaluation.loading import load_params, load_tokenizer
    from models.translate import record_maps

    cfg = resolved.load_config_json(workdir)
    tokenizer = load_tokenizer(workdir, cfg)
    short = _same_budget_sentences(tokenizer, 3)
    long_line = " ".join((" ".join(_multi30k("test_2016_flickr", "de")).split() * 10)[:50])
    assert len(tokenizer.encode_source([long_line])[0]) > 150
    lines = [short[0], long_line, short[1], "", short[2]]
    src = tmp_path / "long.de"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = _evaluate(workdir, "--source", str(src), "--beam_size", "2",
                       "--save_attention", "3", "--name", "long")
    assert result.returncode == 0, result.stderr[-3000:]
    out = workdir / "eval"

    loaded = load_params(workdir, None, cfg=cfg, tokenizer=tokenizer)
    expected, _ = translate_lines(loaded.model, tokenizer, lines, beam_size=2,
                                  length_penalty=cfg.eval.length_penalty,
                                  batch_size=cfg.eval.batch_size,
                                  bucket_step=cfg.data.bucket_step)
    assert _lines(out / "long.hyp.txt") == expected  # complete, in input order
    assert expected[3] == "" and all(expected[i] for i in (0, 1, 2, 4))

    path = out / "long.attention.npz"
    maps = load_maps(path)
    validate_maps(maps)
    assert maps.num_examples == 3 and maps.decode == "beam"
    source_ids = tokenizer.encode_source(lines[:3])
    assert maps.source_lengths.tolist() == [len(ids) for ids in source_ids]
    for example in (0, 2):
        alone = record_maps(loaded.model, tokenizer, [source_ids[example]], None, beam_size=2,
                            length_penalty=cfg.eval.length_penalty, step=maps.step)
        s, t = int(alone.source_lengths[0]), int(alone.target_lengths[0])
        assert (int(maps.source_lengths[example]), int(maps.target_lengths[example])) == (s, t)
        assert maps.target_tokens[example, :t].tolist() == alone.target_tokens[0].tolist()
        for kind, q, k in (("encoder_self", s, s), ("decoder_self", t, t), ("cross", t, s)):
            np.testing.assert_allclose(maps.weights(kind)[example, :, :, :q, :k],
                                       alone.weights(kind)[0], atol=1e-5, err_msg=kind)

    s, t = maps.source_lengths.astype(np.int64), maps.target_lengths.astype(np.int64)
    heads, l_enc, l_dec = maps.num_heads, maps.num_layers("encoder_self"), maps.num_layers("cross")
    valid_bytes = 4 * heads * int((l_enc * s * s + l_dec * (t * t + t * s)).sum())
    assert path.stat().st_size <= valid_bytes, (path.stat().st_size, valid_bytes)

    notice = (f"preview of example 1 skipped: {int(s[1])} x {int(t[1])} tokens")
    assert notice in result.stderr, result.stderr[-3000:]
    assert list(out.glob("long.attention.ex0.cross.*.png"))
    assert list(out.glob("long.attention.ex2.cross.*.png"))
    assert not list(out.glob("long.attention.ex1.*"))


def test_hypotheses_are_written_before_the_maps(workdir, tmp_path, monkeypatch):
    """A failure while recording maps leaves the complete hypothesis file (and no JSON)."""
    import evaluate as evaluate_module
    import evaluation.corpus

    def fail(*args, **kwargs):
        raise RuntimeError("maps failed")

    monkeypatch.setattr(evaluation.corpus, "save_attention", fail)
    lines = _multi30k("test_2016_flickr", "de")[:3]
    src = tmp_path / "three.de"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="maps failed"):
        evaluate_module.evaluate(workdir, source=str(src), beam_size=1, save_attention=2,
                                 name="maps_fail")
    assert len(_lines(workdir / "eval" / "maps_fail.hyp.txt")) == 3
    assert not (workdir / "eval" / "maps_fail.json").exists()
