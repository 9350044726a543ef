"""alignment/head.py: the mixture against NumPy, its invariants, that it leaves the
translation model's gradient alone, and that it learns a known alignment."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from alignment.forced import HeadTerms, head_posterior
from alignment.head import AlignmentHead, mixture_log_likelihood, posterior
from alignment.plugin import AlignmentConfig, AlignmentPlugin, AlignmentTransformer
from configs import smoke
from configs.model import ModelConfig
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from models.transformer import Transformer
from training.plugins import active_plugins
from training.step import batch_loss, create_train_state, make_train_step


def small_config(**overrides) -> ModelConfig:
    values = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=16, num_heads=2,
                  num_encoder_layers=1, num_decoder_layers=1, d_ff=32)
    return ModelConfig(**{**values, **overrides})


def aligner(config: ModelConfig | None = None, seed: int = 0, **alignment) -> AlignmentTransformer:
    """A small model with the alignment head and the `alignment` settings (AlignmentConfig)."""
    return AlignmentTransformer(config or small_config(), AlignmentConfig(**alignment),
                                rngs=nnx.Rngs(seed))


def align_loss(model: AlignmentTransformer, batch: dict, label_smoothing: float,
               dropout_rng=None, step=0, **settings):
    """`batch_loss` with the alignment plug-in of the model's settings, `settings` replaced
    (agreement=2.0, say)."""
    plugin = AlignmentPlugin(dataclasses.replace(model.alignment, **settings))
    return batch_loss(model, batch, label_smoothing, dropout_rng, plugins=(plugin,), step=step)


def smoke_align(**alignment):
    """configs/smoke.py:align with `alignment` set, its group's keys."""
    cfg = smoke.get_config("align")
    cfg.alignment.update(alignment)
    return cfg


