"""Sequence packing (data/packing.py): one batch shape for a whole run, every pair once per
epoch, each pair's own attention, exact resume; a packed train.py run compiles one train
program."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention.masks import segment_mask
from common.errors import UserError
from configs.model import ModelConfig
from data.batching import make_batch
from data.packing import PackedBatcher, make_batcher, plan_rows
from data.tokenizer import BOS_ID, EOS_ID
from models.transformer import Transformer
from training.step import batch_loss


def synthetic_pairs(n: int = 300, max_len: int = 30, seed: int = 1):
    """Pairs whose first source and first target token (10 + i) name them."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for i in range(n):
        s, t = rng.integers(1, max_len, size=2)
        sources.append([10 + i] + list(rng.integers(4, 9, s - 1)) + [EOS_ID])
        targets.append([10 + i] + list(rng.integers(4, 9, t - 1)))
    return sources, targets


def pairs_of(batch) -> list[tuple]:
    """The (source, decoder input, decoder target) token tuples of a padded or packed batch."""
    out = []
    if "src_segments" not in batch:
        for r in range(batch["src"].shape[0]):
            s, t = batch["src"][r], batch["tgt_out"][r]
            if s.any() or t.any():
                out.append((tuple(s[s > 0]), tuple(batch["tgt_in"][r][t > 0]), tuple(t[t > 0])))
        return sorted(out)
    for r in range(batch["src"].shape[0]):
        for seg in range(1, batch["src_segments"][r].max() + 1):
            s = batch["src_segments"][r] == seg
            t = batch["tgt_segments"][r] == seg
            out.append((tuple(batch["src"][r][s]), tuple(batch["tgt_in"][r][t]),
                        tuple(batch["tgt_out"][r][t])))
    return sorted(out)


def check_layout(batch, rows: int, length: int) -> None:
    """Segments run 1, 2, ... from each row's start, padding only at a row's end, positions
    count within each segment, a pair has one segment number on both sides."""
    for key in ("src", "tgt_in", "tgt_out", "src_segments", "tgt_segments", "src_positions",
                "tgt_positions"):
        assert batch[key].shape == (rows, length) and batch[key].dtype == np.int32, key
    for side, ids in (("src", batch["src"]), ("tgt", batch["tgt_out"])):
        seg, pos = batch[f"{side}_segments"], batch[f"{side}_positions"]
        np.testing.assert_array_equal(ids > 0, seg > 0)
        for r in range(rows):
            used = seg[r][seg[r] > 0]
            assert np.all(seg[r][len(used):] == 0)
            assert np.all(np.diff(used) >= 0) and np.all(np.diff(used) <= 1)
            assert len(used) == 0 or used[0] == 1
            for k in np.unique(used):
                np.testing.assert_array_equal(pos[r][seg[r] == k], np.arange(np.sum(used == k)))
    np.testing.assert_array_equal(batch["src_segments"].max(1), batch["tgt_segments"].max(1))
    assert batch["num_tokens"] == int(np.count_nonzero(batch["tgt_out"]))


def test_every_batch_has_one_shape_and_every_pair_is_laid_once_per_epoch():
    sources, targets = synthetic_pairs()
    batcher = PackedBatcher(sources, targets, batch_tokens=600, pack_length=32,
                            batch_multiple=4, seed=3)
    (rows, length), = batcher.shapes()
    assert length == 32 and rows == 600 // 32 // 4 * 4 == 16
    for epoch in range(3):
        seen = []
        for index in range(batcher.epoch_length(epoch)):
            batch = batcher.batch(epoch, index)
            check_layout(batch, rows, length)
            for src, tgt_in, tgt_out in pairs_of(batch):
                i = src[0] - 10
                assert list(src) == sources[i]
                assert list(tgt_in) == [BOS_ID, *targets[i]]
                assert list(tgt_out) == [*targets[i], EOS_ID]
                seen.append(i)
        assert sorted(seen) == list(range(len(sources)))  # every pair exactly once
    tokens = sum(int(np.count_nonzero(batcher.batch(0, i)["src"]))
                 for i in range(batcher.epoch_length(0)))
    assert tokens / (batcher.epoch_length(0) * rows * length) > 0.6  # lengths to 30, rows of 32


