"""The attention map file format: save/load, format checks, invariants, builder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attention.mapfile import (
    ARRAY_NAMES,
    AttentionMaps,
    MapFormatError,
    concatenate_maps,
    load_maps,
    maps_from_arrays,
    save_maps,
    validate_maps,
)

SOURCE_PIECES = ["▁Ein", "▁Mann", "▁spiel", "t", "▁Fuß", "ball", "▁im", "▁Park", "."]
TARGET_PIECES = ["▁A", "▁man", "▁play", "s", "▁soccer", "▁in", "▁the", "▁park", "."]


def masked_softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax over the last axis restricted to `mask`; fully masked rows are all 0."""
    logits = np.where(mask, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True)
    e = np.where(mask, np.exp(logits - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0).astype(np.float32)


def make_maps(src_lens=(5, 3, 4), tgt_lens=(4, 6, 2), l_enc=2, l_dec=3, heads=2, seed=0,
              decode="teacher_forced", step=1200) -> AttentionMaps:
    """Valid synthetic maps: random logits -> masked softmax with padding and causality.

    Source i = the first src_lens[i] - 1 pieces + "</s>"; target = "<s>" + pieces.
    """
    rng = np.random.default_rng(seed)
    n, s, t = len(src_lens), max(src_lens), max(tgt_lens)
    src_valid = np.arange(s)[None] < np.array(src_lens)[:, None]  # [N, S]
    tgt_valid = np.arange(t)[None] < np.array(tgt_lens)[:, None]  # [N, T]
    causal = np.tril(np.ones((t, t), dtype=bool))

    def kind(layers, q_valid, k_valid, extra=True):
        mask = q_valid[:, None, None, :, None] & k_valid[:, None, None, None, :] & extra
        logits = 3.0 * rng.normal(size=(n, layers, heads, q_valid.shape[1], k_valid.shape[1]))
        return masked_softmax(logits, mask)

    src_tok = np.full((n, s), "", dtype="<U8")
    tgt_tok = np.full((n, t), "", dtype="<U8")
    for i in range(n):
        src_tok[i, : src_lens[i]] = SOURCE_PIECES[: src_lens[i] - 1] + ["</s>"]
        tgt_tok[i, : tgt_lens[i]] = ["<s>"] + TARGET_PIECES[: tgt_lens[i] - 1]
    return AttentionMaps(
        encoder_self=kind(l_enc, src_valid, src_valid),
        decoder_self=kind(l_dec, tgt_valid, tgt_valid, causal),
        cross=kind(l_dec, tgt_valid, src_valid),
        source_tokens=src_tok,
        target_tokens=tgt_tok,
        source_lengths=np.array(src_lens, dtype=np.int32),
        target_lengths=np.array(tgt_lens, dtype=np.int32),
        step=step,
        decode=decode,
    )


def check_invariants(maps: AttentionMaps) -> None:
    """The §4.5 invariants, written independently of validate_maps."""
    for i in range(maps.num_examples):
        s, t = int(maps.source_lengths[i]), int(maps.target_lengths[i])
        assert all(maps.source_tokens[i, :s] != "") and all(maps.source_tokens[i, s:] == "")
        assert all(maps.target_tokens[i, :t] != "") and all(maps.target_tokens[i, t:] == "")
        for kind, q, k in (("encoder_self", s, s), ("decoder_self", t, t), ("cross", t, s)):
            w = maps.weights(kind)[i]  # [L, H, Q, K]
            np.testing.assert_allclose(w[:, :, :q, :k].sum(-1), 1.0, atol=1e-5)
            assert np.all(w[:, :, q:, :] == 0) and np.all(w[:, :, :, k:] == 0)
    assert np.all(np.triu(maps.decoder_self, k=1) == 0)


def test_synthetic_maps_satisfy_invariants():
    maps = make_maps()
    check_invariants(maps)
    validate_maps(maps)


def test_round_trip_loads_without_pickle(tmp_path):
    maps = make_maps()
    path = save_maps(tmp_path / "maps.npz", maps)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps.npz"]  # no temp file left
    with np.load(path, allow_pickle=False) as z:
        assert sorted(z.files) == sorted(ARRAY_NAMES)
        assert z["cross"].dtype == np.float32 and z["cross"].shape == (3, 3, 2, 6, 5)
        assert z["encoder_self"].shape == (3, 2, 2, 5, 5)
        assert z["decoder_self"].shape == (3, 3, 2, 6, 6)
        assert z["source_tokens"].dtype.kind == "U" and z["source_tokens"].shape == (3, 5)
        assert z["target_lengths"].dtype == np.int32
        assert z["step"].shape == () and int(z["step"]) == 1200
        assert str(z["decode"]) == "teacher_forced"
    loaded = load_maps(path)
    for field in dataclasses.fields(AttentionMaps):
        np.testing.assert_array_equal(getattr(loaded, field.name), getattr(maps, field.name))
    assert loaded.source_tokens[0, 4] == "</s>" and loaded.target_tokens[0, 0] == "<s>"
    assert loaded.source_tokens[1, 3] == ""
    check_invariants(loaded)


def _arrays(maps: AttentionMaps) -> dict:
    d = {f.name: getattr(maps, f.name) for f in dataclasses.fields(maps)
         if getattr(maps, f.name) is not None}  # absent contributions are not written
    d["step"], d["decode"] = np.asarray(d["step"]), np.asarray(d["decode"])
    return d


BAD_FILES = {
    "missing": (lambda d: d.pop("cross"), "missing arrays: cross"),
    "rank": (lambda d: d.update(cross=d["cross"][:, 0]), "'cross' must be a rank-5"),
    "dtype": (lambda d: d.update(cross=d["cross"].astype(np.float64)), "must be float32"),
    "heads": (lambda d: d.update(cross=d["cross"][:, :, :1]), "inconsistent shapes"),
    "tokens": (lambda d: d.update(target_tokens=d["target_tokens"][:, :3]), "inconsistent"),
    "length0": (lambda d: d["source_lengths"].__setitem__(0, 0), "out of range"),
    "length_big": (lambda d: d["target_lengths"].__setitem__(1, 7), "out of range"),
    "decode": (lambda d: d.update(decode=np.asarray("sampling")), "'decode' must be one of"),
    "step": (lambda d: d.update(step=np.asarray([1, 2])), "'step' must be a 0-d integer"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_load_rejects_files_not_in_the_format(tmp_path, case):
    mutate, message = BAD_FILES[case]
    arrays = _arrays(make_maps())
    mutate(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(MapFormatError, match=message) as err:
        load_maps(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_load_rejects_object_arrays_and_non_npz(tmp_path):
    arrays = _arrays(make_maps())
    arrays["source_tokens"] = arrays["source_tokens"].astype(object)
    np.savez(tmp_path / "object.npz", **arrays)  # savez pickles object arrays
    with pytest.raises(MapFormatError, match="object.npz: not a readable .npz"):
        load_maps(tmp_path / "object.npz")
    (tmp_path / "text.npz").write_text("not an archive\n")
    with pytest.raises(MapFormatError, match="text.npz"):
        load_maps(tmp_path / "text.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(MapFormatError, match="not an .npz map file"):
        load_maps(tmp_path / "single.npy")
    with pytest.raises(FileNotFoundError):
        load_maps(tmp_path / "absent.npz")


def test_save_refuses_malformed_maps(tmp_path):
    maps = make_maps()
    maps.cross = maps.cross[..., :2]
    with pytest.raises(MapFormatError, match="inconsistent shapes"):
        save_maps(tmp_path / "x.npz", maps)
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = save_maps(tmp_path / "m.npz", make_maps())
    before = path.read_bytes()

    def crash(f, **arrays):
        f.write(b"PK half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", crash)
    with pytest.raises(OSError, match="disk full"):
        save_maps(path, make_maps(seed=1))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]  # the temp file is gone


def test_map_format_error_is_a_user_error():
    from common.errors import UserError

    assert issubclass(MapFormatError, UserError) and issubclass(MapFormatError, ValueError)


def _breach(name: str) -> AttentionMaps:
    maps = make_maps()
    if name == "row_sum":
        maps.cross[1, 2, 1, 3, :] *= 0.9
    elif name == "padded_key":
        maps.cross[1, 0, 0, 0, 4] = 0.01  # example 1 has 3 source tokens
    elif name == "padded_query":
        maps.encoder_self[1, 1, 1, 3, 0] = 0.2  # query 3 of a 3-token source
    elif name == "non_causal":
        row = maps.decoder_self[0, 1, 0, 1]  # query 1 of a 4-token target
        row[2], row[0] = row[0], 0.0  # same sum, weight moved to a future key
    elif name == "negative":
        maps.encoder_self[0, 0, 0, 0, :2] += [0.5, -0.5]
    elif name == "token":
        maps.target_tokens[2, 3] = "▁x"  # beyond the length 2
    return maps


@pytest.mark.parametrize("name, message", [
    ("row_sum", r"cross\[example 1, layer 2, head 1\]: query row 3 sums to 0.9"),
    ("padded_key", r"padded key \(query 0, key 4\)"),
    ("padded_query", r"encoder_self\[example 1, layer 1, head 1\]: padded query row"),
    ("non_causal", r"not causal: query 1 attends to future key 2"),
    ("negative", "finite and non-negative"),
    ("token", r"target_tokens\[2, 3\]"),
])
def test_validate_catches_each_breach(name, message):
    with pytest.raises(MapFormatError, match=message):
        validate_maps(_breach(name))


def test_maps_from_arrays_transposes_cuts_and_zeroes():
    rng = np.random.default_rng(1)
    src = [["▁Ein", "▁Mann", "</s>"], ["▁Fuß", "ball", "▁im", "▁Park", "</s>"]]
    tgt = [["<s>", "▁A", "▁man", "▁play"], ["<s>", "▁soccer"]]
    s_in, t_in, l_enc, l_dec, h = 7, 6, 2, 3, 4  # batch padding beyond the longest example
    weights = {  # garbage everywhere, padding included, like an unmasked model would give
        "encoder_self": rng.random((l_enc, 2, h, s_in, s_in), dtype=np.float32),
        "decoder_self": rng.random((l_dec, 2, h, t_in, t_in), dtype=np.float32),
        "cross": rng.random((l_dec, 2, h, t_in, s_in), dtype=np.float32),
    }
    maps = maps_from_arrays(weights, src, tgt, step=7, decode="beam")
    assert maps.cross.shape == (2, l_dec, h, 4, 5)
    assert maps.encoder_self.shape == (2, l_enc, h, 5, 5)
    assert maps.decoder_self.shape == (2, l_dec, h, 4, 4)
    np.testing.assert_array_equal(maps.source_lengths, [3, 5])
    np.testing.assert_array_equal(maps.target_lengths, [4, 2])
    assert maps.source_tokens.dtype.kind == "U" and maps.source_tokens.tolist() == [
        ["▁Ein", "▁Mann", "</s>", "", ""], ["▁Fuß", "ball", "▁im", "▁Park", "</s>"]]
    assert maps.target_tokens.tolist() == [["<s>", "▁A", "▁man", "▁play"], ["<s>", "▁soccer", "", ""]]
    # Valid cells are copied from [L, B, ...] to [B, L, ...]; everything else is 0.
    np.testing.assert_array_equal(maps.cross[0, 2, 3, :4, :3], weights["cross"][2, 0, 3, :4, :3])
    np.testing.assert_array_equal(maps.cross[1, 1, 0, :2, :5], weights["cross"][1, 1, 0, :2, :5])
    assert np.all(maps.cross[0, :, :, :, 3:] == 0) and np.all(maps.cross[1, :, :, 2:] == 0)
    np.testing.assert_array_equal(maps.encoder_self[0, 1, 2, :3, :3],
                                  weights["encoder_self"][1, 0, 2, :3, :3])
    assert np.all(maps.encoder_self[0, :, :, 3:] == 0)
    assert maps.step == 7 and maps.decode == "beam"


def test_maps_from_model_like_weights_are_valid(tmp_path):
    """Masked-softmax weights as the model computes them give a valid file after the builder."""
    ref = make_maps(src_lens=(4, 2), tgt_lens=(3, 5))
    # The model returns [L, B, ...] with a batch-padded length and uniform padded query rows.
    def model_view(w, pad_q, pad_k):
        w = np.pad(np.transpose(w, (1, 0, 2, 3, 4)), [(0, 0)] * 3 + [(0, pad_q), (0, pad_k)])
        w[..., w.shape[3] - pad_q:, :] = 0.25
        return w
    weights = {"encoder_self": model_view(ref.encoder_self, 2, 2),
               "decoder_self": model_view(ref.decoder_self, 1, 1),
               "cross": model_view(ref.cross, 1, 2)}
    src = [ref.key_tokens(i, "cross") for i in range(2)]
    tgt = [ref.query_tokens(i, "cross") for i in range(2)]
    maps = maps_from_arrays(weights, src, tgt, step=ref.step, decode=ref.decode)
    validate_maps(maps)
    check_invariants(maps)
    for kind in ("encoder_self", "decoder_self", "cross"):
        np.testing.assert_array_equal(maps.weights(kind), ref.weights(kind))
    validate_maps(load_maps(save_maps(tmp_path / "m.npz", maps)))


def test_maps_from_arrays_rejects_wrong_batch():
    ref = make_maps()
    weights = {kind: np.transpose(ref.weights(kind), (1, 0, 2, 3, 4))
               for kind in ("encoder_self", "decoder_self", "cross")}
    with pytest.raises(ValueError, match="B=2"):
        maps_from_arrays(weights, [["</s>"]] * 2, [["<s>"]] * 2, step=0, decode="greedy")


def test_concatenate_pads_to_the_longest():
    a, b = make_maps(src_lens=(3,), tgt_lens=(5,)), make_maps(src_lens=(6, 2), tgt_lens=(2, 3), seed=4)
    both = concatenate_maps([a, b])
    validate_maps(both)
    assert both.cross.shape == (3, 3, 2, 5, 6)
    np.testing.assert_array_equal(both.cross[0, :, :, :5, :3], a.cross[0])
    np.testing.assert_array_equal(both.cross[2, :, :, :3, :6], b.cross[1])
    assert both.source_tokens[0].tolist() == ["▁Ein", "▁Mann", "</s>", "", "", ""]


def test_matrix_selects_and_averages_valid_region():
    maps = make_maps()
    full = maps.cross[1]  # [L, H, T, S]; example 1 has T=6, S=3
    np.testing.assert_allclose(maps.matrix(1, "cross"), full[:, :, :6, :3].mean((0, 1)), rtol=1e-6)
    np.testing.assert_array_equal(maps.matrix(1, "cross", 2, 1), full[2, 1, :6, :3])
    np.testing.assert_array_equal(maps.matrix(1, "cross", -1, 0), full[2, 0, :6, :3])
    np.testing.assert_allclose(maps.matrix(1, "cross", [0, 2], "mean"),
                               full[[0, 2], :, :6, :3].mean((0, 1)), rtol=1e-6)
    assert maps.matrix(0, "encoder_self", 0, 0).shape == (5, 5)
    assert maps.query_tokens(2, "decoder_self") == ["<s>", "▁A"]
    with pytest.raises(IndexError):
        maps.matrix(0, "cross", 3, 0)
    with pytest.raises(IndexError):
        maps.matrix(3, "cross")
