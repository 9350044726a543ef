"""Smoke checks of bench/: the scripts run and write their keys, and the
synthetic comparison batches follow their rules. No timing is asserted anywhere.

That the train step does not recompile after warm-up is asserted by counting jit cache
entries in tests/test_train.py::test_train_step_compiles_once_per_bucket_shape (and
reported by the benchmark as `compilations_after_warmup`).
"""

import json
import sys

import numpy as np
import pytest
from conftest import REPO, run_script

sys.path.insert(0, str(REPO))

from bench.flops import FlopCounter  # noqa: E402
from bench.synthetic import SYNTHETIC_MAX, SYNTHETIC_MIN, synthetic_batches  # noqa: E402

TRAIN_KEYS = {
    "tokens_per_sec", "src_tgt_tokens_per_sec", "step_time_s", "mfu", "mfu_padded",
    "peak_gflops", "peak_gflops_f32", "model_gflops_per_sec", "compile_s",
    "compile_s_jax_events", "compilations_after_warmup", "distinct_shapes",
    "padding_fraction", "params", "matmul_params", "flop_formula", "size", "synthetic",
    "device", "jax_version", "peak_rss_mb",
}


@pytest.mark.long
def test_train_throughput_smoke(tmp_path):
    out = tmp_path / "train.json"
    # A 1+1-layer d_model 32 model on 512-token batches: cheap.
    result = run_script(
        "bench/train_throughput.py", "--size", "tiny", "--synthetic", "--steps", "2",
        "--warmup", "1", "--batch_tokens", "512", "--vocab_size", "500", "--layers", "1",
        "--d_model", "32", "--d_ff", "64", "--num_heads", "2", "--peak_sizes", "64",
        "--peak_repeats", "1", "--cpu_devices", "2", "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data.keys() >= TRAIN_KEYS
    assert data["size"] == "tiny" and data["synthetic"] is True and data["steps"] == 2
    assert data["device_count"] == 2  # each batch split over two CPU devices
    assert data["compilations_after_warmup"] == 0
    assert data["nonfinite_step"] == -1
    assert 0.0 < data["padding_fraction"] < 1.0
    assert data["tokens_per_sec"] > 0 and data["mfu"] > 0
    assert data["params"] > data["matmul_params"] > 0
    assert "MFU" in result.stdout


def test_synthetic_batches_follow_the_rules():
    budget, vocab = 1024, 300
    batches = synthetic_batches(20, budget, vocab, seed=0)
    assert len(batches) == 20
    for batch in batches:
        src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
        src_len = np.count_nonzero(src, axis=1)
        tgt_len = np.count_nonzero(tgt_out, axis=1)
        assert src_len.min() >= SYNTHETIC_MIN and src_len.max() <= SYNTHETIC_MAX
        assert tgt_len.min() >= SYNTHETIC_MIN and tgt_len.max() <= SYNTHETIC_MAX
        # Each side padded to its own batch maximum; n x max(longest) within the budget.
        assert src.shape[1] == src_len.max() and tgt_out.shape[1] == tgt_len.max()
        assert len(src) * max(src.shape[1], tgt_out.shape[1]) <= budget
        # Tokens are contiguous from position 0, ids uniform in [4, vocab).
        for array, lengths in ((src, src_len), (tgt_out, tgt_len)):
            positions = np.arange(array.shape[1])[None, :]
            assert np.array_equal(array != 0, positions < lengths[:, None])
            assert array[array != 0].min() >= 4 and array.max() < vocab
        # Decoder input: bos, then the target shifted right by one.
        assert (tgt_in[:, 0] == 2).all()
        assert np.count_nonzero(tgt_in, axis=1).tolist() == tgt_len.tolist()
        for row in range(len(src)):
            n = tgt_len[row]
            assert np.array_equal(tgt_in[row, 1:n], tgt_out[row, :n - 1])
    # Greedy filling: adding the next batch's first pair would have broken the budget.
    for batch, following in zip(batches, batches[1:], strict=False):
        longest = max(batch["src"].shape[1], batch["tgt_out"].shape[1],
                      np.count_nonzero(following["src"][0]),
                      np.count_nonzero(following["tgt_out"][0]))
        assert (len(batch["src"]) + 1) * longest > budget
    # Fixed seed: reproducible; another seed differs.
    again = synthetic_batches(20, budget, vocab, seed=0)
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(batches, again, strict=True)
               for k in ("src", "tgt_in", "tgt_out"))
    other = synthetic_batches(1, budget, vocab, seed=1)[0]
    assert other["src"].shape != batches[0]["src"].shape or not np.array_equal(
        other["src"], batches[0]["src"])