def test_long_pairs_widen_the_rows_never_cut():
    sources, targets = synthetic_pairs(50, max_len=70)
    longest = max(max(len(s) for s in sources), max(len(t) + 1 for t in targets))
    batcher = PackedBatcher(sources, targets, batch_tokens=1024, pack_length=16)
    (rows, length), = batcher.shapes()
    assert length == -(-longest // 8) * 8 and rows == 1024 // length
    laid = [p for i in range(batcher.epoch_length(0)) for p in pairs_of(batcher.batch(0, i))]
    assert sorted(list(src) for src, _, _ in laid) == sorted(sources)  # none dropped or cut
    with pytest.raises(UserError, match="cannot hold 2 packed row"):
        PackedBatcher(sources, targets, batch_tokens=length, pack_length=16, batch_multiple=2)


@pytest.mark.parametrize("seed", [0, 1])
def test_plan_lays_pairs_in_order_first_fit_in_bounds(seed):
    rng = np.random.default_rng(seed)
    src_len, tgt_len = rng.integers(1, 25, 400), rng.integers(2, 25, 400)
    order = rng.permutation(400)
    plan = plan_rows(src_len, tgt_len, order, rows=6, length=32)
    # Every pair once, in the order offered: the pair that fits nowhere opens the next batch.
    np.testing.assert_array_equal(np.concatenate([p[:, 0] for p in plan]), order)
    for placement, following in zip(plan, plan[1:], strict=False):
        for side, lengths in ((2, src_len), (3, tgt_len)):
            for r in range(6):
                mine = placement[placement[:, 1] == r]
                ends = mine[:, side] + lengths[mine[:, 0]]
                assert np.all(mine[1:, side] == ends[:-1]) and (len(mine) == 0 or mine[0, side] == 0)
                assert ends.max(initial=0) <= 32
        # ... and it truly fits in no row of the batch it closed.
        pair = following[0, 0]
        used = {side: np.bincount(placement[:, 1], lengths[placement[:, 0]], minlength=6)
                for side, lengths in (("src", src_len), ("tgt", tgt_len))}
        assert not np.any((used["src"] + src_len[pair] <= 32) & (used["tgt"] + tgt_len[pair] <= 32))
    for placement in plan:  # first fit: each pair's row is the first with room when it came
        used = np.zeros((2, 6), np.int64)
        for pair, row, src_at, tgt_at in placement:
            fits = (used[0] + src_len[pair] <= 32) & (used[1] + tgt_len[pair] <= 32)
            assert row == np.flatnonzero(fits)[0] and (src_at, tgt_at) == tuple(used[:, row])
            used[:, row] += (src_len[pair], tgt_len[pair])


def test_batches_are_deterministic_and_resume_from_any_position():
    sources, targets = synthetic_pairs(400)

    def make(seed):
        return PackedBatcher(sources, targets, batch_tokens=256, pack_length=32, seed=seed)

    a, b = make(7), make(7)
    lengths = [a.epoch_length(e) for e in range(3)]
    total = sum(lengths)
    first = [(e, i, x["src"].copy()) for e, i, x in itertools.islice(a.iterate(), total + 2)]
    assert [(e, i) for e, i, _ in first[lengths[0] - 1:lengths[0] + 1]] == [
        (0, lengths[0] - 1), (1, 0)]
    for cut in (1, lengths[0] - 1, lengths[0], lengths[0] + lengths[1] + 2):
        epoch, index = b.position(cut)
        resumed = list(itertools.islice(make(7).iterate(epoch, index), len(first) - cut))
        for (e1, i1, x1), (e2, i2, x2) in zip(first[cut:], resumed, strict=True):
            assert (e1, i1) == (e2, i2) and np.array_equal(x1, x2["src"])
    # train.py resumes at (epoch, index + 1): past an epoch's last batch is the next epoch.
    assert next(a.iterate(0, lengths[0]))[:2] == (1, 0)
    plans = [[frozenset(p[:, 0]) for p in a.epoch_plan(e)] for e in range(2)]
    assert set(plans[0]) != set(plans[1])  # batches recomposed every epoch
    assert [frozenset(p[:, 0]) for p in make(8).epoch_plan(0)] != plans[0]


def test_padded_buckets_stay_without_pack_length_and_fields_need_them():
    from data.batching import TrainBatcher

    sources, targets = synthetic_pairs(60)
    padded = make_batcher(sources, targets, 512, 64, bucket_step=16)
    assert isinstance(padded, TrainBatcher) and "src_segments" not in padded.batch(0, 0)
    with pytest.raises(ValueError, match="teacher_links need data.pack_length=0"):
        make_batcher(sources, targets, 512, 64, pack_length=32,
                     fields={"teacher_links": lambda rows, b, length: None})


def test_segment_mask_matches_numpy():
    q = np.array([[1, 1, 2, 2, 0], [1, 2, 3, 0, 0]])
    k = np.array([[1, 2, 2, 0], [3, 3, 1, 2]])
    expected = (q[:, None, :, None] == k[:, None, None, :]) & (k > 0)[:, None, None, :]
    np.testing.assert_array_equal(np.asarray(segment_mask(jnp.asarray(q), jnp.asarray(k))), expected)


def tiny_model() -> Transformer:
    config = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, num_heads=4,
                         num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.0,
                         max_positions=256)
    return Transformer(config, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_packed_loss_and_gradients_equal_the_padded_ones(seed):
    """Packing changes only which positions are computed: every pair's loss and the
    gradient of their sum are those of the padded batch of the same pairs."""
    model = tiny_model()
    graphdef, params = nnx.split(model, nnx.Param)
    sources, targets = synthetic_pairs(25, max_len=20, seed=seed)
    sources = [[min(t, 49) for t in s] for s in sources]
    targets = [[min(t, 49) for t in s] for s in targets]
    packed_batcher = PackedBatcher(sources, targets, batch_tokens=32 * 32, pack_length=32)
    assert packed_batcher.epoch_length(0) == 1  # all 25 pairs in one batch
    packed = packed_batcher.batch(0, 0)
    longest = max(len(s) for s in sources), max(len(t) for t in targets) + 1
    batch = make_batch(sources, targets, range(25), 27, *longest)
    assert pairs_of(packed) == pairs_of(batch)
    assert np.count_nonzero(packed["src_segments"].max(1)) < 25  # rows shared by pairs

    def sums(p, b):
        b = {k: jnp.asarray(v) for k, v in b.items() if k != "num_tokens"}
        return batch_loss(nnx.merge(graphdef, p), b, label_smoothing=0.1)[1]

    def total(p, b):
        return sums(p, b)["loss_sum"]

    padded_sums, packed_sums = sums(params, batch), sums(params, packed)
    for key in ("loss_sum", "nll_sum", "tokens"):
        np.testing.assert_allclose(float(packed_sums[key]), float(padded_sums[key]), rtol=2e-5)
    padded_grads = jax.grad(total)(params, batch)
    packed_grads = jax.grad(total)(params, packed)
    for a, b in zip(jax.tree.leaves(packed_grads), jax.tree.leaves(padded_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)


# ------------------------------------------------------------------ train.py end to end


def packed_smoke(num_steps: int):
    """configs/smoke.py packed into 32 rows of 64: its epoch of 1,877 pairs is 43 steps."""
    from configs import smoke

    cfg = smoke.get_config()
    cfg.data.pack_length = 64
    cfg.train.batch_tokens = 2048
    cfg.train.num_steps = num_steps
    cfg.eval.every_steps = 1000  # one validation, at the end
    cfg.eval.max_sentences = 8
    cfg.attention_maps.enabled = False
    return cfg


def train_counting_programs(monkeypatch, cfg, workdir) -> list:
    """train.train(cfg, workdir) in this process; returns the train steps it jitted."""
    import train

    made, original = [], train.make_train_step

    def spy(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    with monkeypatch.context() as patch:
        patch.setattr(train, "make_train_step", spy)
        assert train.train(cfg, workdir) == 0
    return made


def test_packed_run_compiles_one_train_program_over_two_epochs(monkeypatch, tmp_path):
    import json

    workdir = tmp_path / "run"
    made = train_counting_programs(monkeypatch, packed_smoke(50), workdir)
    events = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in events if e["split"] == "train"][-1] == 1  # a second epoch
    assert len(made) == 1 and made[0]._cache_size() == 1


@pytest.mark.slow
def test_packed_run_resumed_equals_an_uninterrupted_one(monkeypatch, tmp_path):
    """Stopped at step 20 and resumed to 50 (past the first epoch's end), a packed run ends
    at the parameters of one trained straight to 50."""
    import orbax.checkpoint as ocp

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_counting_programs(monkeypatch, packed_smoke(50), straight)
    train_counting_programs(monkeypatch, packed_smoke(20), resumed)
    made = train_counting_programs(monkeypatch, packed_smoke(50), resumed)
    assert made[0]._cache_size() == 1

    def params(workdir):
        state = ocp.StandardCheckpointer().restore((workdir / "checkpoints" / "50" / "state").absolute())
        return jax.tree_util.tree_leaves_with_path(state["params"])

    for (path, a), (_, b) in zip(params(straight), params(resumed), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
