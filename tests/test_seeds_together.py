"""`train.py --seeds N --together` (training/together.py): the seeds' steps as one vmapped
program end where each seed trained alone ends, and a killed run resumes to the same place.

Attention key biases are left out of the parameter comparisons: a key bias adds the same
q.b to every key of a query, which softmax cancels, so its gradient is zero up to float
rounding, and Adam scales that rounding noise up to steps the size of the learning rate.
Those parameters are noise in a seed trained alone too (two programs summing in another
order move them differently); every other parameter is compared at atol 1e-5.
"""

import json
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, run_script

from configs import smoke
from training import together as together_module
from training.checkpoint import abstract_of
from training.loop import StopRequest
from training.step import create_train_state, make_eval_step, make_train_step
from training.together import SeedGroup, _stack, batch_groups

STEPS = 30
TRAIN = ("--config", "configs/smoke.py", f"--config.train.num_steps={STEPS}",
         "--config.eval.every_steps=30", "--config.checkpoint.every_steps=5",
         "--config.eval.max_sentences=8")


def comparable(tree) -> dict[str, np.ndarray]:
    """{path: array} of a train state's leaves but the attention key biases (module
    docstring)."""
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
            if not ("['key']" in jax.tree_util.keystr(path)
                    and jax.tree_util.keystr(path).endswith("['bias']"))}


def assert_states_close(got, want, atol=1e-5) -> None:
    got, want = comparable(got), comparable(want)
    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=0, err_msg=name)


def _batch(rng: np.random.Generator, rows: int, length: int, vocab: int) -> dict:
    """A padded batch (data/batching.py layout): [rows, length] int32, some pad."""
    lengths = rng.integers(3, length + 1, rows)
    src = np.zeros((rows, length), np.int32)
    tgt = np.zeros((rows, length + 1), np.int32)
    for r, n in enumerate(lengths):
        src[r, :n] = rng.integers(4, vocab, n)
        tgt[r, 0], tgt[r, 1:n] = 2, rng.integers(4, vocab, n - 1)
        tgt[r, n] = 3
    return {"src": jnp.asarray(src), "tgt_in": jnp.asarray(tgt[:, :-1]),
            "tgt_out": jnp.asarray(tgt[:, 1:])}


