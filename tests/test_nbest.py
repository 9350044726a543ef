"""Choosing from beam search's n-best list (evaluation/nbest.py, evaluation/rerank.py):
the command's `top1` is evaluate.py's own beam reading, a channel weight of 0 keeps it,
a large one picks what the reverse model scores highest; reranking's arithmetic; bad
flags are one line and write nothing."""

import json
import shutil

import numpy as np
import pytest
from conftest import run_module, run_script

from evaluation.rerank import rerank_select

SENTENCES = "8"


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    """The smoke config trained en->de: the smoke run's reverse (40 steps)."""
    workdir = tmp_path_factory.mktemp("reverse") / "run"
    done = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                      "--config.data.source_lang=en", "--config.data.target_lang=de")
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


def test_rerank_select_weighs_the_channel_and_keeps_the_first_on_a_tie():
    direct = [np.array([-1.0, -1.5, -2.0]), np.array([-0.5, -0.5]), np.array([])]
    channel = [np.array([-3.0, -1.0, -0.5]), np.array([-2.0, -2.0]), np.array([])]
    assert rerank_select(direct, channel, 0.0) == [0, 0, -1]
    assert rerank_select(direct, channel, 0.5) == [1, 0, -1]  # -2.5, -2.0, -2.25
    assert rerank_select(direct, channel, 100.0) == [2, 0, -1]


def test_top1_is_evaluates_beam_reading_and_the_channel_reranks(smoke_workdir, reverse_run,
                                                                 tmp_path):
    out = tmp_path / "nbest.json"
    done = run_module("evaluation.nbest", "--workdir", str(smoke_workdir), "--split", "test",
                      "--max_sentences", SENTENCES, "--beam_sizes", "2,3", "--length_penalty",
                      "1.0", "--reverse_workdir", str(reverse_run), "--reverse_average_last",
                      "2", "--weights", "0,1000", "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    selections = ("top1", "mbr-bleu", "mbr-chrf", "reverse0", "reverse1000")
    labels = [f"beam{k}.{s}" for k in (2, 3) for s in selections]
    assert [r["label"] for r in result["readings"]] == labels
    assert result["reverse"]["weights"] == [0.0, 1000.0] and result["length_penalty"] == 1.0
    assert result["reverse"]["checkpoint"] == {"requested": "last", "steps": [20, 40]}
    assert result["files"] == {label: str(tmp_path / f"nbest.{label}.hyp.txt") for label in labels}
    lines = {label: (tmp_path / f"nbest.{label}.hyp.txt").read_text().splitlines()
             for label in labels}
    readings = {r["label"]: r for r in result["readings"]}
    for label, r in readings.items():
        top1 = lines[f"beam{r['beam_size']}.top1"]
        assert len(lines[label]) == int(SENTENCES)
        assert sum(a != b for a, b in zip(lines[label], top1, strict=True)) <= r["changed"]
    assert readings["beam3.reverse1000"]["changed"] > 0  # the channel does choose otherwise
    for k in (2, 3):
        assert lines[f"beam{k}.reverse0"] == lines[f"beam{k}.top1"]
        assert readings[f"beam{k}.reverse0"]["changed"] == readings[f"beam{k}.top1"]["changed"] == 0

    # the channel's choice, computed here from the run's n-best and the reverse model
    from configs import resolved
    from evaluation.corpus import clean_line
    from evaluation.inputs import read_inputs
    from evaluation.loading import load_params, load_tokenizer
    from evaluation.rerank import channel_scores
    from models.translate import translate_ids

    runs = {}
    for name, workdir, average in (("forward", smoke_workdir, 0), ("reverse", reverse_run, 2)):
        cfg = resolved.load_config_json(workdir)
        tokenizer = load_tokenizer(workdir, cfg)
        runs[name] = (load_params(workdir, "last", average, cfg=cfg, tokenizer=tokenizer).model,
                      tokenizer)
    cfg = resolved.load_config_json(smoke_workdir)
    sources = read_inputs(cfg, "test", None, None, int(SENTENCES)).sources
    model, tokenizer = runs["forward"]
    nbest = translate_ids(model, tokenizer.encode_source(sources), beam_size=3,
                          length_penalty=1.0, nbest=True)
    texts = [[clean_line(t) for t in tokenizer.decode_target([ids for ids, _ in c])]
             for c in nbest]
    assert [c[0] for c in texts] == lines["beam3.top1"]
    channel = channel_scores(runs["reverse"], sources, texts, alpha=1.0, batch_size=4,
                             bucket_step=8)
    assert [len(c) for c in channel] == [len(c) for c in texts]
    assert [c[int(np.argmax(s))] for c, s in zip(texts, channel, strict=True)] == \
        lines["beam3.reverse1000"]

    evaluated = tmp_path / "run"
    shutil.copytree(smoke_workdir, evaluated)  # evaluate.py writes into eval/
    beam = run_script("evaluate.py", "--workdir", str(evaluated), "--split", "test",
                      "--max_sentences", SENTENCES, "--beam_size", "3", "--length_penalty",
                      "1.0", "--compat_lc_tok", "--name", "beam3")
    assert beam.returncode == 0, beam.stderr[-3000:]
    assert (evaluated / "eval" / "beam3.hyp.txt").read_text().splitlines() == lines["beam3.top1"]
    want = json.loads((evaluated / "eval" / "beam3.json").read_text())
    keys = ("bleu", "bleu_lc_tok", "chrf", "bleu_text", "bleu_lc_tok_text", "chrf_text")
    assert {k: readings["beam3.top1"][k] for k in keys} == {k: want[k] for k in keys}


@pytest.mark.parametrize(("flags", "message"), [
    (["--beam_sizes", "1,5"], "--beam_sizes 1,5: integers of at least 2"),
    (["--utilities", "bleu,ter"], "--utilities bleu,ter: each one of bleu, chrf"),
    (["--output", "{tmp}/out.txt"], "must be a .json file"),
    (["--reverse_workdir", "{smoke}", "--weights", "0.1,x"], "--weights 0.1,x: numbers of"),
    (["--reverse_workdir", "{smoke}"], "translates de->en; the reverse of the run is en->de"),
])
def test_bad_input_one_line_exit_2_nothing_written(smoke_workdir, tmp_path, flags, message):
    flags = [f.format(tmp=tmp_path, smoke=smoke_workdir) for f in flags]
    output = ["--output", str(tmp_path / "out.json")] if "--output" not in flags else []
    done = run_module("evaluation.nbest", "--workdir", str(smoke_workdir), "--max_sentences",
                      "2", *output, *flags)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert message in lines[0]
    assert list(tmp_path.iterdir()) == []
