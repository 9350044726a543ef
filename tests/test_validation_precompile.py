"""Validation's programs compiled ahead (evaluation/precompile.py): after waiting for
them, a validation compiles nothing; without them the same validation compiles."""

import pytest

from configs.smoke import get_config
from data.batching import eval_batches
from data.corpora import load_corpus
from data.tokenizer import Tokenizer
from evaluation.corpus import validate
from evaluation.precompile import compile_validation_ahead
from evaluation.previews import PreviewDrawer
from training.compilation import CompileTimer
from training.distributed import make_mesh, shard_batch
from training.metrics_log import MetricsLog
from training.step import create_train_state, make_eval_step, make_train_step


def _setup(smoke_workdir, d_model: int, beam_size: int, mesh=None):
    """A model of an unusual width (programs no other test compiled in this process)."""
    cfg = get_config()
    cfg.model.d_model, cfg.model.d_ff = d_model, 2 * d_model
    cfg.eval.beam_size, cfg.eval.length_penalty = beam_size, 1.0
    tokenizer = Tokenizer.load(smoke_workdir / "tokenizer")
    graphdef, state = create_train_state(cfg, tokenizer.source_vocab_size,
                                         tokenizer.target_vocab_size, mesh)
    return cfg, tokenizer, graphdef, state, make_eval_step(graphdef, cfg.train.label_smoothing)


@pytest.mark.parametrize("beam_size,on_mesh", [(1, False), (3, True)])
def test_validation_after_compiling_ahead_compiles_nothing(smoke_workdir, tmp_path, beam_size,
                                                          on_mesh):
    """Compiled from the initial state's parameters; validated on the initial ones, or as
    train.py does, on the parameters a train step on the mesh returned."""
    mesh = make_mesh() if on_mesh else None
    cfg, tokenizer, graphdef, state, eval_step = _setup(smoke_workdir, 22 + 2 * beam_size,
                                                        beam_size, mesh)
    valid = load_corpus(cfg.data, "valid")
    ahead = compile_validation_ahead(cfg, graphdef, state["params"], eval_step, tokenizer, valid)
    # eval steps per batch shape, decode shapes, and the forced and decoded maps
    kinds = [key[0] for key in ahead.futures]
    assert kinds.count("attention maps") == 2 and "decode" in kinds and "eval step" in kinds
    if on_mesh:
        batch, _ = next(eval_batches(tokenizer.encode_source(valid[0][:32]),
                                     tokenizer.encode_target(valid[1][:32]), batch_size=32))
        batch.pop("num_tokens")
        state, _ = make_train_step(graphdef, cfg.train)(state, shard_batch(batch, mesh), 1.0)
    ahead.wait()
    assert ahead.failed == []
    with CompileTimer() as compiled:
        log = MetricsLog(tmp_path, 0)
        figures = validate(cfg, graphdef, state["params"], eval_step, tokenizer, valid, 20,
                           log, tmp_path, PreviewDrawer(log, background=False))
    assert compiled.spans == []  # no tracing, lowering or XLA compiling
    assert figures["bleu"] is not None and figures["loss"] > 0

    # The same programs asked for again (another seed of a group): the same futures.
    again = compile_validation_ahead(cfg, graphdef, state["params"], eval_step, tokenizer, valid)
    assert all(again.futures[key] is future for key, future in ahead.futures.items())


def test_validation_without_compiling_ahead_compiles(smoke_workdir, tmp_path):
    """The control: the listener does see a validation's own compiles."""
    cfg, tokenizer, graphdef, state, eval_step = _setup(smoke_workdir, 20, 1)
    valid = load_corpus(cfg.data, "valid")
    with CompileTimer() as compiled:
        log = MetricsLog(tmp_path, 0)
        validate(cfg, graphdef, state["params"], eval_step, tokenizer, valid, 20, log, tmp_path,
                 PreviewDrawer(log, background=False))
    assert compiled.spans


def test_a_cancelled_run_leaves_nothing_pending(smoke_workdir):
    cfg, tokenizer, graphdef, state, eval_step = _setup(smoke_workdir, 36, 1)
    valid = load_corpus(cfg.data, "valid")
    ahead = compile_validation_ahead(cfg, graphdef, state["params"], eval_step, tokenizer, valid)
    ahead.cancel()
    ahead.wait()  # returns: cancelled programs are not waited for
    assert ahead.futures and all(future.done() for future in ahead.futures.values())
    # A later run asking for the same programs compiles the cancelled ones afresh.
    again = compile_validation_ahead(cfg, graphdef, state["params"], eval_step, tokenizer, valid)
    assert not any(future.cancelled() for future in again.futures.values())
    again.cancel()
