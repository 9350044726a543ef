"""models/contributions.py against an independent NumPy implementation: a NumPy forward
pass of the whole Transformer from its parameters, and the measures written with
explicit loops over queries, keys and heads (Kobayashi et al. 2020, 2021; ALTI and its
ALTI+ rollout, Ferrando et al. 2022)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs.model import ModelConfig
from data.tokenizer import BOS_ID, EOS_ID
from models.contributions import block_measures, contributions, trace
from models.transformer import Transformer

ATOL = 1e-5


def make_model(layers: int, pre_ln: bool, seed: int = 0, **overrides) -> Transformer:
    values = dict(src_vocab_size=30, tgt_vocab_size=30, d_model=16, num_heads=2,
                  num_encoder_layers=layers, num_decoder_layers=layers, d_ff=24, dropout=0.0,
                  pre_ln=pre_ln)
    model = Transformer(ModelConfig(**{**values, **overrides}), rngs=nnx.Rngs(seed))
    # Random (not initial) layer-norm scales and biases and projection biases, so that
    # every parameter the measures read has an effect.
    rng = np.random.default_rng(seed + 1)
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param) and var[...].ndim == 1:
            var[...] = jnp.asarray(rng.normal(1.0 if var[...].shape[0] == 16 else 0.0, 0.3,
                                              var[...].shape), jnp.float32)
    return model


def arr(x) -> np.ndarray:
    return np.asarray(x[...], np.float64)


# ---------------------------------------------------------------- NumPy reference

def np_layer_norm(norm, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.epsilon) * arr(norm.scale) + arr(norm.bias)


def np_attention(attn, h_q, h_kv, mask):
    """Returns (output [Q, D], weights [H, Q, K], f [H, K, D]) for one sentence."""
    heads, dk, dv = attn.num_heads, attn.key_dim, attn.value_dim
    q = h_q @ arr(attn.query.kernel) + arr(attn.query.bias)
    k = h_kv @ arr(attn.key.kernel) + arr(attn.key.bias)
    v = h_kv @ arr(attn.value.kernel) + arr(attn.value.bias)
    w_o, b_o = arr(attn.out.kernel), arr(attn.out.bias)
    weights = np.zeros((heads, len(h_q), len(h_kv)))
    f = np.zeros((heads, len(h_kv), w_o.shape[1]))
    out = np.zeros((len(h_q), w_o.shape[1])) + b_o
    for h in range(heads):
        qs, ks, vs = (a[:, h * d:(h + 1) * d] for a, d in ((q, dk), (k, dk), (v, dv)))
        logits = np.where(mask, qs @ ks.T / math.sqrt(dk), -np.inf)
        e = np.exp(logits - logits.max(-1, keepdims=True))
        weights[h] = e / e.sum(-1, keepdims=True)
        f[h] = vs @ w_o[h * dv:(h + 1) * dv]
        out += weights[h] @ f[h]
    return out, weights, f


def np_block(block, attn, x, kv, mask, pre_ln, residual):
    """One residual attention block and its measures, element by element."""
    h = np_layer_norm(block.norm, x) if pre_ln else x
    out, weights, f = np_attention(attn, h, h if kv is None else kv, mask)
    summed = x + out
    y = summed if pre_ln else np_layer_norm(block.norm, summed)
    heads, q_len, k_len = weights.shape
    n_terms = k_len + (residual == "column")
    terms = np.zeros((q_len, n_terms, x.shape[1]))
    norm = np.zeros((heads, q_len, k_len))
    for i in range(q_len):
        for j in range(k_len):
            for hd in range(heads):
                terms[i, j] += weights[hd, i, j] * f[hd, j]
                norm[hd, i, j] = np.linalg.norm(weights[hd, i, j] * f[hd, j])
        terms[i, i if residual == "diagonal" else k_len] += x[i]
        if not pre_ln:  # the post-LN norm, split over the terms
            std = np.sqrt(summed[i].var() + block.norm.epsilon)
            for j in range(n_terms):
                terms[i, j] = arr(block.norm.scale) * (terms[i, j] - terms[i, j].mean()) / std
    resln = np.linalg.norm(terms, axis=-1)
    alti = np.zeros((q_len, n_terms))
    for i in range(q_len):
        for j in range(n_terms):
            alti[i, j] = max(0.0, np.abs(y[i]).sum() - np.abs(y[i] - terms[i, j]).sum())
        alti[i] /= alti[i].sum()
    return y, weights, {"norm": norm, "resln": resln, "alti": alti}


def np_positions(n, dim):
    pe = np.zeros((n, dim))
    for p in range(n):
        for i in range(0, dim, 2):
            angle = p / 10000 ** (i / dim)
            pe[p, i] = math.sin(angle)
            if i + 1 < dim:
                pe[p, i + 1] = math.cos(angle)
    return pe


def np_ffn(layer, x, pre_ln):
    block, ff = layer.feed_forward_block, layer.feed_forward
    h = np_layer_norm(block.norm, x) if pre_ln else x
    out = np.maximum(h @ arr(ff.up.kernel) + arr(ff.up.bias), 0) @ arr(ff.down.kernel) + arr(
        ff.down.bias)
    return x + out if pre_ln else np_layer_norm(block.norm, x + out)


def np_reference(model, src_ids, tgt_ids):
    """Everything for one unpadded sentence: src_ids [S], tgt_ids [T] (decoder input)."""
    pre_ln = model.config.pre_ln
    table = arr(model.source_embed.tokens.embedding)
    d = table.shape[1]
    s, t = len(src_ids), len(tgt_ids)
    x = table[src_ids] * math.sqrt(d) + np_positions(s, d)
    res = {k: [] for k in ("w_enc", "norm_enc", "resln_enc", "alti_enc", "w_self", "norm_self",
                           "resln_self", "alti_self", "w_cross", "norm_cross", "resln_cross",
                           "alti_cross")}
    for layer in model.encoder_layers:
        x, w, m = np_block(layer.attention_block, layer.attention, x, None,
                           np.ones((s, s), bool), pre_ln, "diagonal")
        for key, value in (("w_enc", w), ("norm_enc", m["norm"]), ("resln_enc", m["resln"]),
                           ("alti_enc", m["alti"])):
            res[key].append(value)
        x = np_ffn(layer, x, pre_ln)
    memory = np_layer_norm(model.encoder_norm, x) if pre_ln else x
    y = arr(model.target_embed.tokens.embedding)[tgt_ids] * math.sqrt(d) + np_positions(t, d)
    causal = np.tril(np.ones((t, t), bool))
    for layer in model.decoder_layers:
        y, w, m = np_block(layer.self_block, layer.self_attention, y, None, causal, pre_ln,
                           "diagonal")
        for key, value in (("w_self", w), ("norm_self", m["norm"]), ("resln_self", m["resln"]),
                           ("alti_self", m["alti"])):
            res[key].append(value)
        y, w, m = np_block(layer.cross_block, layer.cross_attention, y, memory,
                           np.ones((t, s), bool), pre_ln, "column")
        for key, value in (("w_cross", w), ("norm_cross", m["norm"]), ("resln_cross", m["resln"]),
                           ("alti_cross", m["alti"])):
            res[key].append(value)
        y = np_ffn(layer, y, pre_ln)
    # ALTI+ rollout, written out as sums over tokens.
    r_enc = np.eye(s)
    for c in res["alti_enc"]:
        r_enc = np.array([[sum(c[i, k] * r_enc[k, j] for k in range(s)) for j in range(s)]
                          for i in range(s)])
    source = target = None
    for c_self, c_cross in zip(res["alti_self"], res["alti_cross"], strict=True):
        new_src = np.zeros((t, s))
        new_tgt = np.zeros((t, t))
        for i in range(t):
            through_residual = c_cross[i, s]
            for j in range(s):
                new_src[i, j] = sum(c_cross[i, k] * r_enc[k, j] for k in range(s))
            for k in range(t):
                share = c_self[i, k] * through_residual
                if source is None:
                    new_tgt[i, k] += share
                else:
                    new_src[i] += share * source[k]
                    new_tgt[i] += share * target[k]
        source, target = new_src, new_tgt
    res["alti_source"], res["alti_target"] = source, target
    return res


# ---------------------------------------------------------------- tests

SRC = [[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID]]
TGT = [[BOS_ID, 11, 12, 13], [BOS_ID, 14]]


def padded(rows):
    out = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return jnp.asarray(out)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("pre_ln", [True, False], ids=["pre_ln", "post_ln"])
def test_matches_numpy_reference(layers, pre_ln):
    model = make_model(layers, pre_ln)
    src, tgt = padded(SRC), padded(TGT)
    got = jax.device_get(jax.jit(lambda s, t: contributions(model, s, t))(src, tgt))
    tr = trace(model, src, tgt)
    logits, _ = model(src, tgt, return_weights=True)  # the same (reference) attention path
    np.testing.assert_allclose(tr.logits, logits, atol=1e-6)  # the walk is the model's pass
    for b, (src_ids, tgt_ids) in enumerate(zip(SRC, TGT, strict=True)):
        s, t = len(src_ids), len(tgt_ids)
        ref = np_reference(model, np.array(src_ids), np.array(tgt_ids))
        for kind, key, q, k in (("encoder_self", "enc", s, s), ("decoder_self", "self", t, t),
                                ("cross", "cross", t, s)):
            for layer in range(layers):
                # The model's weights equal the reference's: the reference pass is right.
                np.testing.assert_allclose(getattr(tr, kind)[layer].weights[b, :, :q, :k],
                                           ref[f"w_{key}"][layer], atol=ATOL)
                np.testing.assert_allclose(got[f"norm_{kind}"][b, layer, :, :q, :k],
                                           ref[f"norm_{key}"][layer], atol=ATOL, rtol=1e-5,
                                           err_msg=f"norm {kind} layer {layer}")
                np.testing.assert_allclose(got[f"norm_resln_{kind}"][b, layer, :q, :k],
                                           ref[f"resln_{key}"][layer][:, :k], atol=ATOL,
                                           rtol=1e-5, err_msg=f"norm_resln {kind} {layer}")
            if kind == "cross":
                np.testing.assert_allclose(got["norm_resln_cross_residual"][b, :, :t],
                                           np.stack(ref["resln_cross"])[:, :, s], atol=ATOL,
                                           rtol=1e-5)
        np.testing.assert_allclose(got["alti_source"][b, :t, :s], ref["alti_source"], atol=ATOL)
        np.testing.assert_allclose(got["alti_target"][b, :t, :t], ref["alti_target"], atol=ATOL)
        rows = got["alti_source"][b, :t, :s].sum(-1) + got["alti_target"][b, :t, :t].sum(-1)
        np.testing.assert_allclose(rows, 1.0, atol=ATOL)
        np.testing.assert_allclose(got["source_share"][b, :t], ref["alti_source"].sum(-1),
                                   atol=ATOL)
        # Padded keys get nothing.
        assert np.all(got["alti_source"][b, :t, s:] == 0)
        assert np.all(got["norm_cross"][b, :, :, :t, s:] == 0)
        assert np.all(np.triu(got["alti_target"][b, :t, :t], 1) == 0)  # causal


def test_reference_measures_are_not_trivially_equal():
    """The measures differ from the weights and from each other, so matching them means
    something: ALTI+ gives the target prefix a real share, norms are not weights."""
    model = make_model(2, True)
    got = contributions(model, padded(SRC), padded(TGT))
    w = trace(model, padded(SRC), padded(TGT)).cross[0].weights
    assert np.abs(got["norm_cross"][:, 0] - w).max() > 0.05
    share = got["source_share"][0, :4]
    assert share.min() > 0.05 and share.max() < 0.95


@pytest.mark.parametrize("pre_ln", [True, False], ids=["pre_ln", "post_ln"])
def test_constant_values_give_weights_times_the_constant(pre_ln):
    model = make_model(2, pre_ln)
    rng = np.random.default_rng(3)
    scale = {}
    layers = [*(("encoder_self", i, lay.attention) for i, lay in enumerate(model.encoder_layers)),
              *(("decoder_self", i, lay.self_attention) for i, lay in enumerate(model.decoder_layers)),
              *(("cross", i, lay.cross_attention) for i, lay in enumerate(model.decoder_layers))]
    for kind, i, attn in layers:  # f_h(u) = b_v[h] W_o[h] whatever u is
        attn.value.kernel[...] = jnp.zeros_like(attn.value.kernel[...])
        attn.value.bias[...] = jnp.asarray(rng.normal(size=attn.value.bias[...].shape), jnp.float32)
        bias, w_o, dv = arr(attn.value.bias), arr(attn.out.kernel), attn.value_dim
        scale[kind, i] = [np.linalg.norm(bias[h * dv:(h + 1) * dv] @ w_o[h * dv:(h + 1) * dv])
                          for h in range(attn.num_heads)]
    src, tgt = padded(SRC), padded(TGT)
    got = contributions(model, src, tgt)
    tr = trace(model, src, tgt)
    for kind, i, _ in layers:
        expected = getattr(tr, kind)[i].weights * np.asarray(scale[kind, i])[None, :, None, None]
        np.testing.assert_allclose(got[f"norm_{kind}"][:, i], expected, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("pre_ln", [True, False], ids=["pre_ln", "post_ln"])
def test_per_block_alti_rows_sum_to_one(pre_ln):
    model = make_model(1, pre_ln)
    tr = trace(model, padded(SRC), padded(TGT))
    layer = model.decoder_layers[0]
    for block, attn, norm, residual in ((tr.cross[0], layer.cross_attention, layer.cross_block.norm,
                                         "column"),
                                        (tr.decoder_self[0], layer.self_attention,
                                         layer.self_block.norm, "diagonal")):
        one = jax.tree.map(lambda a: a[0], block)
        m = block_measures(attn, norm, pre_ln, one, residual)
        np.testing.assert_allclose(m["alti"].sum(-1), 1.0, atol=ATOL)
        assert m["alti"].shape[-1] == one.weights.shape[-1] + (residual == "column")


def test_decoded_maps_equal_teacher_forcing_the_hypothesis():
    """The claim the decoded maps' contributions rest on: teacher-forcing the returned
    hypothesis gives the attention the search recorded (greedy and beam)."""
    from models.translate import to_token_lists, translate

    model = make_model(2, True, seed=4)
    src = padded([[5, 6, 7, 8, 9, 10, EOS_ID], [11, 12, EOS_ID]])
    for beam in (1, 3):
        out = translate(model, src, beam_size=beam, max_length=8, return_weights=True)
        hyps = to_token_lists(jax.device_get(out))
        tgt = padded([[BOS_ID, *h] for h in hyps])
        tr = trace(model, src, tgt)
        for b, h in enumerate(hyps):
            t, s = len(h) + 1, int((src[b] != 0).sum())
            t = min(t, out.weights["cross"].shape[-2])
            for layer in range(2):
                np.testing.assert_allclose(out.weights["cross"][layer, b, :, :t, :s],
                                           tr.cross[layer].weights[b, :, :t, :s], atol=1e-5)
                np.testing.assert_allclose(out.weights["decoder_self"][layer, b, :, :t, :t],
                                           tr.decoder_self[layer].weights[b, :, :t, :t],
                                           atol=1e-5)


# ---------------------------------------------------------------- map files end to end

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step smoke run whose validation maps carry contributions."""
    from configs import smoke
    from train import train

    cfg = smoke.get_config()
    cfg.train.num_steps = 4
    cfg.eval.every_steps = 4
    cfg.checkpoint.every_steps = 4
    cfg.eval.max_sentences = 4
    cfg.attention_maps.num_examples = 2
    cfg.attention_maps.contributions = True
    workdir = tmp_path_factory.mktemp("contrib") / "run"
    assert train(cfg, workdir) == 0
    return workdir