def test_synthetic_batches_pad_rows_for_data_parallelism():
    for batch in synthetic_batches(5, 512, 100, batch_multiple=4):
        assert len(batch["src"]) % 4 == 0
        assert np.count_nonzero(batch["src"].any(axis=1)) > len(batch["src"]) - 4


def test_flop_formula_counts_attention_and_dense_terms():
    counter = FlopCounter(src_params=10, tgt_params=20, d_model=4, encoder_layers=2,
                          decoder_layers=3)
    # 6 * (10 * 5 + 20 * 3) + 12 * 4 * (2 * 25 + 3 * (9 + 15))
    assert counter.train_flops(np.array([5]), np.array([3])) == 6 * 110 + 48 * (50 + 72)
    batch = {"src": np.array([[5, 6, 7, 0], [5, 0, 0, 0]]), "tgt_out": np.array([[4, 3], [4, 0]])}
    real, padded = counter.batch_flops(batch)
    assert real == counter.train_flops(np.array([3, 1]), np.array([2, 1]))
    assert padded == counter.train_flops(np.array([4, 4]), np.array([2, 2]))


@pytest.mark.long
def test_validation_ahead_smoke(tmp_path):
    out = tmp_path / "ahead.json"
    result = run_script("bench/validation_ahead.py", "--config", "configs/smoke.py",
                        "--steps", "6", "--eval_at", "3", "--override", "eval.max_sentences=4",
                        "--json", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [run["precompile"] for run in data["runs"]] == [False, True]
    for arm in ("off", "on"):
        assert data["arms"][arm]["first_validation_hook_s"] > 0 and data["arms"][arm]["wall_s"] > 0
        assert data["arms"][arm]["compile_seconds"] > 0
    assert "first_validation_hook_s" in result.stdout


@pytest.mark.long
def test_compile_profile_smoke(tmp_path):
    out = tmp_path / "compile.json"
    result = run_script(
        "bench/compile_profile.py", "--size", "tiny", "--layers", "1", "--d_model", "32",
        "--d_ff", "64", "--num_heads", "2", "--vocab_size", "300",
        "--cache_dir", str(tmp_path / "cache"), "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["layers"] == 1 and data["backend"] == "cpu"
    for part in ("trace+lower", "step", "forward", "forward+backward", "optimizer"):
        assert data[part]["seconds"] > 0, part
    counts = {part: data[part]["hlo_instructions"] for part in ("step", "forward", "forward+backward")}
    # The gradient program contains the forward pass; the full step contains both.
    assert counts["step"] > counts["forward+backward"] > counts["forward"] > 0
    assert "forward+backward" in result.stdout


@pytest.mark.long
def test_step_profile_smoke(tmp_path):
    out, hlo = tmp_path / "profile.json", tmp_path / "step.txt.gz"
    result = run_script(
        "bench/step_profile.py", "--size", "tiny", "--layers", "1", "--d_model", "32",
        "--d_ff", "64", "--num_heads", "2", "--vocab_size", "300", "--batch_tokens", "256",
        "--steps", "2", "--parts", "--hlo", str(hlo), "--cache_dir", str(tmp_path / "cache"),
        "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["nnx", "pure", "flat"]
    for row in rows:
        assert row["step_ms"] > 0 and row["identity_ms"] > 0 and row["compile_s"] > 0
        assert row["embedding_grad"] == "auto" and 0 <= row["padding_fraction"] < 1
    assert all(rows[0][k] > 0 for k in ("forward_ms", "forward_backward_ms", "optimizer_ms"))
    import gzip

    with gzip.open(hlo, "rt") as file:
        assert "ENTRY" in file.read()


def test_step_profile_trace_summary_counts_device_kernels(tmp_path):
    import gzip

    from bench.step_profile import trace_summary

    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 500, "name": "python"},
        # two steps: a GEMM overlapping a fusion on another stream, then the fusion again
        {"ph": "X", "pid": 2, "tid": 7, "ts": 100, "dur": 40, "name": "gemm"},
        {"ph": "X", "pid": 2, "tid": 8, "ts": 120, "dur": 40, "name": "fusion"},
        {"ph": "X", "pid": 2, "tid": 7, "ts": 200, "dur": 20, "name": "fusion"},
    ]
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as file:
        json.dump({"traceEvents": events}, file)
    summary = trace_summary(tmp_path, steps=2)
    assert summary["kernels_per_step"] == 1.5
    assert summary["kernel_ms_per_step"] == 0.05  # (40 + 40 + 20) us / 2 steps
    assert summary["device_busy_ms_per_step"] == 0.04  # union: 100-160 and 200-220
    assert summary["device_span_ms_per_step"] == 0.06  # 100 to 220
    assert [k["name"] for k in summary["top_kernels"]] == ["fusion", "gemm"]
    assert summary["top_kernels"][0]["calls_per_step"] == 1.0


@pytest.mark.long
def test_previews_smoke(tmp_path):
    out = tmp_path / "previews.json"
    result = run_script("bench/previews.py", "--examples", "1", "--source", "5", "--target",
                        "4", "--repeat", "1", "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["figures"] == 2  # the all-layer mean and the last layer of one example
    for key in ("savefig_s", "inline_s", "thread_held_s", "thread_drain_s", "process_held_s",
                "process_drain_s", "loop_alone_ms", "loop_beside_thread_ms",
                "loop_beside_process_ms"):
        assert data[key] > 0 and len(data["runs"][key]) == 1, key


@pytest.mark.long
def test_save_stall_smoke(tmp_path):
    out = tmp_path / "saves.json"
    result = run_script("bench/save_stall.py", "--config", "configs/smoke.py", "--saves", "2",
                        "--apart_s", "0", "--profile", "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert list(data["variants"]) == ["device_arrays", "host_copy"]
    assert data["arrays"] > 0 and data["state_mb"] > 0
    for name, variant in data["variants"].items():
        assert variant["saved_steps"] == [1, 2, 3], name  # the spaced saves, the one waited for
        assert variant["write_s"] > 0, name
        for part in ("finite_check_s", "save_s", "held_s", "checksum_s"):
            assert len(variant["runs"][part]) == 2 and min(variant["runs"][part]) > 0, part
        assert any("checkpoint.py" in row["function"] and "(save)" in row["function"]
                   for row in variant["profile_top"]), name
    assert data["flat_optimizer"] is False

    # train.flat_optimizer's state: the parameters' arrays, Adam's two vectors, counters.
    result = run_script("bench/save_stall.py", "--config", "configs/smoke.py", "--saves", "1",
                        "--apart_s", "0", "--variants", "host_copy", "--flat_optimizer",
                        "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    flat = json.loads(out.read_text())
    assert flat["flat_optimizer"] is True and flat["state_mb"] == data["state_mb"]
    assert flat["arrays"] == (data["arrays"] - 4) // 3 + 6


def test_save_stall_refuses_a_config_that_is_not_there(tmp_path):
    result = run_script("bench/save_stall.py", "--config", str(tmp_path / "no.py"), timeout=60)
    assert result.returncode == 2 and "no such file" in result.stderr
    result = run_script("bench/save_stall.py", "--variants", "disk", timeout=60)
    assert result.returncode == 2 and "--variants" in result.stderr


@pytest.mark.long
def test_startup_smoke(tmp_path):
    out = tmp_path / "startup.json"
    result = run_script("bench/startup.py", "--repeats", "1", "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert list(data["commands"]) == ["python", "ml_dtypes", "jax", "train_bad_flag"]
    for name, row in data["commands"].items():
        assert len(row["all_s"]) == 1 and row["median_s"] == row["all_s"][0] > 0, name
    assert data["versions"]["ml_dtypes"] and data["versions"]["jax"]
