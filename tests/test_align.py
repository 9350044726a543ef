"""The alignment command `python -m attention.align` and `align` / `select`, end
to end on the smoke model (de->en) and a smoke model of the other direction (en->de).

The smoke models learn next to nothing: these tests check the contract (one Pharaoh line
per pair, indices inside the words, the same links with and without --gold, the score
lines, symmetrisation of the two directions, stored settings reproducing the figures,
one-line errors), not alignment quality. The arithmetic of AER and of the symmetrisation
heuristics is checked against hand-computed cases in tests/test_alignment.py.
"""

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import run_module, run_script

from alignment.aligner import JOINT_READING
from alignment.links import parse_pharaoh, read_gold, read_pairs, symmetrize

FIXTURES = Path(__file__).parent / "fixtures"
PAIRS, GOLD = FIXTURES / "rwth_de_en.head10.de-en", FIXTURES / "rwth_de_en.head10.talp"
SCORE = r"precision: (\d+\.\d\d) recall: (\d+\.\d\d)"


@pytest.fixture(scope="module")
def reverse_workdir(tmp_path_factory) -> Path:
    """The smoke config trained en->de (40 steps, ~20 s) with an alignment head (its HMM
    form, alignment.jumps), its reverse twin (alignment.reverse) and the
    student they teach (alignment.student), so the tests read the cross-attention
    (de->en), the head's and the student's posteriors (en->de) and the reverse head's
    (de->en, from the same run)."""
    workdir = tmp_path_factory.mktemp("smoke_en_de") / "run"
    result = run_script("train.py", "--config", "configs/smoke.py:align", "--workdir",
                        str(workdir), "--config.data.source_lang=en",
                        "--config.data.target_lang=de", "--config.alignment.jumps=True",
                        "--config.alignment.reverse=True", "--config.alignment.student=True")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def parallel(module: str, cases: dict[str, list[str]]) -> dict:
    with ThreadPoolExecutor(max_workers=min(len(cases), 3)) as pool:
        return dict(zip(cases, pool.map(lambda argv: run_module(module, *argv), cases.values()),
                        strict=True))


def check_lines(stdout: str, sources: list[str], targets: list[str]) -> list[list]:
    """Exactly one Pharaoh line per pair, every index inside that pair's words."""
    lines = stdout.split("\n")
    assert lines[-1] == "" and len(lines) == len(sources) + 1, stdout
    out = []
    for line, src, tgt in zip(lines, sources, targets, strict=False):
        links = parse_pharaoh(line)
        assert all(0 <= i < len(src.split()) and 0 <= j < len(tgt.split()) for i, j in links)
        out.append(links)
    return out


