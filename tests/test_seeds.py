"""Seeds as an axis (evaluation/seeds.py): `train.py --seeds N` and the evaluation of their
parent, whose mean and sample standard deviation are checked against NumPy."""

import json
import re
import shutil

import jax
import numpy as np
import pytest
from conftest import run_script

from common.errors import UserError
from evaluation.seeds import summarize, summarize_files

TRAIN = ("--config", "configs/smoke.py", "--config.train.num_steps=2",
         "--config.eval.every_steps=2", "--config.checkpoint.every_steps=2",
         "--config.eval.max_sentences=8", "--config.attention_maps.enabled=False")


def _result(workdir: str, bleu, chrf, lc=None) -> dict:
    out = {"workdir": workdir, "bleu": bleu, "chrf": chrf}
    return out if lc is None else {**out, "bleu_lc_tok": lc}


def test_summary_is_numpy_mean_and_sample_std():
    results = [_result("s0", 30.5, 55.0, 31.0), _result("s1", 28.25, 52.5, 29.5),
               _result("s2", 31.0, 57.25, 33.75)]
    summary = summarize(results)
    assert list(summary)[:4] == ["bleu", "bleu_lc_tok", "bleu_std", "bleu_lc_tok_std"]
    assert list(summary)[4:] == ["chrf", "chrf_std", "per_seed", "workdirs"]
    for key in ("bleu", "bleu_lc_tok", "chrf"):
        values = np.array([r[key] for r in results])
        assert summary["per_seed"][key] == values.tolist()
        np.testing.assert_allclose(summary[key], values.mean(), rtol=1e-12)
        np.testing.assert_allclose(summary[f"{key}_std"], values.std(ddof=1), rtol=1e-12)
    assert summary["workdirs"] == ["s0", "s1", "s2"]
    one = summarize(results[:1])  # one seed: no spread
    assert one["bleu"] == 30.5 and one["bleu_std"] is None
    unscored = summarize([_result("s0", None, None), _result("s1", None, None)])
    assert unscored["bleu"] is None and unscored["chrf_std"] is None
    assert "bleu_lc_tok" not in unscored


def _stored(seed: int, scores: tuple[float, float, float], **changes) -> dict:
    """An evaluate.py JSON of seed run `seed` with scores (bleu, bleu_lc_tok, chrf) and
    the keys a summary reads; `changes` replace keys ("outer.inner" for nested ones)."""
    bleu, lc, chrf = scores
    result = {"name": "test.avg2-step8.beam5", "workdir": f"runs/r/seed{seed}", "split": "test",
              "source": "multi30k test (de)", "reference": "multi30k test (en)",
              "source_lang": "de", "target_lang": "en", "num_sentences": 1000,
              "checkpoint": {"requested": "last", "steps": [7, 8 + seed], "averaged": True},
              "decoding": {"beam_size": 5, "decode": "beam", "length_penalty": 1.0},
              "bleu": bleu, "chrf": chrf, "bleu_lc_tok": lc, "files": {},
              "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
              "bleu_lc_tok_signature": "nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|"
                                       "version:2.6.0",
              "bleu_lc_tok_preprocessing": "lowercase + sacremoses MosesTokenizer",
              "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"}
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            result[outer] = {**result[outer], inner: value}
        else:
            result[key] = value
    return result


def _write(folder, results: list[dict]) -> list[str]:
    paths = []
    for k, result in enumerate(results):
        paths.append(str(folder / f"seed{k}.json"))
        (folder / f"seed{k}.json").write_text(json.dumps(result))
    return paths


