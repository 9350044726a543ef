"""Minimum-Bayes-risk selection over an n-best list (evaluation/mbr.py): each candidate's
expected utility is its mean sentence score against the others, the most central one is
chosen, ties and lists of one keep beam search's answer."""

import pytest
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