def np_layer_norm(x, scale, bias, eps=1e-6):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_joint_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    head = AlignmentHead(small_config(), rngs=nnx.Rngs(1))
    p = jax.tree.map(np.asarray, nnx.state(head, nnx.Param).to_pure_dict())
    states, memory, embeds = (rng.normal(size=s).astype(np.float32)
                              for s in [(2, 3, 16), (2, 5, 16), (2, 5, 16)])
    targets = np.array([[4, 7, EOS_ID], [9, EOS_ID, PAD_ID]])
    mask = np.ones((2, 3, 5), bool)
    mask[1, :, 3:] = False  # the second source has 3 pieces
    got = np.asarray(head.joint(*map(jnp.asarray, (states, memory, embeds, targets, mask))))

    q = np_layer_norm(states, p["query_norm"]["scale"], p["query_norm"]["bias"])
    q = q @ p["query"]["kernel"] + p["query"]["bias"]
    k = memory @ p["key"]["kernel"] + p["key"]["bias"]
    prior = np.einsum("btd,bsd->bts", q, k) / 4.0
    log_prior = np_log_softmax(np.where(mask, prior, -np.inf))
    hidden = np.maximum(embeds @ p["lexical_up"]["kernel"] + p["lexical_up"]["bias"], 0)
    h = embeds + hidden @ p["lexical_down"]["kernel"] + p["lexical_down"]["bias"]
    h = np_layer_norm(h, p["lexical_norm"]["scale"], p["lexical_norm"]["bias"])
    log_t = np_log_softmax(h @ p["output"]["embedding"].T + p["output_bias"])  # [B, S, V]
    log_lexical = np.stack([log_t[b][:, targets[b]].T for b in range(2)])  # [B, T, S]
    want = log_lexical + log_prior
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-4)
    assert np.all(got[~mask] <= -1e8)

    # The mixture and its posterior: logsumexp over pieces, rows sum to 1, masked = 0.
    log_lik = np.asarray(mixture_log_likelihood(jnp.asarray(got)))
    np.testing.assert_allclose(log_lik, np.log(np.exp(np.where(mask, want, -np.inf)).sum(-1)),
                               rtol=1e-4, atol=1e-4)
    post = np.asarray(posterior(jnp.asarray(got)))
    np.testing.assert_allclose(post.sum(-1), 1.0, rtol=1e-6)
    assert np.all(post[~mask] == 0.0)

    # Its two terms, and the posterior with the prior raised to w (prior^w x lexical,
    # normalised) read from the joint and log prior as forced alignment records them.
    got_prior, got_lexical = (np.asarray(t) for t in head.log_terms(
        *map(jnp.asarray, (states, memory, embeds, targets, mask))))
    np.testing.assert_allclose(got_prior[mask], log_prior[mask], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_lexical[mask], log_lexical[mask], rtol=1e-4, atol=1e-4)
    for b, m in ((0, 5), (1, 3)):  # a unit keeps its real pieces' columns only
        terms = HeadTerms(got_prior[b, :, :m], got_lexical[b, :, :m], None)
        for w in (1.0, 0.5, 0.0):
            ref = np.exp(w * log_prior[b, :, :m] + log_lexical[b, :, :m])
            ref /= ref.sum(-1, keepdims=True)
            np.testing.assert_allclose(head_posterior(terms, w), ref, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(head_posterior(terms, 1.0), post[b, :, :m], atol=1e-6)


def test_forward_with_alignment_returns_the_terms_in_logs():
    model = aligner()
    batch = toy_batch([([5, 6, 7], [9, 8]), ([5], [10, 11, 12])])
    _, log_lik, _, weights = model.forward_with_alignment(batch["src"], batch["tgt_in"],
                                                       batch["tgt_out"], return_weights=True)
    prior = np.exp(np.asarray(weights["alignment_log_prior"]))  # [B, T, S]
    np.testing.assert_allclose(prior.sum(-1), 1.0, rtol=1e-5)
    assert np.all(prior[1, :, 2:] == 0.0)  # the second source: one piece and </s>
    lexical = np.asarray(weights["alignment_log_lexical"])
    assert np.all(lexical[1, :, 2:] <= -1e8) and "alignment_transition_bias" not in weights
    want = np.log((prior * np.exp(np.minimum(lexical, 0))).sum(-1))  # the mixture's
    np.testing.assert_allclose(np.asarray(log_lik), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_translation_gradient_is_unchanged_by_the_head():
    """Same seed, same parameters but the head's: the translation part gets the same
    gradient (stop_gradient inputs), and a model without the head has no head params."""
    src = jnp.array([[5, 6, 7, EOS_ID, 0], [8, 9, EOS_ID, 0, 0]])
    tgt_in = jnp.array([[BOS_ID, 10, 11, 0], [BOS_ID, 12, 0, 0]])
    tgt_out = jnp.array([[10, 11, EOS_ID, 0], [12, EOS_ID, 0, 0]])
    batch = {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}
    grads = {}
    for with_head in (False, True):
        model = aligner() if with_head else Transformer(small_config(), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model, nnx.Param)
        params = params.to_pure_dict()

        def loss(p, graphdef=graphdef, with_head=with_head):
            model = nnx.merge(graphdef, p)
            return align_loss(model, batch, 0.1) if with_head else batch_loss(model, batch, 0.1)

        (_, sums), grads[with_head] = jax.value_and_grad(loss, has_aux=True)(params)
        assert ("align_nll_sum" in sums) == with_head
    assert "alignment_head" not in grads[False]
    head_grads = grads[True].pop("alignment_head")
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(head_grads))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads[False], grads[True])


def toy_bitext(rng, num_pairs: int, vocab: int = 12, offset: int = 4):
    """A word-for-word 'language' with reordering: target word = source word + vocab,
    target order = source order reversed. The true link of target j is source n-1-j."""
    pairs = []
    for _ in range(num_pairs):
        n = int(rng.integers(3, 7))
        src = list(rng.choice(vocab, size=n, replace=False) + offset)
        pairs.append((src, [w + vocab for w in reversed(src)]))
    return pairs


def toy_batch(pairs) -> dict:
    s = max(len(a) for a, _ in pairs) + 1
    batch = {k: np.full((len(pairs), s), PAD_ID, np.int32) for k in ("src", "tgt_in", "tgt_out")}
    for r, (a, b) in enumerate(pairs):
        batch["src"][r, : len(a) + 1] = [*a, EOS_ID]
        batch["tgt_in"][r, : len(b) + 1] = [BOS_ID, *b]
        batch["tgt_out"][r, : len(b) + 1] = [*b, EOS_ID]
    return batch


