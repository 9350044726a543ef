"""Minimum-Bayes-risk selection over an n-best list (evaluation/mbr.py): each candidate's
expected utility is its mean sentence score against the others, the most central one is
chosen, ties and lists of one keep beam search's answer; and the study command's `top1`
is evaluate.py's own beam reading."""

import json
import shutil

import pytest
from conftest import run_module, run_script
from sacrebleu.metrics import BLEU, CHRF

from evaluation.mbr import expected_utilities, mbr_select, utility_metric

DOGS = ["a cat sleeps on the red sofa .", "two dogs run through the snow .",
        "two dogs are running through the snow .", "two dogs run in the snow ."]


@pytest.mark.parametrize("utility", ["bleu", "chrf"])
def test_expected_utility_is_the_mean_score_against_the_other_candidates(utility):
    metric = BLEU(effective_order=True) if utility == "bleu" else CHRF()
    want = [sum(metric.sentence_score(c, [o]).score for o in DOGS if o is not c) / 3
            for c in DOGS]
    assert expected_utilities(DOGS, utility) == pytest.approx(want, abs=1e-9)
    assert type(utility_metric(utility)) is type(metric)


@pytest.mark.parametrize("utility", ["bleu", "chrf"])
def test_the_most_central_candidate_wins_over_the_best_scored(utility):
    assert mbr_select([DOGS], utility) == [1]  # the outlier ranked first loses
    gains = expected_utilities(DOGS, utility)
    assert gains[0] < min(gains[1:])


def test_ties_and_short_lists_keep_the_beams_answer():
    assert mbr_select([["a dog", "a dog", "a dog"]], "bleu") == [0]
    assert mbr_select([["a dog ."], []], "chrf") == [0, -1]
    with pytest.raises(ValueError, match="utility"):
        utility_metric("ter")


def test_study_top1_is_evaluates_beam_reading(smoke_workdir, tmp_path):
    out = tmp_path / "mbr.json"
    done = run_module("evaluation.mbr", "--workdir", str(smoke_workdir), "--split", "test",
                      "--max_sentences", "8", "--beam_sizes", "2,3", "--length_penalty", "1.0",
                      "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    labels = [r["label"] for r in result["readings"]]
    assert labels == [f"beam{k}.{s}" for k in (2, 3) for s in ("top1", "mbr-bleu", "mbr-chrf")]
    assert result["num_sentences"] == 8 and result["length_penalty"] == 1.0
    files = {label: (tmp_path / f"mbr.{label}.hyp.txt") for label in labels}
    assert result["files"] == {label: str(path) for label, path in files.items()}
    lines = {label: path.read_text().splitlines() for label, path in files.items()}
    for r in result["readings"]:
        assert len(lines[r["label"]]) == 8
        differ = sum(a != b for a, b in zip(lines[r["label"]], lines[f"beam{r['beam_size']}.top1"],
                                            strict=True))
        assert differ <= r["changed"] <= 8  # another entry may read as the same text
        assert r["changed"] == 0 or r["selection"] != "top1"

    evaluated = tmp_path / "run"
    shutil.copytree(smoke_workdir, evaluated)  # evaluate.py writes into eval/
    beam = run_script("evaluate.py", "--workdir", str(evaluated), "--split", "test",
                      "--max_sentences", "8", "--beam_size", "3", "--length_penalty", "1.0",
                      "--compat_lc_tok", "--name", "beam3")
    assert beam.returncode == 0, beam.stderr[-3000:]
    assert (evaluated / "eval" / "beam3.hyp.txt").read_text().splitlines() == lines["beam3.top1"]
    want = json.loads((evaluated / "eval" / "beam3.json").read_text())
    top1 = next(r for r in result["readings"] if r["label"] == "beam3.top1")
    assert {k: top1[k] for k in ("bleu", "bleu_lc_tok", "chrf")} == {
        k: want[k] for k in ("bleu", "bleu_lc_tok", "chrf")}


@pytest.mark.parametrize(("flags", "message"), [
    (["--beam_sizes", "1,5"], "--beam_sizes 1,5: integers of at least 2"),
    (["--utilities", "bleu,ter"], "--utilities bleu,ter: each one of bleu, chrf"),
    (["--output", "{tmp}/out.txt"], "must be a .json file"),
])
def test_bad_flags_one_line_exit_2_nothing_written(smoke_workdir, tmp_path, flags, message):
    flags = [f.format(tmp=tmp_path) for f in flags]
    output = ["--output", str(tmp_path / "out.json")] if "--output" not in flags else []
    done = run_module("evaluation.mbr", "--workdir", str(smoke_workdir), *output, *flags)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert message in lines[0]
    assert list(tmp_path.iterdir()) == []
