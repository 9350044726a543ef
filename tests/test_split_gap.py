"""The validation − test gap split into brevity and precisions (evaluation/split_gap.py):
its factors are sacreBLEU's own, the two parts add up to the gap, and a gap that only one
factor makes is given to that factor alone."""

import json
import math

import pytest
from conftest import REFS, SYS_B, SYS_C, run_module
from sacrebleu.metrics import BLEU

from common.errors import UserError
from evaluation.scoring import score
from evaluation.split_gap import bleu_parts, split_gap, split_gaps, summary_line

LONG, SHORT = SYS_B, SYS_C  # SYS_C writes much shorter sentences than the references


def parts(score_: float, precisions: list[float], bp: float, ratio: float = 1.0) -> dict:
    return {"score": score_, "precisions": precisions, "bp": bp, "ratio": ratio,
            "hyp_len": 0, "ref_len": 0}


def exact(precisions: list[float], bp: float) -> float:
    """BLEU from its factors, as sacreBLEU computes it."""
    return 100 * bp * math.exp(sum(math.log(p / 100) for p in precisions) / 4)


@pytest.mark.parametrize("metric", ["bleu", "bleu_lc_tok"])
def test_factors_are_read_from_sacrebleus_summary(metric):
    result = score(SHORT, REFS, compat_lc_tok=True)
    got = bleu_parts(result, metric)
    assert got["score"] == result[metric]
    if metric == "bleu":
        direct = BLEU().corpus_score(SHORT, [REFS])
        assert got["precisions"] == [round(p, 1) for p in direct.precisions]
        assert got["bp"] == round(direct.bp, 3)
        assert (got["hyp_len"], got["ref_len"]) == (direct.sys_len, direct.ref_len)
    assert got["bp"] < 1  # SHORT is shorter than the references
    assert exact(got["precisions"], got["bp"]) == pytest.approx(got["score"], abs=0.1)


def test_the_parts_add_up_to_the_gap_and_each_factor_keeps_its_own():
    p_v, p_t = [75.0, 52.0, 37.0, 27.0], [74.0, 51.0, 36.0, 26.0]
    # Only the brevity penalty moves: all of the gap is brevity's.
    only_bp = split_gap(parts(exact(p_v, 0.99), p_v, 0.99), parts(exact(p_v, 0.97), p_v, 0.97))
    assert only_bp["precision_part"] == pytest.approx(0, abs=1e-9)
    assert only_bp["brevity_part"] == pytest.approx(only_bp["gap"]) and only_bp["gap"] > 0
    # Only the precisions move.
    only_p = split_gap(parts(exact(p_v, 0.98), p_v, 0.98), parts(exact(p_t, 0.98), p_t, 0.98))
    assert only_p["brevity_part"] == pytest.approx(0, abs=1e-9)
    assert only_p["precision_diffs"] == pytest.approx([1.0, 1.0, 1.0, 1.0])
    # Both: the Shapley shares, against the two orders computed by hand.
    v, t = parts(exact(p_v, 0.99), p_v, 0.99), parts(exact(p_t, 0.97), p_t, 0.97)
    both = split_gap(v, t)
    first_p = v["score"] - exact(p_t, 0.99)  # precisions changed first
    second_p = exact(p_v, 0.97) - t["score"]  # precisions changed last
    assert both["precision_part"] == pytest.approx((first_p + second_p) / 2)
    assert both["precision_part"] + both["brevity_part"] == pytest.approx(both["gap"])
    assert both["precision_part"] > 0 and both["brevity_part"] > 0


def test_groups_are_paired_in_order_and_averaged():
    long_, short = score(LONG, REFS, compat_lc_tok=True), score(SHORT, REFS, compat_lc_tok=True)
    result = split_gaps([long_, short], [short, long_])
    one, two = result["models"]
    assert one["gap"] == pytest.approx(long_["bleu_lc_tok"] - short["bleu_lc_tok"])
    assert two["gap"] == pytest.approx(-one["gap"])
    assert result["mean"]["gap"] == pytest.approx(0)
    assert result["mean"]["bp"] == pytest.approx([(one["bp"][0] + two["bp"][0]) / 2,
                                                  (one["bp"][1] + two["bp"][1]) / 2])
    with pytest.raises(UserError, match="as many"):
        split_gaps([long_], [short, long_])
    with pytest.raises(UserError, match="bleu_lc_tok_text"):
        split_gaps([{"bleu_lc_tok": 40.0}], [long_])


def test_summary_line_never_prints_a_negative_zero():
    """A difference that rounds to zero reads +0.0, not -0.0 (a sign it does not have)."""
    p = [75.0, 52.0, 37.0, 27.0]
    tiny = split_gap(parts(exact(p, 0.98), p, 0.98),
                     parts(exact(p, 0.98) + 0.001, [75.0, 52.0, 37.0, 27.004], 0.98))
    assert tiny["gap"] < 0 and tiny["precision_diffs"][3] < 0
    line = summary_line({"metric": "bleu", "models": [tiny], "mean": tiny})
    assert "-0.0" not in line, line
    assert "gap +0.00" in line and "+0.0 / +0.0 / +0.0 / +0.0" in line, line


def test_command_prints_writes_and_refuses_a_result_without_a_summary(tmp_path):
    files = {}
    for name, hyps in (("long", LONG), ("short", SHORT)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(score(hyps, REFS, compat_lc_tok=True)))
    out = tmp_path / "gap.json"
    run = run_module("evaluation.split_gap", "--valid", str(files["long"]), "--test",
                     str(files["short"]), "--output", str(out))
    assert run.returncode == 0, run.stderr
    assert "bleu_lc_tok gap +" in run.stdout and "brevity" in run.stdout
    written = json.loads(out.read_text())
    assert written["valid_files"] == [str(files["long"])]
    assert written["mean"]["brevity_part"] > 0  # SHORT's brevity penalty is the lower

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "bleu_lc_tok": 40.0}))
    before = out.read_bytes()
    run = run_module("evaluation.split_gap", "--valid", str(bad), "--test",
                     str(files["short"]), "--output", str(out))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "no bleu_lc_tok" in run.stderr
    assert out.read_bytes() == before
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    run = run_module("evaluation.split_gap", "--valid", str(listed), "--test",
                     str(files["short"]), "--output", str(out))
    assert run.returncode == 2 and "not an evaluate.py result" in run.stderr
    assert out.read_bytes() == before