def test_training_and_evaluate_write_contributions(trained, tmp_path):
    """attention_maps.contributions in training's validation maps, evaluate's
    --save_attention with contributions under beam search, and inspect's --measure."""
    from analysis.inspect import run as inspect
    from attention.mapfile import load_maps, validate_maps
    from common.errors import UserError
    from evaluate import evaluate

    workdir = trained
    for decode in ("teacher_forced", "greedy"):
        maps = load_maps(workdir / "attention" / f"valid_step0000004_{decode}.npz")
        assert maps.has_contributions and maps.num_examples == 2
        validate_maps(maps)

    result = evaluate(workdir, split="valid", beam_size=2, max_sentences=3, save_attention=3,
                      contributions=True, checkpoint="last", name="contrib")
    path = result["files"]["attention"]
    maps = load_maps(path)
    validate_maps(maps)
    assert maps.decode == "beam" and maps.has_contributions
    assert maps.norm_cross.shape == maps.cross.shape
    share = maps.source_share[0, : maps.target_lengths[0]]
    assert np.all((share > 0) & (share < 1))

    out = inspect(path, measure="alti", out=str(tmp_path / "alti.png"))
    assert out == [str(tmp_path / "alti.png")] and (tmp_path / "alti.png").stat().st_size > 0
    [png] = inspect(path, measure="norm", layer="0", head="1")
    assert png.endswith(".ex0.cross.0.1.norm.png")
    lines = inspect(path, measure="alti", align=True)
    assert len(lines) == 3 and all(set(line) <= set("0123456789- ") for line in lines)
    with pytest.raises(UserError, match="no --kind, --layer or --head"):
        inspect(path, measure="alti", layer="0")

    plain = evaluate(workdir, split="valid", beam_size=1, max_sentences=2, save_attention=2,
                     checkpoint="last", name="plain")
    assert not load_maps(plain["files"]["attention"]).has_contributions
    with pytest.raises(UserError, match="no contribution arrays for --measure norm"):
        inspect(plain["files"]["attention"], measure="norm")
    with pytest.raises(UserError, match="--contributions only applies with --save_attention"):
        evaluate(workdir, split="valid", contributions=True)