def test_command_end_to_end(smoke_workdir, tmp_path):
    sources, targets = read_pairs(PAIRS)
    (tmp_path / "de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "en").write_text("\n".join(targets) + "\n", encoding="utf-8")
    base = ["--workdir", str(smoke_workdir)]
    results = parallel("attention.align", {
        "pairs": [*base, "--pairs", str(PAIRS)],
        "sides": [*base, "--source", str(tmp_path / "de"), "--target", str(tmp_path / "en")],
        "gold": [*base, "--pairs", str(PAIRS), "--gold", str(GOLD), "--dev_sentences", "4",
                 "--plot", str(tmp_path / "pair1.png"), "--plot_pair", "1"],
    })
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr[-2000:])
    links = check_lines(results["pairs"].stdout, sources, targets)
    assert sum(map(len, links)) > 0
    # The links do not depend on how the pairs came in, nor on --gold.
    assert results["sides"].stdout == results["gold"].stdout == results["pairs"].stdout
    assert results["pairs"].stderr == results["sides"].stderr == ""
    err = results["gold"].stderr.splitlines()
    assert re.fullmatch(rf"AER: (\d+\.\d\d) {SCORE}", err[0]), err
    assert re.fullmatch(rf"AER first 4: \d+\.\d\d {SCORE}", err[1]), err
    assert re.fullmatch(rf"AER other 6: \d+\.\d\d {SCORE}", err[2]), err
    assert re.match(r"settings: checkpoint (20|40), layer 0, heads mean, argmax; symmetrize none$",
                    err[3]), err
    assert len(err) == 4
    assert (tmp_path / "pair1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # --plot

    # The Python function gives the same links and the figures of the AER line.
    from alignment.command import align

    result = align(smoke_workdir, sources, targets, golds=read_gold(GOLD, sources, targets))
    assert result["links"] == links
    scores = result["scores"]["all"]
    assert err[0] == (f"AER: {100 * scores['aer']:.2f} precision: "
                      f"{100 * scores['precision']:.2f} recall: {100 * scores['recall']:.2f}")
    assert result["settings"]["reverse"] is None and result["settings"]["symmetrize"] == "none"


def test_settings_change_the_reading(smoke_workdir):
    from alignment.command import align

    sources, targets = read_pairs(PAIRS)
    default = align(smoke_workdir, sources, targets)
    argmax, step = default["links"], default["settings"]["checkpoint"]
    assert align(smoke_workdir, sources, targets, threshold="argmax", heads=(0, 1),
                 layer="mean", checkpoint=step)["links"] == argmax  # 1 layer, 2 heads
    shifted = align(smoke_workdir, sources, targets, shift=True)
    assert shifted["settings"]["shift"] is True and shifted["links"] != argmax
    # A threshold links every piece above it: lower thresholds give supersets.
    low = align(smoke_workdir, sources, targets, threshold=0.05)["links"]
    high = align(smoke_workdir, sources, targets, threshold=0.3)["links"]
    assert all(set(h) <= set(lo) for h, lo in zip(high, low, strict=True))
    assert sum(map(len, low)) > sum(map(len, high))
    head0 = align(smoke_workdir, sources, targets, heads=(0,))
    assert head0["settings"]["heads"] == (0,)


def test_long_and_empty_pairs_still_get_a_line(smoke_workdir):
    """Chunked forced decoding: a pair longer than max_tokens is aligned in pieces, an
    empty side gives an empty line; nothing is dropped or truncated."""
    from alignment.command import align

    sources, targets = read_pairs(PAIRS)
    long_src, long_tgt = " ".join(sources * 6), " ".join(targets * 6)
    srcs, tgts = [sources[0], long_src, "", sources[1]], [targets[0], long_tgt, targets[2], ""]
    links = align(smoke_workdir, srcs, tgts, max_tokens=64)["links"]
    assert len(links) == 4 and links[2] == [] and links[3] == []
    n_src, n_tgt = len(long_src.split()), len(long_tgt.split())
    assert all(0 <= i < n_src and 0 <= j < n_tgt for i, j in links[1])
    # Every target word of the long pair is reached (argmax links each piece somewhere),
    # the last ones included: the chunks cover the whole pair.
    assert {j for _, j in links[1]} == set(range(n_tgt))
    assert max(i for i, _ in links[1]) > n_src * 0.9
    # Short pairs are not chunked: the same links as alone.
    assert links[0] == align(smoke_workdir, srcs[:1], tgts[:1])["links"][0]


def test_reverse_model_and_symmetrization(smoke_workdir, reverse_workdir):
    from alignment.command import align
    from common.errors import UserError

    sources, targets = read_pairs(PAIRS)
    fwd = align(smoke_workdir, sources, targets)["links"]
    backward = align(reverse_workdir, targets, sources, keep_recorded=True)
    back = backward["links"]  # (en, de) links
    # A run with both heads reads their joint posterior by default (JOINT_READING) ...
    assert {k: backward["settings"][k] for k in ("layer", *JOINT_READING)} == {
        "layer": "alignment_joint", **JOINT_READING}
    assert back == backward["recorded"].links("alignment_joint", False, 0.3, prior_weight=0.25,
                                              words=True)
    assert back != backward["recorded"].links("alignment", False, None)
    # ... each given setting wins over it, and a given layer has its own defaults.
    low = align(reverse_workdir, targets, sources, threshold=0.05)
    assert (low["settings"]["threshold"], low["settings"]["prior_weight"]) == (0.05, 0.25)
    assert align(reverse_workdir, targets, sources, threshold="argmax")["settings"][
        "threshold"] is None
    head = align(reverse_workdir, targets, sources, layer="alignment")
    assert (head["settings"]["words"], head["settings"]["threshold"]) == (False, None)
    # The word map --plot draws: [target words, source words], a row's mass at most 1 (the
    # rest is on </s>), and the argmax links read from the same posterior sit on it.
    rec = backward["recorded"]
    matrix = rec.word_matrix(0, "alignment", False)
    assert matrix.shape == (len(sources[0].split()), len(targets[0].split()))
    assert np.all(matrix >= 0) and np.all(matrix.sum(axis=1) <= 1 + 1e-5)
    assert back != align(reverse_workdir, targets, sources, layer=0)["links"]
    with pytest.raises(UserError, match="--shift does not apply to --layer alignment"):
        align(reverse_workdir, targets, sources, shift=True)
    # The prior weight: 1 is the head's own posterior (the default); 0 the lexical table
    # alone, another map (the smoke model's argmax links happen to agree); only the head
    # has one.
    assert head["settings"]["prior_weight"] == 1.0
    assert align(reverse_workdir, targets, sources, layer="alignment",
                 prior_weight=1.0)["links"] == head["links"]
    lexical = align(reverse_workdir, targets, sources, layer="alignment", prior_weight=0.0,
                    threshold=0.05)
    assert lexical["settings"]["prior_weight"] == 0.0
    assert lexical["links"] == rec.links("alignment", False, 0.05, prior_weight=0.0)
    assert lexical["links"] != rec.links("alignment", False, 0.05, prior_weight=1.0)
    assert not np.allclose(rec.word_matrix(0, "alignment", False, prior_weight=0.0), matrix,
                           atol=1e-3)
    only_the_heads = (r"--prior_weight applies to the heads' layers \(alignment, "
                      r"alignment_reverse, alignment_joint, alignment_heads_student\) only")
    with pytest.raises(UserError, match=only_the_heads):
        align(reverse_workdir, targets, sources, layer=0, prior_weight=0.5)
    with pytest.raises(UserError, match=only_the_heads):
        align(reverse_workdir, targets, sources, layer="alignment_student", prior_weight=0.5)
    # The student: its own posterior (no prior weight), rows of target pieces as the
    # head's, each row's mass on the source pieces and NULL summing to 1.
    taught = align(reverse_workdir, targets, sources, layer="alignment_student",
                   threshold="argmax", keep_recorded=True)
    assert (taught["settings"]["layer"], taught["settings"]["prior_weight"]) == (
        "alignment_student", None)
    assert taught["links"] == taught["recorded"].links("alignment_student", False, None)
    assert taught["links"] != head["links"]
    rec_taught = taught["recorded"]
    for posterior in rec_taught.head_posteriors(None, "alignment_student"):
        np.testing.assert_allclose(posterior.sum(-1), 1.0, rtol=1e-5)
    # Its joint reading: the geometric mean of its rows' and its columns' posteriors.
    for (rows, columns), joint in zip(rec_taught.student, rec_taught.head_posteriors(
            None, "alignment_student_joint"), strict=True):
        np.testing.assert_allclose(columns.sum(-1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(joint[:-1, :-1], np.sqrt(rows[:-1, :-1] * columns[:-1, :-1].T),
                                   rtol=1e-6)
        assert np.all(joint[-1] == 0) and np.all(joint[:, -1] == 0)
    # The heads and the student: the mean of the two joint readings, the heads' at W.
    for mean, heads, student in zip(
            rec_taught.head_posteriors(0.5, "alignment_heads_student"),
            rec_taught.head_posteriors(0.5, "alignment_joint"),
            rec_taught.head_posteriors(None, "alignment_student_joint"), strict=True):
        np.testing.assert_allclose(mean, (heads + student) / 2, rtol=1e-6)
    with pytest.raises(UserError, match=r"has no alignment_student head "
                                        r"\(no alignment config group\)"):
        align(smoke_workdir, sources, targets, layer="alignment_student")
    rev = [[(i, j) for j, i in links] for links in back]
    for method in ("intersect", "union", "grow-diag-final-and"):
        result = align(smoke_workdir, sources, targets, reverse_workdir=reverse_workdir,
                       symmetrize_with=method)
        assert result["links"] == [symmetrize(f, r, method)
                                   for f, r in zip(fwd, rev, strict=True)]
        assert result["settings"]["reverse"]["workdir"] == str(reverse_workdir.resolve())
    # --reverse_workdir alone means grow-diag-final-and; "none" ignores the reverse run.
    assert align(smoke_workdir, sources, targets, reverse_workdir=reverse_workdir)[
        "settings"]["symmetrize"] == "grow-diag-final-and"
    assert align(smoke_workdir, sources, targets, reverse_workdir=reverse_workdir,
                 symmetrize_with="none")["links"] == fwd
    with pytest.raises(UserError, match="is the run itself, which has no reverse head"):
        align(smoke_workdir, sources, targets, reverse_workdir=smoke_workdir)
    # A run with a reverse head is its own reverse model: the head's links with the
    # reverse head's, from one forced decoding.
    own = align(reverse_workdir, targets, sources, reverse_workdir=reverse_workdir,
                symmetrize_with="union", layer="alignment", threshold="argmax",
                keep_recorded=True)
    rec_own = own["recorded"]
    head, twin = (rec_own.links(layer, False, None) for layer in ("alignment",
                                                                  "alignment_reverse"))
    assert own["links"] == [symmetrize(f, r, "union") for f, r in zip(head, twin, strict=True)]
    assert own["settings"]["reverse"]["layer"] == "alignment_reverse"
    assert all(0 <= j < len(s.split()) and 0 <= i < len(t.split())  # (en word, de word)
               for links, s, t in zip(twin, sources, targets, strict=True) for i, j in links)
    # The joint reading: a link where the geometric mean of the two heads' posteriors
    # clears the threshold, so it lies within the union of the heads' own threshold links
    # (sqrt(p q) >= d needs p >= d or q >= d) and is read from one map of the pair.
    joint = align(reverse_workdir, targets, sources, layer="alignment_joint", threshold=0.3,
                  keep_recorded=True)
    assert joint["settings"]["layer"] == "alignment_joint"
    either = [set(a) | set(b) for a, b in zip(
        *(rec_own.links(layer, False, 0.3) for layer in ("alignment", "alignment_reverse")),
        strict=True)]
    assert all(set(links) <= union for links, union in zip(joint["links"], either, strict=True))
    joint_matrix = joint["recorded"].word_matrix(0, "alignment_joint", False)
    assert joint_matrix.shape == matrix.shape and np.all(joint_matrix >= 0)
    # Without a reverse run: the forward map's argmax rows with its columns.
    for method, words in (("union", False), ("grow-diag-final-and", True)):
        one = align(smoke_workdir, sources, targets, symmetrize_with=method, words=words,
                    keep_recorded=True)
        assert one["settings"]["reverse"] is None and one["settings"]["words"] is words
        layer = one["settings"]["layer"]
        assert one["links"] == one["recorded"].links(layer, False, None, words=words,
                                                     both_ways=method)
        assert one["links"] != one["recorded"].links(layer, False, None, words=words)


def test_select_on_random_parameters_stores_apart_from_the_trained_choice(smoke_workdir,
                                                                           tmp_path):
    """--select --reinit_seed N (the sanity check) writes eval/alignment.reinit<N>.json and
    leaves the trained run's eval/alignment.json byte for byte; a bare --reinit_seed N
    reads the random model's stored choice."""
    workdir = tmp_path / "run"
    shutil.copytree(smoke_workdir, workdir)
    trained_choice = workdir / "eval" / "alignment.json"
    trained_choice.parent.mkdir(exist_ok=True)
    trained_choice.write_text('{"settings": {"layer": "mean"}}\n', encoding="utf-8")
    flags = ["--workdir", str(workdir), "--pairs", str(PAIRS), "--gold", str(GOLD),
             "--dev_sentences", "5", "--checkpoint", "40", "--reinit_seed", "1"]
    selected = run_module("attention.align", *flags, "--select")
    assert selected.returncode == 0, selected.stderr[-2000:]
    assert trained_choice.read_text(encoding="utf-8") == '{"settings": {"layer": "mean"}}\n'
    stored = json.loads((workdir / "eval" / "alignment.reinit1.json").read_text())
    assert stored["selected_on"]["reinit_seed"] == 1
    assert "stored in <workdir>/eval/alignment.reinit1.json" in selected.stderr
    bare = run_module("attention.align", *flags)
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert bare.stdout == selected.stdout  # the random model, read at its stored settings


def test_select_stores_settings_the_bare_command_reproduces(smoke_workdir, reverse_workdir,
                                                            tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(smoke_workdir, workdir)
    (workdir / "eval" / "alignment.json").unlink(missing_ok=True)
    flags = ["--workdir", str(workdir), "--pairs", str(PAIRS), "--gold", str(GOLD),
             "--dev_sentences", "5"]
    selected = run_module("attention.align", *flags, "--select",
                          "--reverse_workdir", str(reverse_workdir))
    assert selected.returncode == 0, selected.stderr[-2000:]
    stored = json.loads((workdir / "eval" / "alignment.json").read_text())
    settings = stored["settings"]
    assert set(settings) == {"checkpoint", "layer", "heads", "shift", "words", "threshold",
                             "prior_weight", "measure", "symmetrize", "reverse"}
    assert settings["measure"] == "weights"
    assert settings["checkpoint"] in ("20", "40") and settings["heads"] == "mean"
    # 2 checkpoints x (layer 0, mean) x shift x piece or word map x (argmax + 7
    # thresholds), both directions, and the forward maps read both ways (x 3 methods);
    # the reverse run's alignment head, its reverse twin, their joint reading and its
    # mean with the student's add 2 checkpoints x 4 prior weights x 2 maps x (argmax + 7
    # thresholds) each, the student's two readings the same without prior weights.
    assert len(stored["grid"]) == 128 + 48 + 128 + 4 * 128 + 2 * 32
    assert stored["selected_on"]["dev_sentences"] == 5
    head_grid = [g for g in stored["grid"] if g["layer"] == "alignment"]
    assert len(head_grid) == 128 and {g["prior_weight"] for g in head_grid} == {1, 0.5, 0.25, 0}
    both_ways = [g for g in stored["grid"] if g.get("symmetrize", "none") != "none"]
    assert len(both_ways) == 48 and all(g["threshold"] is None for g in both_ways)
    assert all(g["prior_weight"] is None for g in stored["grid"]
               if g["layer"] not in ("alignment", "alignment_reverse", "alignment_joint",
                                     "alignment_heads_student"))
    forward = [g for g in stored["grid"] if g["direction"] == "forward"]
    assert stored["scores"]["dev"]["aer"] <= min(g["dev_aer"] for g in forward) + 1e-12
    assert stored["scores"]["dev"]["sentences"] == 5
    assert stored["scores"]["test"]["sentences"] == 5

    bare = run_module("attention.align", *flags)  # no settings given: the stored ones
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert bare.stdout == selected.stdout
    check_lines(bare.stdout, *read_pairs(PAIRS))
    assert bare.stderr.splitlines()[:3] == selected.stderr.splitlines()[:3]
    aer = float(re.match(r"AER: (\S+)", bare.stderr).group(1))
    assert aer == round(100 * stored["scores"]["all"]["aer"], 2)
    assert "selected on the first 5 pairs" in selected.stderr
    # A flag given wins over the stored value.
    other = run_module("attention.align", *flags, "--symmetrize", "none", "--layer", "mean",
                       "--threshold", "argmax", "--noshift", "--nowords")
    assert other.returncode == 0, other.stderr[-2000:]
    assert "layer mean, heads mean, argmax; symmetrize none" in other.stderr


def test_bad_inputs_one_line_exit_2(smoke_workdir, tmp_path):
    """Input errors: one `error:` line, exit 2; file errors come before the workdir is read."""
    good = ["--pairs", str(PAIRS)]
    short, no_bar, one = tmp_path / "short.en", tmp_path / "bad.de-en", tmp_path / "one.talp"
    short.write_text("one line\n")
    one.write_text("1-1\n")
    no_bar.write_text("a ||| b\nno bar here\n")
    (tmp_path / "de").write_text("a\nb\n")
    absent = tmp_path / "run"
    cases = {
        "pairs missing": (["--workdir", str(absent), "--pairs", str(tmp_path / "no")],
                          f"file not found: {tmp_path / 'no'}"),
        "no |||": (["--workdir", str(absent), "--pairs", str(no_bar)],
                   f"{no_bar}:2: expected 'source ||| target'"),
        "counts differ": (["--workdir", str(absent), "--source", str(tmp_path / "de"),
                           "--target", str(short)], "has 2 lines but"),
        "gold count": (["--workdir", str(absent), *good, "--gold", str(one)],
                       f"{one} has 1 lines but the input has 10 pairs"),
        "gold not talp": (["--workdir", str(absent), *good, "--gold", str(short)],
                          f"{short}:1: not a 1-indexed TALP link: 'one'"),
        "both inputs": (["--workdir", str(absent), *good, "--source", str(short)],
                        "give --pairs FILE, or --source FILE and --target FILE"),
        "select without gold": (["--workdir", str(absent), *good, "--select"],
                                "--select needs --gold"),
        "threshold": (["--workdir", str(absent), *good, "--threshold", "2"],
                      "--threshold must be 'argmax' or a number in (0, 1], got '2'"),
        "layer word": (["--workdir", str(absent), *good, "--layer", "top"],
                       "--layer must be an index, 'mean' or one of 'alignment', "
                       "'alignment_reverse', 'alignment_joint', 'alignment_student', "
                       "'alignment_student_joint', 'alignment_heads_student', got 'top'"),
        "no head": (["--workdir", str(smoke_workdir), *good, "--layer", "alignment"],
                    "has no alignment head (no alignment config group)"),
        "plot pair": (["--workdir", str(smoke_workdir), *good, "--plot", str(tmp_path / "p.png"),
                       "--plot_pair", "10"], "--plot_pair 10: the input has pairs 0..9"),
        "bad symmetrize": (["--workdir", str(absent), *good, "--symmetrize", "grow"],
                           "--symmetrize"),
        "no workdir": (["--workdir", str(absent), *good], f"{absent}/config.json not found"),
        "layer range": (["--workdir", str(smoke_workdir), *good, "--layer", "3"],
                        "--layer 3: "),
        "prior weight": (["--workdir", str(absent), *good, "--prior_weight", "2"],
                         "--prior_weight must be in [0, 1], got 2"),
        "prior weight, no head": (
            ["--workdir", str(smoke_workdir), *good, "--prior_weight", "0.5"],
            "--prior_weight applies to the heads' layers (alignment, alignment_reverse, "
            "alignment_joint, alignment_heads_student) only"),
    }
    results = parallel("attention.align", {name: argv for name, (argv, _) in cases.items()})
    for name, result in results.items():
        assert result.returncode == 2, (name, result.stderr[-2000:])
        assert re.fullmatch(r"error: [^\n]+\n", result.stderr), (name, result.stderr[-2000:])
        assert cases[name][1] in result.stderr, (name, result.stderr)
        assert result.stdout == "", name
    assert not absent.exists()


def test_alignment_peers_strips_the_runs_copies_of_the_pairs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("peers", Path("bench/alignment_peers.py"))
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    src, tgt = ["a", "b"], ["A", "B"]
    assert peers.strip_copies(src + ["x", "y"] * 3, tgt + ["X", "Y"] * 3, ["x", "y"],
                              ["X", "Y"]) == (src, tgt, 3)
    assert peers.strip_copies(src, tgt, ["y"], ["other"]) == (src, tgt, 0)
    assert peers.strip_copies(["x"], ["X"], ["x"], ["X"]) == ([], [], 1)


def test_alignment_peers_bench(smoke_workdir, reverse_workdir, tmp_path):
    """bench/alignment_peers.py on the 10 fixture pairs and 300 training pairs: eflomal's
    rows and attnmt's, the latter equal to `align` with the same settings."""
    pytest.importorskip("eflomal")
    out = tmp_path / "peers.json"
    result = run_script("bench/alignment_peers.py", "--pairs", str(PAIRS), "--gold", str(GOLD),
                        "--workdir", str(smoke_workdir), "--reverse_workdir",
                        str(reverse_workdir), "--max_train_pairs", "300", "--eflomal_stages",
                        "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    readings = ["fwd", "rev", "grow-diag-final-and", "intersect", "union"]
    assert [r["method"] for r in data["rows"]] == [
        *(f"eflomal{stage} {m}" for stage in ("", " -m 1", " -m 2") for m in readings),
        "attnmt fwd", "attnmt rev", "attnmt grow-diag-final-and"]
    assert data["bitext"]["train_pairs"] == 300 and data["gold_pairs"] == 10
    rows = {r["method"]: r for r in data["rows"]}
    for row in rows.values():  # 10 pairs: no dev / test split
        assert set(row) - {"method", "settings"} == {"all"}
        assert 0.0 <= row["all"]["aer"] <= 1.0
    links = {m: rows[f"eflomal {m}"]["all"]["hyp_links"]
             for m in ("intersect", "grow-diag-final-and", "union")}
    assert links["intersect"] <= links["grow-diag-final-and"] <= links["union"]
    from alignment.command import align

    sources, targets = read_pairs(PAIRS)
    same = align(smoke_workdir, sources, targets, golds=read_gold(GOLD, sources, targets))
    assert rows["attnmt fwd"]["all"] == same["scores"]["all"]
    assert "eflomal fwd" in result.stdout and "AER" in result.stdout


def test_alignment_peers_without_eflomal_is_one_line():
    import subprocess
    import sys

    from conftest import REPO

    code = ("import runpy, sys; sys.modules['eflomal'] = None; "
            f"sys.argv = ['alignment_peers.py', '--pairs', {str(PAIRS)!r}, '--gold', "
            f"{str(GOLD)!r}]; runpy.run_path('bench/alignment_peers.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == ("error: eflomal is not installed: pip install -e '.[bench]' "
                             "(or pip install eflomal)\n")


@pytest.mark.long
def test_alignment_readings_bench(reverse_workdir, tmp_path):
    """bench/alignment_readings.py on the en->de run (pairs and gold swapped to its
    direction): one row per kept checkpoint, each reading's scores equal to `align`'s
    with the same fixed settings."""
    sources, targets = read_pairs(PAIRS)
    pairs = tmp_path / "swapped.en-de"
    pairs.write_text("".join(f"{t} ||| {s}\n" for s, t in zip(sources, targets, strict=True)))
    gold = tmp_path / "swapped.talp"
    gold.write_text("".join(" ".join(re.sub(r"(\d+)([-p])(\d+)", r"\3\2\1", link)
                                     for link in line.split()) + "\n"
                            for line in GOLD.read_text().splitlines()))
    out = tmp_path / "readings.json"
    result = run_script("bench/alignment_readings.py", "--workdir", str(reverse_workdir),
                        "--pairs", str(pairs), "--gold", str(gold), "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    kept = sorted(int(p.name) for p in (reverse_workdir / "checkpoints").iterdir()
                  if p.name.isdigit())
    assert [row["step"] for row in data["rows"]] == kept
    from alignment.command import align

    en, de = read_pairs(pairs)
    golds = read_gold(gold, en, de)
    last = data["rows"][-1]
    assert len(last["readings"]) == 7  # the reverse run has both heads and the student
    student = align(reverse_workdir, en, de, golds=golds, checkpoint=str(kept[-1]),
                    layer="alignment_student_joint", threshold=0.3, words=True)
    assert last["readings"]["student joint, word map, threshold 0.3"] == \
        student["scores"]["all"]
    joint = align(reverse_workdir, en, de, golds=golds, checkpoint=str(kept[-1]),
                  layer="alignment_joint", threshold=0.3, words=True, prior_weight=0.5)
    assert last["readings"]["joint, word map, W = 0.5, threshold 0.3"] == joint["scores"]["all"]
    assert "| run, step |" in result.stdout


def test_a_refused_select_creates_no_eval_folder(smoke_workdir, tmp_path):
    """--select on a run whose only checkpoint is damaged is refused in one line and leaves
    the workdir as it was: no eval/ folder appears before the checkpoint has loaded."""
    workdir = tmp_path / "run"
    shutil.copytree(smoke_workdir, workdir, ignore=shutil.ignore_patterns("eval"))
    for step in (workdir / "checkpoints").iterdir():  # every kept step: truncate its arrays
        for data in (step / "state").rglob("d/*"):
            if data.is_file():
                data.write_bytes(data.read_bytes()[:10])
    before = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))
    result = run_module("attention.align", "--workdir", str(workdir), "--select",
                        "--pairs", str(FIXTURES / "rwth_de_en.head10.de-en"),
                        "--gold", str(FIXTURES / "rwth_de_en.head10.talp"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) == before