def trained_on_toy_reversal(jumps: bool = False, attention_prior: bool = True,
                            reverse: bool = False, student: bool = False):
    """A small model with an alignment head (an HMM with `jumps`, with or without its
    prior attention, its `reverse` twin and the `student` they teach) trained 300 steps
    on the toy bitext: (model, 64 new test pairs, forward_with_alignment's weights on
    them)."""
    cfg = smoke_align(jumps=jumps, attention_prior=attention_prior, reverse=reverse,
                      student=student)
    cfg.model.update(d_model=32, num_heads=2, d_ff=64, dropout=0.0)
    cfg.train.update(learning_rate=3e-3, warmup_steps=20)
    graphdef, state = create_train_state(cfg, 40, 40)
    step = make_train_step(graphdef, cfg.train, plugins=active_plugins(cfg))
    rng = np.random.default_rng(0)
    for _ in range(300):
        state, _ = step(state, toy_batch(toy_bitext(rng, 32)))
    test = toy_bitext(np.random.default_rng(1), 64)
    batch = toy_batch(test)
    model = nnx.merge(graphdef, state["params"])
    _, _, _, weights = model.forward_with_alignment(batch["src"], batch["tgt_in"],
                                                 batch["tgt_out"], return_weights=True)
    return model, test, weights


@pytest.mark.slow
def test_the_head_learns_a_known_alignment():
    """Trained on the toy bitext, the posterior's argmax finds the reversed links (the
    lexical table alone decides them: every word occurs once per sentence)."""
    _, test, weights = trained_on_toy_reversal()
    joint = weights["alignment_log_prior"] + weights["alignment_log_lexical"]
    best = np.asarray(jnp.argmax(posterior(joint), axis=-1))
    right = total = 0
    for r, (a, _) in enumerate(test):
        n = len(a)
        right += sum(int(best[r, j] == n - 1 - j) for j in range(n))
        total += n
    assert right / total > 0.95, right / total


def test_a_train_step_moves_translation_as_without_the_heads():
    """Clipping takes the translation's gradient norm apart from the heads' and the
    student's (clip_by_group_norm): steps under a tight clip leave the translation parameters
    where a model without heads puts them, and the heads where a model without the
    student puts them (a few steps: Adam's first is blind to the gradient's scale), and
    each group is clipped to the norm."""
    from training.step import clip_by_group_norm

    batches = [toy_batch(toy_bitext(np.random.default_rng(seed), 4)) for seed in range(3)]
    after = {}
    for parts in ("none", "heads", "heads and student"):
        heads, student = parts != "none", parts == "heads and student"
        cfg = smoke_align(jumps=True, reverse=True, student=student) if heads else \
            smoke.get_config()
        cfg.model.update(d_model=16, num_heads=2, d_ff=32, dropout=0.0)
        cfg.train.update(grad_clip=0.01, warmup_steps=1)  # every step clipped
        graphdef, state = create_train_state(cfg, 40, 40)
        step = make_train_step(graphdef, cfg.train, plugins=active_plugins(cfg))
        for batch in batches:
            state, _ = step(state, batch)
        after[parts] = jax.device_get(state["params"])
    def same(a, b):
        # Attention key biases left out: their gradient is zero in exact arithmetic (a bias
        # on the keys adds one constant to each query's logits, which softmax ignores), so
        # Adam scales float rounding up to steps of the learning rate's size, different in
        # any two compiled programs.
        a, b = ({jax.tree_util.keystr(path): x
                 for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
                 if not jax.tree_util.keystr(path).endswith("['key']['bias']")}
                for tree in (a, b))
        assert a.keys() == b.keys()
        for path in a:
            np.testing.assert_allclose(a[path], b[path], rtol=1e-6, atol=1e-8, err_msg=path)

    assert "alignment_student" in after["heads and student"]
    after["heads and student"].pop("alignment_student")
    for name in ("alignment_head", "alignment_reverse"):
        assert name not in after["none"] and name in after["heads"]
        same(after["heads"].pop(name), after["heads and student"].pop(name))  # the teachers
    same(after["none"], after["heads"])  # translation, without and with the heads ...
    same(after["none"], after["heads and student"])  # ... and the student

    grads = {"embed": jnp.full((4,), 3.0), "alignment_head": {"w": jnp.full((9,), 4.0)},
             "alignment_student": {"w": jnp.full((16,), 5.0)}}
    for container in (dict, nnx.State):  # the train step's pure dicts, bench's States
        clipped, _ = clip_by_group_norm(1.0, AlignmentPlugin.param_groups).update(
            container(grads), optax.EmptyState())
        assert type(clipped) is container
        for norm in (clipped["embed"], clipped["alignment_head"]["w"],
                     clipped["alignment_student"]["w"]):  # each group to 1 on its own
            assert float(jnp.linalg.norm(norm)) == pytest.approx(1.0, rel=1e-6)
