"""attention.heads: importance finds a planted head, role statistics match a NumPy count,
and the command writes heads.json, the figures and the table for a trained run."""

import json

import numpy as np
import pytest
from conftest import run_module
from flax import nnx

from analysis.head_stats import HeadStats, is_punctuation, rarest_flags
from analysis.heads import KINDS, MaskedEval, prunable_heads
from configs.model import ModelConfig
from models.transformer import Transformer


def planted_model(kind_layer_head: tuple[str, int, int]) -> Transformer:
    """In the planted head's kind, every other head's output projection rows are zero and
    the planted head's are scaled up: removing another head of that kind changes nothing,
    removing the planted one a lot. Other kinds keep their weights (the source must reach
    the decoder for an encoder head to matter)."""
    config = ModelConfig(src_vocab_size=200, tgt_vocab_size=200, d_model=32, num_heads=2,
                         num_encoder_layers=1, num_decoder_layers=1, d_ff=64, dropout=0.0)
    model = Transformer(config, rngs=nnx.Rngs(0))
    attention = {"encoder_self": lambda lay: model.encoder_layers[lay].attention,
                 "decoder_self": lambda lay: model.decoder_layers[lay].self_attention,
                 "cross": lambda lay: model.decoder_layers[lay].cross_attention}
    planted_kind, planted_layer, planted_head = kind_layer_head
    module = attention[planted_kind](planted_layer)
    kernel = np.zeros_like(np.asarray(module.out.kernel[...]))  # [H * Dv, D]
    rows = slice(planted_head * 16, (planted_head + 1) * 16)
    kernel[rows] = 3.0 * np.asarray(module.out.kernel[...])[rows]
    module.out.kernel[...] = kernel
    assert planted_layer == 0
    return model


def test_importance_ranks_a_planted_head_first(smoke_workdir):
    from data.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(smoke_workdir / "tokenizer")
    sources = ["Ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Schnee .", "Eine Frau liest ."]
    targets = ["A man rides a bike .", "Two dogs play in the snow .", "A woman reads ."]
    for planted in (("cross", 0, 1), ("encoder_self", 0, 0)):
        model = planted_model(planted)
        evaluator = MaskedEval(model, tokenizer, sources, targets, batch_size=4, bucket_step=8,
                               beam_size=1, length_penalty=0.6, masks_per_batch=2)
        dims = {k: (1, 2) for k in KINDS}
        base = evaluator.loss({k: np.ones((1, 2), np.float32) for k in KINDS})
        grads = evaluator.grad_importance(dims)
        kind, _, planted_head = planted
        for head in range(2):
            mask = {k: np.ones((1, 2), np.float32) for k in KINDS}
            mask[kind][0, head] = 0.0
            change = abs(evaluator.loss(mask) - base)
            if head == planted_head:
                assert change > 1e-3 and grads[kind][0, head] > 1e-4
            else:
                assert change < 1e-6 and grads[kind][0, head] == 0.0, (planted, head)
        # BLEU under batched masks equals BLEU under each mask alone.
        masks = [{k: np.ones((1, 2), np.float32) for k in KINDS} for _ in range(3)]
        masks[1][planted[0]][0, planted[2]] = 0.0
        together = evaluator.bleu(masks)
        assert together == [evaluator.bleu([m])[0] for m in masks]


def test_head_stats_match_a_numpy_count():
    rng = np.random.default_rng(0)
    w = rng.random((1, 2, 1, 3, 4))
    w[:, 0, :, :, 3] = 0.0  # sentence 0 has 3 keys
    w /= w.sum(-1, keepdims=True)
    query_valid = np.array([[True, True, False], [True, True, True]])
    flags = {"eos": np.array([[0, 0, 1, 0], [0, 0, 0, 1]], bool),
             "punctuation": np.array([[0, 1, 0, 0], [0, 0, 0, 0]], bool),
             "rare": np.array([[1, 0, 0, 0], [0, 1, 0, 0]], bool)}
    stats = HeadStats(1, 1, positional=True)
    stats.add(w, query_valid, flags)
    out = stats.result()
    rows = [(b, q) for b in range(2) for q in range(3) if query_valid[b, q]]
    row = [w[0, b, 0, q] for b, q in rows]
    assert out["confidence"][0][0] == pytest.approx(np.mean([r.max() for r in row]))
    entropy = [-(r[r > 0] * np.log(r[r > 0])).sum() for r in row]
    assert out["entropy"][0][0] == pytest.approx(np.mean(entropy))
    assert out["previous"][0][0] == pytest.approx(np.mean([w[0, b, 0, q, q - 1] if q else 0.0
                                                           for b, q in rows]))
    assert out["same"][0][0] == pytest.approx(np.mean([w[0, b, 0, q, q] for b, q in rows]))
    assert out["eos"][0][0] == pytest.approx(np.mean([(w[0, b, 0, q] * flags["eos"][b]).sum()
                                                      for b, q in rows]))
    assert HeadStats(1, 1, positional=False).result()["previous"] is None
    assert is_punctuation("▁.") and is_punctuation(",") and not is_punctuation("▁a.")
    counts = np.array([0, 0, 0, 0, 9, 1, 5])
    np.testing.assert_array_equal(rarest_flags(np.array([[4, 6, 5, 3], [0, 0, 0, 0]]), counts),
                                  [[False, False, True, False], [False] * 4])
    assert prunable_heads({0: 30.0, 4: 29.8, 8: 29.0, 12: 29.9}, 30.0) == 4


@pytest.mark.slow
def test_heads_command_end_to_end(smoke_workdir, tmp_path):
    out = tmp_path / "heads"
    result = run_module("attention.heads", "--workdir", str(smoke_workdir), "--max_sentences",
                        "24", "--out", str(out), "--over_training")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "heads.json").read_text())
    for kind in KINDS:
        for metric in ("importance", "importance_bleu", "importance_grad", "confidence"):
            assert np.asarray(report[kind][metric]).shape == (1, 2), (kind, metric)
    curve = report["pruning_curve"]
    assert curve[0]["heads_removed"] == 0 and curve[-1]["heads_removed"] == 6
    assert curve[0]["bleu"] == pytest.approx(report["base_bleu"])
    assert 0 <= report["prunable_heads"] <= 6 and len(report["over_training"]) == 2
    for name in ("importance", "importance_bleu", "importance_grad", "pruning_curve",
                 "over_training"):
        assert (out / f"{name}.png").stat().st_size > 1000
    assert "heads can be removed" in result.stdout and "cross" in result.stdout
    bad = run_module("attention.heads", "--workdir", str(smoke_workdir), "--gold", "x.talp")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: ")