def model_maps(with_contributions: bool = True):
    """Maps of the two test sentences from a real model, through maps_from_arrays."""
    from attention.mapfile import maps_from_arrays

    model = make_model(2, True)  # pre-LN: the source share lies well inside (0, 1)
    src, tgt = padded(SRC), padded(TGT)
    _, weights = model(src, tgt, return_weights=True)
    measured = jax.device_get(contributions(model, src, tgt)) if with_contributions else None
    src_pieces = [[f"s{i}" for i in range(len(r) - 1)] + ["</s>"] for r in SRC]
    tgt_pieces = [["<s>"] + [f"t{i}" for i in range(len(r) - 1)] for r in TGT]
    return maps_from_arrays(jax.device_get(weights), src_pieces, tgt_pieces, 7, "teacher_forced",
                            measured)


def test_map_file_round_trip_and_old_files(tmp_path):
    from attention.mapfile import CONTRIBUTION_NAMES, load_maps, save_maps, validate_maps

    maps = model_maps()
    validate_maps(maps)
    loaded = load_maps(save_maps(tmp_path / "m.npz", maps))
    for name in CONTRIBUTION_NAMES:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(maps, name))
    # Cut to the lengths: the second sentence's padded source columns are gone.
    assert maps.alti_source.shape == (2, 4, 5) and np.all(maps.alti_source[1, :, 3:] == 0)
    old = load_maps(save_maps(tmp_path / "old.npz", model_maps(False)))
    assert not old.has_contributions and old.norm_cross is None
    validate_maps(old)