@pytest.mark.slow  # compiles every step shape twice, grouped and alone: 30-40 s cold
def test_program_of_seeds_equals_each_seed_alone(monkeypatch):
    """Three steps of two seeds through a SeedGroup (their batches of 8 and 6 rows, then of
    different lengths) against each seed's own jitted step: same parameters, optimizer
    state, step counters and metrics; one call per step while the lengths agree, and
    each call steps both seeds, keeping the group's new states only. The seeds' states
    are stacked once, at the first step, and stay stacked: each seed holds a view."""
    stacked = []
    monkeypatch.setattr(together_module, "_stack",
                        lambda states: stacked.append(1) or _stack(states))
    configs = []
    for seed in (0, 1):
        cfg = smoke.get_config()
        cfg.train.seed = seed
        configs.append(cfg)
    vocab = 50
    graphdef, _ = create_train_state(configs[0], vocab, vocab)
    states = [create_train_state(cfg, vocab, vocab)[1] for cfg in configs]
    alone = [jax.tree.map(jnp.copy, s) for s in states]
    rng = np.random.default_rng(0)
    steps = [[_batch(rng, 8, 16, vocab), _batch(rng, 6, 16, vocab)],  # rows differ: padded
             [_batch(rng, 8, 16, vocab), _batch(rng, 8, 16, vocab)],
             [_batch(rng, 8, 16, vocab), _batch(rng, 4, 32, vocab)]]  # lengths differ: 2 groups
    assert [batch_groups(dict(enumerate(b))) for b in steps] == [[[0, 1]], [[0, 1]], [[0], [1]]]
    assert batch_groups(dict(enumerate(steps[0])), full_shape=True) == [[0], [1]]

    stop = StopRequest()
    try:
        group = SeedGroup([0, 1], stop)
        slots = [group.slot(seed).make_step(graphdef, cfg.train) for seed, cfg in
                 enumerate(configs)]
        together, first_views = list(states), None
        for batches in steps:
            results = [None, None]

            def run(seed, batches=batches, results=results):
                results[seed] = slots[seed](together[seed], batches[seed])

            threads = [threading.Thread(target=run, args=(seed,)) for seed in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            first_views = first_views or [result[0] for result in results]
            for seed in (0, 1):
                together[seed], got = results[seed]
                alone[seed], want = make_train_step(graphdef, configs[seed].train)(
                    alone[seed], batches[seed])
                for key in want:
                    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
        assert group.programs_run == 4
        # One compiled program per set of input shapes, not per group of seeds: step 3's
        # two calls each step both seeds (the other on an all-pad batch), the first with
        # step 2's shapes.
        assert group._program._cache_size() == 3
        assert len(stacked) == 1  # the later steps took the views back as they were
        with pytest.raises(RuntimeError, match="replaced"):  # donated to a later step
            first_views[0].materialize()
    finally:
        stop.restore()
    # Each seed holds a view of the stacked state, its slice cut out when read.
    together = [view.materialize() for view in together]
    for seed in (0, 1):
        assert int(together[seed]["step"]) == 3
        assert_states_close(together[seed], alone[seed])
    # The seeds did train apart: different initialisations and dropout.
    assert not np.allclose(comparable(together[0])["['params']['decoder_norm']['scale']"],
                           comparable(together[1])["['params']['decoder_norm']['scale']"])


def test_a_seed_that_leaves_frees_the_others():
    """A seed that ends (here: before its first step) never makes the others wait."""
    cfg = smoke.get_config()
    graphdef, state = create_train_state(cfg, 50, 50)
    stop = StopRequest()
    try:
        group = SeedGroup([0, 1], stop)
        step = group.slot(0).make_step(graphdef, cfg.train)
        group.leave(1)
        new, metrics = step(state, _batch(np.random.default_rng(1), 8, 16, 50))
        assert int(new.materialize()["step"]) == 1 and float(metrics["tokens"]) > 0
    finally:
        stop.restore()


@pytest.mark.parametrize("main_waits_in", ["wait_arrived", "join"])
def test_a_signal_another_thread_receives_still_stops_every_seed(main_waits_in):
    """The kernel may hand SIGINT to any thread that does not block it; Python runs the
    handler in the main thread alone, which, asleep in an untimed wait, would not wake
    until a seed ended: the seeds would train on. Here seed 0 sends SIGINT to its own
    thread while the main thread waits for seed 1's set-up, or for the seeds' end."""

    def run_seed(seed, slot):
        if seed == 1 and main_waits_in == "join":
            slot.group.leave(1)  # "arrived": the main thread goes on to join()
        if seed == 0:
            slot.group.leave(0)  # the main thread starts seed 1 and waits on
            time.sleep(0.5)  # surely asleep in its wait by now
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # this thread alone
        deadline = time.monotonic() + 5
        while not slot.stop.signum and time.monotonic() < deadline:
            time.sleep(0.01)
        return 128 + slot.stop.signum if slot.stop.signum else 0

    before = signal.getsignal(signal.SIGINT)
    start = time.monotonic()
    assert together_module.train_together(run_seed, [0, 1]) == 130
    assert time.monotonic() - start < 3  # not the seeds' own 5-s give-up
    assert signal.getsignal(signal.SIGINT) is before


def test_the_seeds_share_one_eval_program():
    """Validation of N seeds compiles each batch shape once, not N times: every slot gets
    the group's one jitted eval step, which gives each seed's own sums."""
    cfg = smoke.get_config()
    stop = StopRequest()
    try:
        group = SeedGroup([0, 1], stop)
        graphdef, state0 = create_train_state(cfg, 50, 50)
        cfg.train.seed = 1
        _, state1 = create_train_state(cfg, 50, 50)
        shared = [group.slot(seed).make_eval_step(graphdef, 0.1) for seed in (0, 1)]
        assert shared[0] is shared[1]
        batch = _batch(np.random.default_rng(2), 8, 16, 50)
        alone = make_eval_step(graphdef, 0.1)
        for state in (state0, state1):
            got, want = shared[0](state["params"], batch), alone(state["params"], batch)
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
        assert shared[0]._cache_size() == 1
        assert float(shared[0](state0["params"], batch)["loss_sum"]) != float(
            shared[0](state1["params"], batch)["loss_sum"])
    finally:
        stop.restore()


def saved_steps(run) -> list[int]:
    folder = run / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) \
        if folder.is_dir() else []


def restore(run, step: int, like: dict | None = None) -> tuple[dict, dict]:
    """(state, meta) of checkpoint `step` of `run`; with `like`, into the shapes and
    shardings of that state (a run saved on two devices restored onto one)."""
    target = None if like is None else abstract_of(like)
    state = ocp.StandardCheckpointer().restore((run / "checkpoints" / str(step) / "state")
                                               .absolute(), target)
    meta = json.loads((run / "checkpoints" / str(step) / "meta" / "metadata").read_text())
    return state, meta


