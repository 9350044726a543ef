"""The paired bootstrap of two groups of seeds (evaluation/significance.py): its scores are
sacreBLEU's, each resample is the corpus score of the resampled sentences, and the gain
behaves as a difference of group means must."""

import gzip
import json

import numpy as np
import pytest
from conftest import REFS, SYS_A, SYS_B, SYS_C, run_module
from sacrebleu.metrics import BLEU, CHRF

from common.errors import UserError
from data.protocol import lc_norm_tok
from evaluation.scoring import score
from evaluation.significance import compare_groups


@pytest.mark.parametrize("metric", ["bleu", "chrf", "bleu_lc_tok"])
def test_whole_set_scores_are_sacrebleus(metric):
    result = compare_groups(REFS, [SYS_A, SYS_C], [SYS_B], metric=metric, resamples=5)
    for hyps, got in zip([SYS_A, SYS_C, SYS_B], result["baseline"]["scores"] +
                         result["candidate"]["scores"], strict=True):
        if metric == "bleu":
            expected = BLEU().corpus_score(hyps, [REFS]).score
        elif metric == "chrf":
            expected = CHRF().corpus_score(hyps, [REFS]).score
        else:  # evaluate.py's --compat_lc_tok reading
            expected = score(hyps, REFS, compat_lc_tok=True)["bleu_lc_tok"]
        assert got == pytest.approx(expected, abs=1e-9)
    means = np.mean(result["candidate"]["scores"]) - np.mean(result["baseline"]["scores"])
    assert result["gain"] == pytest.approx(means)


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_each_resample_is_the_corpus_score_of_the_resampled_sentences(metric):
    seed, resamples = 7, 4
    result = compare_groups(REFS, [SYS_A, SYS_C], [SYS_B], metric=metric,
                            resamples=resamples, seed=seed)
    indices = np.random.default_rng(seed).integers(0, len(REFS), size=(resamples, len(REFS)))
    scorer = BLEU() if metric == "bleu" else CHRF()
    for r, ix in enumerate(indices):
        def corpus(hyps, ix=ix):
            return scorer.corpus_score([hyps[i] for i in ix], [[REFS[i] for i in ix]]).score
        expected = corpus(SYS_B) - (corpus(SYS_A) + corpus(SYS_C)) / 2
        assert result["resampled_gains"][r] == pytest.approx(expected, abs=1e-9)


def test_gain_is_antisymmetric_and_zero_between_equal_groups():
    ab = compare_groups(REFS, [SYS_A], [SYS_B, SYS_C], resamples=50, seed=3)
    ba = compare_groups(REFS, [SYS_B, SYS_C], [SYS_A], resamples=50, seed=3)
    assert ab["gain"] == pytest.approx(-ba["gain"])
    np.testing.assert_allclose(ab["resampled_gains"], -ba["resampled_gains"], atol=1e-9)
    same = compare_groups(REFS, [SYS_A, SYS_B], [SYS_B, SYS_A], resamples=50)
    assert same["gain"] == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(same["resampled_gains"], 0.0, atol=1e-9)
    assert same["p_not_better"] == 1.0  # never ahead: the one-sided p of "better" is 1


def test_a_clearly_better_group_is_ahead_in_every_resample():
    result = compare_groups(REFS, [SYS_A, SYS_C], [REFS], resamples=200)
    assert result["gain"] > 30
    assert result["p_not_better"] == 0.0
    low, high = result["ci95"]
    assert 0 < low <= result["gain"] <= high