def test_map_file_refuses_broken_contributions(tmp_path):
    import dataclasses

    from attention.mapfile import MapFormatError, load_maps, validate_maps

    maps = model_maps()
    arrays = {f.name: getattr(maps, f.name) for f in dataclasses.fields(maps)}
    arrays.pop("alti_target")
    np.savez(tmp_path / "partial.npz", **arrays)
    with pytest.raises(MapFormatError, match="come all together: .* not alti_target"):
        load_maps(tmp_path / "partial.npz")
    for name, index, value, message in (
            ("norm_cross", (1, 0, 0, 0, 4), 0.5, "outside the lengths"),
            ("alti_source", (0, 1, 0), 0.9, "sums to"),
            ("alti_target", (0, 0, 2), 1e-5, "not causal"),
            ("source_share", (0, 2), 0.01, "source_share differs")):
        bad = dataclasses.replace(maps, **{name: getattr(maps, name).copy()})
        getattr(bad, name)[index] += value
        with pytest.raises(MapFormatError, match=message):
            validate_maps(bad)


def test_concatenate_and_views_carry_contributions():
    from attention.mapfile import concatenate_maps

    maps = model_maps()
    one = [example_alone(maps, i) for i in (0, 1)]
    joined = concatenate_maps([one[1], one[0]], order=[1, 0])
    for name in ("norm_cross", "norm_resln_cross_residual", "alti_source", "alti_target",
                 "source_share"):
        np.testing.assert_array_equal(getattr(joined, name), getattr(maps, name))
    view = maps.as_measure("alti")
    np.testing.assert_array_equal(view.cross[:, 1, 0], maps.alti_source)
    np.testing.assert_array_equal(maps.as_measure("norm").decoder_self, maps.norm_decoder_self)
    np.testing.assert_allclose(maps.matrix(0, "cross", 1, 0, measure="norm"),
                               maps.norm_cross[0, 1, 0, :4, :5])


