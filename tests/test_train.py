"""End-to-end training on the smoke config: outputs, learning, exact resume, no recompiles."""

import json
import shutil

import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import run_script
from test_previews import image_tags


def read_metrics(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def final_params(workdir, step):
    restored = ocp.StandardCheckpointer().restore((workdir / "checkpoints" / str(step) / "state").absolute())
    return restored["params"], restored


def flat(tree):
    import jax

    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_smoke_run_writes_the_workdir_and_learns(smoke_workdir):
    for name in ("config.json", "metrics.jsonl", "tokenizer/spm.model", "tokenizer/tokenizer.json"):
        assert (smoke_workdir / name).is_file(), name
    config = json.loads((smoke_workdir / "config.json").read_text())
    assert config["model"]["d_model"] == 32 and config["train"]["num_steps"] == 40
    steps = sorted(int(p.name) for p in (smoke_workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [20, 40]
    assert list((smoke_workdir / "tensorboard").glob("events.out.tfevents.*"))

    metrics = read_metrics(smoke_workdir)
    train = [m for m in metrics if m["split"] == "train"]
    valid = [m for m in metrics if m["split"] == "valid"]
    assert [m["step"] for m in train] == [10, 20, 30, 40]
    assert [m["step"] for m in valid] == [20, 40]
    for m in train:
        assert {"step", "split", "time", "loss", "learning_rate", "tokens_per_sec"} <= m.keys()
        assert m["tokens_per_sec"] > 0 and np.isfinite(m["loss"])
        assert 0 <= m["input_wait_fraction"] < 1  # seconds blocked on the input pipeline
    # Where the wall time outside the steps went: each hook's seconds in the window. The
    # log runs after the step's validation and save, so step 20's event holds step 20's,
    # and the last event the end's (training/hooks.py `train_hooks`).
    hooks = ("budget_clock", "log", "validate", "checkpoint")
    assert all({f"seconds_in_{h}" for h in hooks} <= m.keys() for m in train)
    assert [m["seconds_in_validate"] > 0 for m in train] == [False, True, False, True]
    assert [m["seconds_in_checkpoint"] > 0 for m in train] == [False, True, False, True]
    for m in valid:
        assert {"step", "split", "time", "loss", "bleu", "decode"} <= m.keys()
        assert m["decode"] == "greedy" and 0.0 <= m["bleu"] <= 100.0
        assert min(m["seconds_loss"], m["seconds_decode"], m["seconds_maps"]) > 0
    for event, valid_event in zip((train[1], train[3]), valid, strict=True):
        assert event["seconds_in_validate"] >= sum(
            valid_event[k] for k in ("seconds_loss", "seconds_decode", "seconds_maps"))
    assert train[-1]["loss"] < train[0]["loss"] - 0.3  # it learns something
    assert valid[-1]["loss"] < valid[0]["loss"]

    # Attention maps of the fixed validation sentences, teacher-forced and greedy, at each eval.
    from attention.mapfile import load_maps, validate_maps

    for step in (20, 40):
        for decode in ("teacher_forced", "greedy"):
            maps = load_maps(smoke_workdir / "attention" / f"valid_step{step:07d}_{decode}.npz")
            validate_maps(maps)
            assert maps.step == step and maps.decode == decode
    # The smoke config saves the maps without drawing them (tests/test_previews.py draws)
    assert not list((smoke_workdir / "attention").glob("*.png"))
    assert not image_tags(smoke_workdir / "tensorboard")


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(smoke_workdir, tmp_path):
    workdir = tmp_path / "resumed"
    first = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                       "--config.train.num_steps=20")
    assert first.returncode == 0, first.stderr[-2000:]
    assert not (workdir / "checkpoints" / "40").exists()
    second = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from step 20" in second.stderr

    straight, straight_all = final_params(smoke_workdir, 40)
    resumed, resumed_all = final_params(workdir, 40)
    a, b = flat(straight), flat(resumed)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=1e-6, err_msg=key)
    opt_a, opt_b = flat(straight_all["opt_state"]), flat(resumed_all["opt_state"])
    for key in opt_a:
        np.testing.assert_allclose(opt_a[key], opt_b[key], atol=1e-6, err_msg=key)
    # The resumed run logged the same losses after step 20 as the straight one.
    loss = lambda wd: {m["step"]: m["loss"] for m in read_metrics(wd) if m["split"] == "train"}  # noqa: E731
    assert loss(workdir)[40] == pytest.approx(loss(smoke_workdir)[40], abs=1e-5)


def test_changed_model_config_is_refused_on_resume(smoke_workdir, tmp_path):
    workdir = tmp_path / "copy"
    shutil.copytree(smoke_workdir, workdir)
    before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                        "--config.model.d_model=64", "--config.train.num_steps=60")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "model.d_model: 32 -> 64" in lines[-1]
    assert "Traceback" not in result.stderr
    after = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_train_step_compiles_once_per_bucket_shape():
    import jax

    from configs import smoke
    from data.batching import TrainBatcher
    from training.distributed import make_mesh, shard_batch
    from training.step import create_train_state, make_train_step

    cfg = smoke.get_config()
    rng = np.random.default_rng(0)
    src = [list(rng.integers(4, 50, rng.integers(2, 40))) + [3] for _ in range(300)]
    tgt = [list(rng.integers(4, 50, rng.integers(1, 40))) for _ in range(300)]
    batcher = TrainBatcher(src, tgt, cfg.train.batch_tokens, cfg.data.max_length,
                           bucket_step=cfg.data.bucket_step)
    mesh = make_mesh()
    graphdef, state = create_train_state(cfg, 50, 50, mesh)
    step = make_train_step(graphdef, cfg.train)
    iterator = batcher.iterate()
    for _ in range(2 * batcher.num_batches):  # two epochs: every shape seen twice
        _, _, batch = next(iterator)
        batch.pop("num_tokens")
        state, _ = step(state, shard_batch(batch, mesh))
    jax.block_until_ready(state)
    assert step._cache_size() == len(batcher.shapes())
    assert int(state["step"]) == 2 * batcher.num_batches

    # Packed batches (data/packing.py): one shape, one compilation, over two epochs.
    from data.packing import PackedBatcher

    packed = PackedBatcher(src, tgt, cfg.train.batch_tokens, 32)
    packed_step = make_train_step(graphdef, cfg.train)
    iterator = packed.iterate()
    for _ in range(packed.epoch_length(0) + packed.epoch_length(1)):
        _, _, batch = next(iterator)
        batch.pop("num_tokens")
        state, _ = packed_step(state, shard_batch(batch, mesh))
    jax.block_until_ready(state)
    assert packed_step._cache_size() == len(packed.shapes()) == 1


