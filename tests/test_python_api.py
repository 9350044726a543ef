"""train.train and evaluate.evaluate called in-process, as a notebook would: no flags parsed."""

import json

import pytest

from common.errors import UserError
from configs import smoke


def test_train_then_evaluate_from_python(tmp_path):
    from evaluate import evaluate
    from train import train

    cfg = smoke.get_config()
    cfg.train.num_steps = 8
    cfg.eval.every_steps = 8
    cfg.checkpoint.every_steps = 4
    cfg.attention_maps.enabled = False
    workdir = tmp_path / "run"
    assert train(cfg, workdir) == 0
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [4, 8]
    events = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["split"] == "valid"] == [8]

    result = evaluate(workdir, split="valid", beam_size=1, max_sentences=8, checkpoint="last")
    assert result["checkpoint_step"] == 8 and result["num_sentences"] == 8
    assert result["decoding"]["decode"] == "greedy" and result["bleu"] is not None
    written = json.loads((workdir / "eval" / f"{result['name']}.json").read_text())
    assert written["bleu"] == result["bleu"]
    assert len((workdir / "eval" / f"{result['name']}.hyp.txt").read_text().splitlines()) == 8

    with pytest.raises(UserError, match="--beam_size must be at least 1"):
        evaluate(workdir, split="valid", beam_size=0)
    # A resume under a config that changed the model is refused before anything is written.
    cfg.model.d_model = 64
    with pytest.raises(UserError, match="model.d_model"):
        train(cfg, workdir)