def test_summary_of_stored_seed_results(tmp_path):
    results = [_stored(0, (42.72, 43.06, 62.42)), _stored(1, (42.0, 42.5, 62.0)),
               _stored(2, (43.5, 43.75, 63.0))]
    paths = _write(tmp_path, results)
    out = tmp_path / "headline.json"
    summary = summarize_files(paths, out)
    assert json.loads(out.read_text()) == summary
    assert {k: summary[k] for k in summarize(results)} == summarize(results)
    assert list(summary)[:4] == ["bleu", "bleu_lc_tok", "bleu_std", "bleu_lc_tok_std"]
    assert summary["name"] == "headline" and summary["workdir"] == "runs/r"
    assert summary["num_seeds"] == 3 and summary["files"] == {"json": str(out), "seeds": paths}
    assert summary["checkpoint_steps"] == [[7, 8], [7, 9], [7, 10]]  # steps may differ
    for key in ("bleu_signature", "bleu_lc_tok_signature", "bleu_lc_tok_preprocessing",
                "chrf_signature"):  # how the means were computed, beside them
        assert summary[key] == results[0][key]

    result = run_script("evaluate.py", "--seed_results", ",".join(paths), "--output",
                        str(tmp_path / "cli.json"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "BLEU (lowercased Moses-tokenized, compat) = 43.10 ± 0.63" in result.stdout
    cli = json.loads((tmp_path / "cli.json").read_text())
    assert {k: v for k, v in cli.items() if k not in ("name", "files", "time")} == \
        {k: v for k, v in summary.items() if k not in ("name", "files", "time")}


@pytest.mark.parametrize("change, message", [
    ({"decoding.beam_size": 1}, "decoding.beam_size 1"),
    ({"split": "valid"}, "split 'valid'"),
    ({"checkpoint.steps": [8]}, "averaged_checkpoints 1"),
    ({"target_lang": "fr"}, "target_lang 'fr'"),
    ({"bleu_lc_tok": None}, "scores"),
    ({"workdir": "runs/r/seed0"}, "two files come from the same run"),
    ({"per_seed": {}}, "not the evaluate.py JSON of one training run"),
    ({"ensemble": ["a", "b"]}, "the result of an ensemble"),
    ({"bleu": None}, "has no scores"),
    ({"bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"},
     "bleu_signature"),
])
def test_stored_seed_results_that_do_not_belong_together(tmp_path, change, message):
    if change == {"bleu_lc_tok": None}:  # scored without --compat_lc_tok
        other = {k: v for k, v in _stored(1, (42.0, 42.5, 62.0)).items() if k != "bleu_lc_tok"}
    else:
        other = _stored(1, (42.0, 42.5, 62.0), **change)
    paths = _write(tmp_path, [_stored(0, (42.72, 43.06, 62.42)), other])
    out = tmp_path / "headline.json"
    out.write_text("kept")
    with pytest.raises(UserError, match=message.replace("(", "\\(")):
        summarize_files(paths, out)
    assert out.read_text() == "kept"


def test_bad_seed_results_on_the_command_line(tmp_path):
    paths = _write(tmp_path, [_stored(0, (42.72, 43.06, 62.42)),
                              _stored(1, (42.0, 42.5, 62.0), split="valid")])
    out = tmp_path / "headline.json"
    out.write_text("kept")
    cases = [(["--seed_results", ",".join(paths), "--output", str(out)], "split 'valid'"),
             (["--seed_results", paths[0]], "--seed_results and --output go together"),
             (["--seed_results", paths[0], "--output", str(tmp_path / "x.txt")], "a .json file"),
             (["--seed_results", paths[0], "--output", paths[0]], "is one of the --seed_results"),
             (["--seed_results", str(tmp_path / "none.json"), "--output", str(out)],
              "cannot read")]
    for args, message in cases:
        result = run_script("evaluate.py", *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and message in lines[0], lines
    assert out.read_text() == "kept" and not (tmp_path / "x.txt").exists()


@pytest.mark.slow
def test_train_seeds_then_evaluate_the_parent(tmp_path, capsys):
    from evaluate import evaluate
    from evaluation.loading import load_params

    parent = tmp_path / "seeds"
    first = run_script("train.py", *TRAIN, "--workdir", str(parent), "--seeds", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    runs = [parent / "seed0", parent / "seed1"]
    assert sorted(p.name for p in parent.iterdir()) == ["seed0", "seed1"]
    for seed, run in enumerate(runs):
        assert json.loads((run / "config.json").read_text())["train"]["seed"] == seed
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]
    a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(load_params(run).params)])
            for run in runs)
    assert a.shape == b.shape and np.mean(a != b) > 0.9  # other seeds: another model

    again = run_script("train.py", *TRAIN, "--workdir", str(parent), "--seeds", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("finished training at step 2 (train.num_steps (2) reached); "
                              "nothing to do") == 2  # each seed resumed to no work

    summary = evaluate(parent, split="valid", max_sentences=8, beam_size=1, compat_lc_tok=True)
    path = parent / "eval" / f"{summary['name']}.json"
    assert json.loads(path.read_text()) == summary
    assert list(summary)[:4] == ["bleu", "bleu_lc_tok", "bleu_std", "bleu_lc_tok_std"]
    assert summary["workdirs"] == [str(run) for run in runs]
    per_seed = [json.loads((run / "eval" / f"{summary['name']}.json").read_text())
                for run in runs]
    assert summary["files"]["seeds"] == [r["files"]["json"] for r in per_seed]
    for key in ("bleu", "bleu_lc_tok", "chrf"):
        values = np.array([r[key] for r in per_seed])
        np.testing.assert_allclose(summary[key], values.mean(), rtol=1e-12)
        np.testing.assert_allclose(summary[f"{key}_std"], values.std(ddof=1), rtol=1e-12)
    assert per_seed[0]["chrf"] != per_seed[1]["chrf"]  # two models, two results
    stdout = capsys.readouterr().out
    assert "over 2 seed(s)" in stdout and f"wrote {path}" in stdout
    # the same summary from the stored per-seed files, as for seeds of other sessions
    stored = summarize_files(summary["files"]["seeds"], tmp_path / "from_files.json")
    assert {k: v for k, v in stored.items() if k not in ("name", "files", "time")} == \
        {k: v for k, v in summary.items() if k not in ("name", "files", "time")}

    # a plain run into the parent would mix the two layouts
    plain = run_script("train.py", *TRAIN, "--workdir", str(parent))
    assert plain.returncode == 2 and "holds --seeds runs" in plain.stderr
    assert sorted(p.name for p in parent.iterdir()) == ["eval", "seed0", "seed1"]


def test_bad_seed_input(tmp_path, smoke_workdir):
    from configs import smoke
    from evaluate import evaluate
    from train import train_seeds

    result = run_script("train.py", *TRAIN, "--workdir", str(tmp_path / "zero"), "--seeds", "0")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines == ["error: --seeds must be at least 1, got 0"]
    assert not (tmp_path / "zero").exists()

    single = tmp_path / "single"
    single.mkdir()
    shutil.copy2(smoke_workdir / "config.json", single)
    with pytest.raises(UserError, match="holds a single training run"):
        train_seeds(smoke.get_config(), single, 2)
    assert sorted(p.name for p in single.iterdir()) == ["config.json"]

    # A seed still training (config.json asks for more steps than it has) is refused
    # under best / last, before anything is written.
    parent = tmp_path / "half_done"
    for seed in (0, 1):
        shutil.copytree(smoke_workdir, parent / f"seed{seed}",
                        ignore=shutil.ignore_patterns("eval", "attention", "tensorboard"))
    config = json.loads((parent / "seed1" / "config.json").read_text())
    config["train"]["num_steps"] = 80
    (parent / "seed1" / "config.json").write_text(json.dumps(config))
    for checkpoint in (None, "last"):
        with pytest.raises(UserError, match=re.escape(f"{parent / 'seed1'} has not finished "
                                                      "training (step 40 of 80): resume it")):
            evaluate(parent, split="valid", checkpoint=checkpoint)
    assert sorted(p.name for p in parent.iterdir()) == ["seed0", "seed1"]
    assert not (parent / "seed0" / "eval").exists()

    empty = tmp_path / "empty"
    (empty / "seed0").mkdir(parents=True)  # no config.json: not a seed run
    with pytest.raises(UserError, match="is not a training workdir \\(nor a parent of --seeds runs"):
        evaluate(empty, split="valid")
    assert sorted(p.name for p in empty.iterdir()) == ["seed0"]