def test_a_group_on_the_literatures_text_meets_the_raw_ones_on_lc_tok_bleu():
    # SYS_B as a run trained on lc_norm_tok would write it: lowercased, tokenised, escaped
    # ("a woman &apos;s bag"). Scored as written against the raw references' lc-tok form it
    # must read as SYS_B itself reads on bleu_lc_tok; the escapes left in, or the text
    # tokenised a second time, would score lower.
    lc_b = lc_norm_tok(SYS_B, "en")
    assert any("&apos;" in line for line in lc_b)
    raw = compare_groups(REFS, [SYS_A], [SYS_B], metric="bleu_lc_tok", resamples=20)
    mixed = compare_groups(REFS, [SYS_A], [lc_b], metric="bleu_lc_tok", resamples=20,
                           protocols=("raw", "lc_norm_tok"))
    assert mixed["candidate"]["scores"] == pytest.approx(raw["candidate"]["scores"], abs=1e-9)
    assert mixed["baseline"]["scores"] == pytest.approx(raw["baseline"]["scores"], abs=1e-9)
    np.testing.assert_allclose(mixed["resampled_gains"], raw["resampled_gains"], atol=1e-9)
    assert mixed["protocols"] == {"baseline": "raw", "candidate": "lc_norm_tok"}
    as_if_raw = compare_groups(REFS, [SYS_A], [lc_b], metric="bleu_lc_tok", resamples=20)
    assert as_if_raw["candidate"]["scores"][0] < raw["candidate"]["scores"][0] - 1


def test_bad_arguments_are_user_errors():
    with pytest.raises(UserError, match="--metric"):
        compare_groups(REFS, [SYS_A], [SYS_B], metric="ter")
    with pytest.raises(UserError, match="at least one"):
        compare_groups(REFS, [], [SYS_B])
    with pytest.raises(UserError, match="bleu_lc_tok only"):
        compare_groups(REFS, [SYS_A], [SYS_B], metric="chrf", protocols=("raw", "lc_norm_tok"))
    with pytest.raises(UserError, match="text protocol"):
        compare_groups(REFS, [SYS_A], [SYS_B], protocols=("raw", "lowercase"))


def test_command_prints_writes_and_refuses_a_file_of_another_length(tmp_path):
    ref = tmp_path / "ref.en.gz"
    with gzip.open(ref, "wt", encoding="utf-8") as f:
        f.write("\n".join(REFS) + "\n")
    files = {}
    for name, lines in (("a", SYS_A), ("b", SYS_B), ("c", SYS_C)):
        files[name] = tmp_path / f"{name}.hyp.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "cmp.json"
    run = run_module("evaluation.significance", "--reference", str(ref), "--baseline",
                     f"{files['a']},{files['c']}", "--candidate", str(files["b"]),
                     "--resamples", "100", "--output", str(out))
    assert run.returncode == 0, run.stderr
    assert "gain +" in run.stdout and "p_not_better" in run.stdout
    written = json.loads(out.read_text())
    direct = compare_groups(REFS, [SYS_A, SYS_C], [SYS_B], resamples=100)
    assert written["gain"] == pytest.approx(direct["gain"])
    assert written["ci95"] == pytest.approx(direct["ci95"])
    assert written["candidate_files"] == [str(files["b"])]

    short = tmp_path / "short.hyp.txt"
    short.write_text("\n".join(SYS_B[:-1]) + "\n", encoding="utf-8")
    before = out.read_bytes()
    run = run_module("evaluation.significance", "--reference", str(ref), "--baseline",
                     str(files["a"]), "--candidate", str(short), "--output", str(out))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "has 5 lines" in run.stderr
    assert out.read_bytes() == before  # a refused comparison leaves the old result alone

    lc = tmp_path / "b_lc.hyp.txt"
    lc.write_text("\n".join(lc_norm_tok(SYS_B, "en")) + "\n", encoding="utf-8")
    mixed = [str(ref), "--baseline", str(files["a"]), "--candidate", str(lc),
             "--candidate_protocol", "lc_norm_tok", "--resamples", "20"]
    run = run_module("evaluation.significance", "--reference", *mixed, "--metric", "chrf",
                     "--output", str(out))
    assert run.returncode == 2 and "bleu_lc_tok only" in run.stderr
    assert out.read_bytes() == before
    run = run_module("evaluation.significance", "--reference", *mixed, "--metric",
                     "bleu_lc_tok", "--output", str(out))
    assert run.returncode == 0, run.stderr
    written = json.loads(out.read_text())
    direct = compare_groups(REFS, [SYS_A], [SYS_B], metric="bleu_lc_tok", resamples=20)
    assert written["gain"] == pytest.approx(direct["gain"])
    assert written["protocols"]["candidate"] == "lc_norm_tok"