@pytest.mark.slow
def test_two_cpu_devices_make_the_same_update_as_one(tmp_path):
    """`train.cpu_devices=2` splits the host CPU into two JAX devices and shards each
    (packed) batch over them: the run ends where the one-device run ends, to float
    tolerance; a run started on one device resumes on two."""
    args = ["--config", "configs/smoke.py", "--config.attention_maps.enabled=False",
            "--config.eval.every_steps=0", "--config.data.pack_length=32"]
    one, two = tmp_path / "one", tmp_path / "two"
    for workdir, devices in ((one, 0), (two, 2)):
        result = run_script("train.py", *args, "--config.train.num_steps=6",
                            f"--config.train.cpu_devices={devices}", "--workdir", str(workdir))
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"{max(devices, 1)} device(s)" in result.stderr
    from evaluation.loading import load_params  # restores onto this process's one device

    one_params, two_params = (flat(load_params(w, "last").params) for w in (one, two))
    assert one_params.keys() == two_params.keys()
    for key, value in one_params.items():
        if "['key']['bias']" in key:
            # A key bias adds the same q.b to every score of a row: softmax cancels it, its
            # gradient is rounding noise, which Adam scales up to a step of the learning rate.
            continue
        np.testing.assert_allclose(two_params[key], value, rtol=0, atol=1e-5, err_msg=key)

    resumed = run_script("train.py", *args, "--config.train.num_steps=8",
                         "--config.train.cpu_devices=2", "--workdir", str(one))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "2 device(s), resuming from step 6" in resumed.stderr
    assert max(m["step"] for m in read_metrics(one)) == 8


@pytest.mark.slow
def test_beam_search_validation_runs_on_two_cpu_devices(tmp_path):
    """Validation decodes with beam search on two CPU devices (XLA's TopK decomposer
    once aborted compiling that program): the run ends and logs a validation BLEU."""
    result = run_script("train.py", "--config", "configs/smoke.py",
                        "--config.attention_maps.enabled=False", "--config.data.pack_length=32",
                        "--config.train.num_steps=2", "--config.eval.every_steps=2",
                        "--config.eval.beam_size=2", "--config.train.cpu_devices=2",
                        "--workdir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2 device(s)" in result.stderr
    valid = [m for m in read_metrics(tmp_path) if m["split"] == "valid"]
    assert [m["step"] for m in valid] == [2] and valid[0]["bleu"] is not None


def test_cpu_devices_once_jax_has_started_are_refused_in_one_line():
    """In a process whose JAX backend already runs, another CPU device count is a
    UserError naming the key (train.py sets it before JAX starts); 0 changes nothing."""
    import jax

    from common.errors import UserError
    from training.distributed import use_cpu_devices

    jax.devices()  # the backend starts
    use_cpu_devices(0)
    with pytest.raises(UserError, match=r"train.cpu_devices=7: JAX already runs with \d+ CPU"):
        use_cpu_devices(7)


def test_checkpoint_of_the_old_nnx_variable_layout_restores_into_plain_dicts(tmp_path):
    """Checkpoints saved while the train state held nnx Variables (before plain dicts) load
    into today's layout with the same arrays; a damaged one is still refused."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from common.errors import UserError
    from configs import smoke
    from training import checkpoint as ckpt
    from training.step import build_model, build_optimizer, create_train_state

    cfg = smoke.get_config()
    model = build_model(cfg, 50, 50)
    optimizer = build_optimizer(cfg.train)
    old_params = jax.tree.map(lambda x: x + 1.0, nnx.state(model, nnx.Param))
    old = {"step": jnp.array(7, jnp.int32), "params": old_params,
           "opt_state": optimizer.init(old_params), "nonfinite_step": jnp.array(-1, jnp.int32)}
    assert any(".value" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(old))
    manager = ckpt.make_manager(tmp_path / "checkpoints", keep=2)
    ckpt.save(manager, 7, old, {"epoch": 0})
    manager.wait_until_finished()

    _, today = create_train_state(cfg, 50, 50)
    assert isinstance(today["params"], dict)
    state, meta = ckpt.restore(manager, 7, ckpt.abstract_of(today))
    assert meta["epoch"] == 0 and int(state["step"]) == 7
    assert jax.tree.structure(state) == jax.tree.structure(today)
    expected = flat(old_params.to_pure_dict())
    for key, value in flat(state["params"]).items():
        np.testing.assert_array_equal(value, expected[key])

    # A model of another shape fits neither layout: the error names the step.
    _, other = create_train_state(cfg, 60, 60)  # another vocabulary
    with pytest.raises(UserError, match="checkpoint step 7"):
        ckpt.restore(manager, 7, ckpt.abstract_of(other))