def example_alone(maps, i):
    """Example i alone, cut to its own lengths (as record_maps would write it)."""
    from attention.mapfile import CONTRIBUTION_NAMES, maps_from_arrays

    weights = {k: np.swapaxes(getattr(maps, k)[i:i + 1], 0, 1) for k in
               ("encoder_self", "decoder_self", "cross")}
    measured = {name: getattr(maps, name)[i:i + 1] for name in CONTRIBUTION_NAMES}
    return maps_from_arrays(weights, [maps.key_tokens(i, "cross")], [maps.query_tokens(i, "cross")],
                            maps.step, maps.decode, measured)


class PieceTokenizer:
    """Just what record_maps asks of a tokenizer: one piece per id."""

    def source_pieces(self, ids):
        return ["</s>" if i == EOS_ID else f"s{i}" for i in ids]

    def target_pieces(self, ids):
        return [f"t{i}" for i in ids]


def test_heads_norm_share():
    """attention.heads' norm_share: each head's sum of ||alpha f(x)|| over the valid pairs
    of every sentence, over its layer's; computed here from the padded batch's arrays."""
    from analysis.heads import role_stats

    model = make_model(2, True)
    tgt_ids = [t[1:] for t in TGT]
    counts = {"src": np.ones(30, np.int64), "tgt": np.ones(30, np.int64)}
    shares = role_stats(model, PieceTokenizer(), SRC, tgt_ids, counts, batch_size=1)
    got = contributions(model, padded(SRC), padded(TGT))
    s_len, t_len = np.array([len(s) for s in SRC]), np.array([len(t) for t in TGT])
    for kind, q_len, k_len in (("encoder_self", s_len, s_len), ("decoder_self", t_len, t_len),
                               ("cross", t_len, s_len)):
        mass = sum(np.asarray(got[f"norm_{kind}"][b, :, :, :q_len[b], :k_len[b]]).sum((2, 3))
                   for b in range(2))  # [L, H]
        np.testing.assert_allclose(shares[kind]["norm_share"], mass / mass.sum(1, keepdims=True),
                                   atol=1e-6)
        np.testing.assert_allclose(np.sum(shares[kind]["norm_share"], 1), 1.0, atol=1e-6)


