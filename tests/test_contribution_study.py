"""analysis/contribution_study.py: the source share, rank correlations and agreement of
the measures against hand-built arrays, the teacher-forced maps against the map-file
path (record_maps), re-initialised parameters (evaluation.loading.reinitialised), and
the command end to end on the fixture workdir, a refused run writing nothing."""

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import run_module
from scipy.stats import spearmanr

from analysis.contribution_study import (
    PAIRS,
    correlations,
    diagonal_links,
    measure_agreement,
    rank_correlation,
    row_normalised,
    sentence_share,
    teacher_forced_maps,
)

FIXTURES = Path(__file__).parent / "fixtures"
WORKDIR = FIXTURES / "workdir_cef8104"  # configs/smoke.py at step 20: 1+1 layers, 2 heads
SOURCES = ["Ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Schnee .", "Kinder"]
REFERENCES = ["A man rides a bike .", "Two dogs play in the snow .", "Children"]


def test_sentence_share_is_the_mean_of_the_alti_row_sums_over_valid_steps():
    rng = np.random.default_rng(0)
    alti = rng.uniform(0, 0.2, size=(3, 5, 4))  # [N, T, S], hand-built ALTI+ source part
    lengths = np.array([5, 2, 1])
    share = alti.sum(-1)  # [N, T]
    share[1, 2:] = 99.0  # past a sentence's length: ignored
    share[2, 1:] = -7.0
    got = sentence_share(share, lengths)
    expected = [alti[i, :n].sum(-1).mean() for i, n in enumerate(lengths)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    with pytest.raises(ValueError):
        sentence_share(share, np.array([5, 0, 1]))
    with pytest.raises(ValueError):
        sentence_share(share, np.array([6, 1, 1]))


def test_rank_correlation_self_reverse_scipy_and_constant():
    rng = np.random.default_rng(1)
    m = rng.uniform(size=(6, 7))
    assert rank_correlation(m.ravel(), m.ravel()) == pytest.approx(1.0)
    assert rank_correlation(m.ravel(), -m.ravel()) == pytest.approx(-1.0)
    reversed_ranks = np.argsort(np.argsort(-m.ravel()))  # largest cell ranked last
    assert rank_correlation(m.ravel(), reversed_ranks) == pytest.approx(-1.0)
    # ties, batched over leading axes: scipy's Spearman row by row
    a = rng.integers(0, 4, size=(2, 3, 20)).astype(float)
    b = a + rng.integers(0, 3, size=a.shape)
    got = rank_correlation(a, b)
    assert got.shape == (2, 3)
    for idx in np.ndindex(2, 3):
        assert got[idx] == pytest.approx(spearmanr(a[idx], b[idx]).statistic, abs=1e-12)
    assert np.isnan(rank_correlation(np.ones(5), np.arange(5.0)))
    assert np.isnan(rank_correlation(np.ones(1), np.ones(1)))


def test_measure_agreement_sees_where_each_step_looks_not_how_much():
    rng = np.random.default_rng(2)
    weights = rng.dirichlet(np.ones(6), size=(2, 3, 4))  # [L, H, T, S], rows sum to 1
    row_scale = rng.uniform(0.5, 3.0, size=(2, 3, 4, 1))
    alti = row_normalised(weights[-1].mean(0)) * rng.uniform(0.2, 0.9, size=(4, 1))
    got = measure_agreement(weights, weights * row_scale, alti)
    assert got["weights_vs_norm"].shape == (2, 3)
    np.testing.assert_allclose(got["weights_vs_norm"], 1.0)  # rows rescaled: same ranks
    assert got["weights_vs_alti_last"] == pytest.approx(1.0)
    assert set(PAIRS) <= set(got)
    # a norm-based map ranked the other way round within each row
    reversed_rows = 1.0 / weights
    assert np.all(measure_agreement(weights, reversed_rows, alti)["weights_vs_norm"] < -0.5)
    with pytest.raises(ValueError):
        measure_agreement(weights, weights, alti[:, :3])


def test_correlations_and_diagonal_links():
    x = np.arange(10.0)
    c = correlations(x, x**3)
    assert c["spearman"] == pytest.approx(1.0) and c["pearson"] < 1.0 and c["n"] == 10
    assert correlations(x, np.ones(10))["spearman"] is None
    assert correlations([1.0, np.nan, 3.0, 4.0], [2.0, 5.0, 1.0, 0.0])["n"] == 3
    assert diagonal_links(3, 3) == [(0, 0), (1, 1), (2, 2)]
    assert diagonal_links(4, 2) == [(1, 0), (3, 1)]
    assert diagonal_links(2, 4) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert diagonal_links(0, 3) == []


def test_reinitialised_params_same_tree_new_values_seeded():
    from evaluation.loading import load_params

    trained = load_params(WORKDIR)
    fresh = load_params(WORKDIR, reinit_seed=1)
    again = load_params(WORKDIR, reinit_seed=1)
    other = load_params(WORKDIR, reinit_seed=2)
    leaves = [jax.tree.leaves(x.params) for x in (trained, fresh, again, other)]
    assert all(jax.tree.structure(x.params) == jax.tree.structure(trained.params)
               for x in (fresh, other))
    assert [(a.shape, a.dtype) for a in leaves[1]] == [(a.shape, a.dtype) for a in leaves[0]]
    differ = [not np.array_equal(a, b) for a, b in zip(leaves[0], leaves[1], strict=True)]
    assert sum(differ) > len(differ) // 2  # every matrix; a layer norm may start where it is
    assert all(np.array_equal(a, b) for a, b in zip(leaves[1], leaves[2], strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(leaves[1], leaves[3], strict=True))
    assert (fresh.reinit_seed, trained.reinit_seed, fresh.steps) == (1, None, trained.steps)
    matrices = [np.asarray(a) for a in leaves[1] if a.ndim == 2]
    assert matrices and all(a.std() > 0 for a in matrices)  # drawn, not zeros


def test_teacher_forced_maps_equal_the_map_file_path():
    """Padded, bucketed and batched with repeated rows, each pair's maps equal
    record_maps(..., contributions=True) on that pair."""
    from configs.resolved import load_config_json
    from evaluation.loading import load_params, load_tokenizer
    from models.translate import record_maps

    loaded = load_params(WORKDIR)
    tokenizer = load_tokenizer(WORKDIR, load_config_json(WORKDIR))
    src = tokenizer.encode_source(SOURCES)
    tgt = tokenizer.encode_target(REFERENCES)
    got = teacher_forced_maps(loaded.model, src, tgt, batch_size=2)
    maps = record_maps(loaded.model, tokenizer, src, tgt, contributions=True)  # one batch
    for i in range(len(src)):
        s, t = int(maps.source_lengths[i]), int(maps.target_lengths[i])
        assert (s, t) == (len(src[i]), len(tgt[i]) + 1)
        assert got[i]["weights"].shape == (1, 2, t, s) and got[i]["alti"].shape == (t, s)
        np.testing.assert_allclose(got[i]["weights"], maps.cross[i, :, :, :t, :s], atol=1e-5)
        np.testing.assert_allclose(got[i]["norm"], maps.norm_cross[i, :, :, :t, :s], atol=1e-5)
        np.testing.assert_allclose(got[i]["alti"], maps.alti_source[i, :t, :s], atol=1e-5)
        np.testing.assert_allclose(got[i]["source_share"], maps.source_share[i, :t], atol=1e-5)


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


def test_command_end_to_end_and_refusals(tmp_path):
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "study.json"
    common = ["--workdir", str(WORKDIR), "--source", str(src), "--reference", str(ref)]
    workdir_before = _files(WORKDIR)
    result = run_module("analysis.contribution_study", *common, "--json", str(out),
                        "--figures", str(tmp_path / "fig"), "--beam_size", "1", "--lowest", "2",
                        "--gold_pairs", str(FIXTURES / "rwth_de_en.head10.de-en"),
                        "--gold", str(FIXTURES / "rwth_de_en.head10.talp"))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["num_sentences"] == 3 and data["decoding"]["beam_size"] == 1
    rows = data["per_sentence"]
    assert len(rows["share"]) == len(rows["chrf"]) == len(rows["target_steps"]) == 3
    assert all(0.0 <= s <= 1.0 for s in rows["share"])
    lowest = data["source_share"]["lowest"]
    assert [e["share"] for e in lowest] == sorted(e["share"] for e in lowest) and len(lowest) == 2
    assert lowest[0]["share"] == pytest.approx(min(rows["share"]), abs=1e-5)
    assert {e["source"] for e in lowest} <= set(SOURCES)
    assert np.array(data["agreement"]["per_head"]["weights_vs_norm"]["mean"]).shape == (1, 2)
    assert set(data["agreement"]["pairs"]) == set(PAIRS)
    assert data["diagonal_baseline"]["scores"]["all"]["sentences"] == 10
    assert data["checkpoint"] == {"requested": "best", "steps": [20], "reinit_seed": None}
    for path in data["figures"]:
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "source share: mean" in result.stdout
    assert _files(WORKDIR) == workdir_before  # the fixture is only read

    # Refused runs: one error line, exit 2, nothing written anywhere.
    no_checkpoint = tmp_path / "no_checkpoint"
    shutil.copytree(WORKDIR, no_checkpoint, ignore=shutil.ignore_patterns("checkpoints"))
    cases = {
        "missing workdir": ["--workdir", str(tmp_path / "nope")],
        "bad beam": [*common, "--beam_size", "0"],
        "unknown flag": [*common, "--bogus", "1"],
        "bad split": ["--workdir", str(WORKDIR), "--split", "train"],
        "source without reference": ["--workdir", str(WORKDIR), "--source", str(src)],
        "gold alone": [*common, "--gold", str(FIXTURES / "rwth_de_en.head10.talp")],
        "negative seed": [*common, "--reinit_seed", "-1"],
        "no checkpoint": ["--workdir", str(no_checkpoint), "--source", str(src),
                          "--reference", str(ref)],
    }
    before = _files(tmp_path)
    with ThreadPoolExecutor(4) as pool:  # subprocesses: the refusals side by side
        refusals = pool.map(lambda args: run_module(
            "analysis.contribution_study", *args, "--json", str(tmp_path / "refused" / "r.json")),
            cases.values())
    for name, refused in zip(cases, refusals, strict=True):
        assert refused.returncode == 2, (name, refused.stderr[-2000:])
        assert re.fullmatch(r"error: [^\n]+\n", refused.stderr), (name, refused.stderr)
    assert _files(tmp_path) == before
    assert _files(WORKDIR) == workdir_before


def test_partial_rank_correlation_removes_a_shared_cause():
    from analysis.contribution_study import partial_rank_correlation

    rng = np.random.default_rng(3)
    z = rng.uniform(size=400)
    x, y = z + 0.05 * rng.normal(size=400), z + 0.05 * rng.normal(size=400)
    assert correlations(x, y)["spearman"] > 0.9
    assert abs(partial_rank_correlation(x, y, z)) < 0.15  # only z linked them
    w = rng.normal(size=400)
    assert partial_rank_correlation(x + 3 * w, y + 3 * w, z) > 0.8  # a link beside z stays
    assert partial_rank_correlation([1.0, 2.0], [2.0, 1.0], [0.0, 1.0]) is None


def test_align_reads_the_reinitialised_model_when_asked(tmp_path):
    """attention.align --reinit_seed's path: with reinit_seed the aligner's forced decoding
    reads the random model (the same one each time), without it the checkpoint's; a
    negative seed is refused in one line."""
    from alignment.forced import Recorded

    sources, targets = ["ein Mann läuft .", "zwei Hunde"], ["a man runs .", "two dogs"]
    trained = Recorded(WORKDIR, "20", sources, targets)
    random, again = (Recorded(WORKDIR, "20", sources, targets, reinit_seed=1)
                     for _ in range(2))
    for t, r, a in zip(trained.atts, random.atts, again.atts, strict=True):
        assert t.shape == r.shape and not np.allclose(t, r, atol=1e-3)
        np.testing.assert_array_equal(r, a)
    pairs = tmp_path / "p.txt"
    pairs.write_text("ein Mann ||| a man\n", encoding="utf-8")
    refused = run_module("attention.align", "--workdir", str(WORKDIR), "--pairs", str(pairs),
                         "--reinit_seed", "-3")
    assert (refused.returncode, refused.stderr) == (2, "error: --reinit_seed must be >= 0, got -3\n")