def train_losses(run) -> list[tuple[int, float]]:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(e["step"], e["loss"]) for e in events if e["split"] == "train"]


@pytest.mark.slow
def test_together_ends_where_each_seed_alone_ends_and_resumes_after_a_kill(tmp_path):
    """2 seeds x 30 steps: `--seeds 2` one after another, then `--seeds 2 --together`
    SIGKILLed once both seeds saved a checkpoint and run again with the same command; each
    seed's checkpoints, parameters, optimizer state, data position and train losses are
    those of the seed trained alone."""
    apart, together = tmp_path / "apart", tmp_path / "together"
    result = run_script("train.py", *TRAIN, "--workdir", str(apart), "--seeds", "2")
    assert result.returncode == 0, result.stderr[-3000:]

    args = [sys.executable, str(REPO / "train.py"), *TRAIN, "--workdir", str(together),
            "--seeds", "2", "--together"]
    log = open(tmp_path / "killed.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 300
    seeds = [together / "seed0", together / "seed1"]
    while not all(saved_steps(s) for s in seeds) and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    log.close()
    killed_at = [saved_steps(s) for s in seeds]
    assert all(steps and max(steps) < STEPS for steps in killed_at), killed_at

    result = run_script(*args[1:])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step" in result.stderr
    # The group's bar names its seeds; no bar carries a lone run's label.
    assert "train (seeds 0, 1 together):" in result.stderr
    assert "\rtrain:" not in result.stderr and not result.stderr.startswith("train:")
    for seed in (0, 1):
        run, alone = together / f"seed{seed}", apart / f"seed{seed}"
        assert saved_steps(run) == saved_steps(alone) == [25, 30]
        state, meta = restore(run, STEPS)
        want_state, want_meta = restore(alone, STEPS)
        assert_states_close(state, want_state)
        assert int(state["step"]) == STEPS
        for key in ("epoch", "batch_index", "best_step"):
            assert meta[key] == want_meta[key], key
        got, want = train_losses(run), train_losses(alone)
        assert [s for s, _ in got] == [s for s, _ in want] == [10, 20, 30]
        # A log's loss is the mean since the previous log or the resume: compare the logs
        # whose 10 steps all ran after the restored step.
        restored = max(killed_at[seed])
        full = [k for k, (s, _) in enumerate(want) if s - 10 >= restored]
        assert full, (restored, want)
        np.testing.assert_allclose([got[k][1] for k in full], [want[k][1] for k in full],
                                   rtol=1e-5)
        assert list((run / "attention").glob("*.npz"))
        assert json.loads((run / "config.json").read_text())["train"]["seed"] == seed


@pytest.mark.slow
def test_together_on_two_cpu_devices_ends_where_each_seed_alone_on_one_ends(tmp_path):
    """`--seeds 2 --together` with `train.cpu_devices=2` (the CPU recipe's setting): each
    seed's batches are split over the two devices inside the vmapped program, and each seed
    still ends where it ends trained alone on one device."""
    args = ("--config", "configs/smoke.py", "--config.train.num_steps=6",
            "--config.eval.every_steps=0", "--config.checkpoint.every_steps=6",
            "--config.train.log_every_steps=2", "--config.attention_maps.enabled=False",
            "--config.data.pack_length=32", "--seeds", "2")
    apart, together = tmp_path / "apart", tmp_path / "together"
    result = run_script("train.py", *args, "--workdir", str(apart))
    assert result.returncode == 0, result.stderr[-3000:]
    result = run_script("train.py", *args, "--together", "--config.train.cpu_devices=2",
                        "--workdir", str(together))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 device(s)" in result.stderr
    for seed in (0, 1):
        want_state, want_meta = restore(apart / f"seed{seed}", 6)
        state, meta = restore(together / f"seed{seed}", 6, like=want_state)
        assert_states_close(state, want_state)
        assert meta["batch_index"] == want_meta["batch_index"]
        got, want = train_losses(together / f"seed{seed}"), train_losses(apart / f"seed{seed}")
        assert [s for s, _ in got] == [s for s, _ in want] == [2, 4, 6]
        np.testing.assert_allclose([loss for _, loss in got], [loss for _, loss in want],
                                   rtol=1e-5)