def test_align_reads_links_from_a_measure(trained):
    """attention.align --measure: the maps it reads are the norm-based maps / ALTI+ source
    contributions of each pair (head-averaged), computed here from the pair's ids."""
    from alignment.aligner import align
    from alignment.forced import Recorded
    from alignment.settings import describe
    from configs import resolved
    from evaluation.loading import load_params, load_tokenizer

    sources, targets = ["ein Mann läuft .", "zwei Hunde"], ["a man runs .", "two dogs"]
    cfg = resolved.load_config_json(trained)
    model = load_params(trained, "last", cfg=cfg, tokenizer=load_tokenizer(trained, cfg)).model
    recorded = {m: Recorded(trained, "last", sources, targets, measure=m)
                for m in ("weights", "norm", "alti")}
    for i, unit in enumerate(recorded["norm"].units):
        n, m = len(unit.tgt), len(unit.src)
        src = jnp.asarray([[*unit.src, EOS_ID]], jnp.int32)
        tgt = jnp.asarray([[BOS_ID, *unit.tgt]], jnp.int32)
        got = contributions(model, src, tgt)
        np.testing.assert_allclose(recorded["norm"].atts[i],
                                   np.asarray(got["norm_cross"][0]).mean(1)[:, :n + 1, :m + 1],
                                   atol=1e-5)
        for layer in recorded["alti"].atts[i]:  # the whole model's: the same on every layer
            np.testing.assert_allclose(layer, got["alti_source"][0, :n + 1, :m + 1], atol=1e-5)
        assert not np.allclose(recorded["weights"].atts[i], recorded["norm"].atts[i])
    result = align(trained, sources, targets, measure="alti", checkpoint="last", layer=0)
    assert result["settings"]["measure"] == "alti" and len(result["links"]) == 2
    assert result["links"] == recorded["alti"].links(0, False, None)
    assert describe(result["settings"]).endswith("measure alti")
