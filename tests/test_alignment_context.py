"""model.alignment_context: the heads' lexical tables read a window of neighbouring
pieces -- the window against NumPy, the table starting as the context-free one, what a
piece's score depends on (its neighbours within k, never beyond; NULL on nothing), and
the config refusals."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import smoke
from configs.cli import UserError, validate_config
from models.alignment_head import context_windows
from models.transformer import Transformer
from tests.test_alignment_head import small_config, toy_batch

PAIRS = [([5, 6, 7, 8], [9, 10, 11]), ([5, 6], [12, 13, 14, 15])]


def test_context_windows_match_a_numpy_reference():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(2, 5, 3)).astype(np.float32)
    real = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)  # 4 and 2 pieces, then </s>/pad
    got = np.asarray(context_windows(jnp.asarray(rows), jnp.asarray(real), 2))
    want = np.zeros((2, 5, 15), np.float32)
    for b in range(2):
        for i in range(5):
            for block, n in enumerate(range(i - 2, i + 3)):
                if n == i:
                    want[b, i, block * 3:(block + 1) * 3] = rows[b, i]
                elif real[b, i] and 0 <= n < 5 and real[b, n]:
                    want[b, i, block * 3:(block + 1) * 3] = rows[b, n]
    np.testing.assert_array_equal(got, want)


def lexical_terms(model: Transformer, pairs) -> tuple[np.ndarray, np.ndarray]:
    batch = toy_batch(pairs)
    _, _, _, terms = model.forward_with_alignment(batch["src"], batch["tgt_in"], batch["tgt_out"])
    return (np.asarray(terms["alignment_log_lexical"]),
            np.asarray(terms["alignment_reverse_log_lexical"]))


def both_heads(context: int, seed: int = 0) -> Transformer:
    return Transformer(small_config(alignment_jumps=True, alignment_reverse=True, dropout=0.0,
                                    alignment_context=context), rngs=nnx.Rngs(seed))


def test_the_table_starts_as_the_context_free_one():
    """Same seed, same parameters but the window's projection, which starts as the piece
    alone: both heads' lexical scores equal the context-free model's."""
    with_context, without = both_heads(1), both_heads(0)
    assert with_context.alignment_head.lexical_context.kernel.value.shape == (48, 16)
    for name in ("alignment_head", "alignment_reverse"):
        head, plain = getattr(with_context, name), getattr(without, name)
        for part in ("lexical_up", "lexical_down", "lexical_norm", "output"):
            nnx.update(getattr(head, part), nnx.state(getattr(plain, part)))
        head.output_bias.value = plain.output_bias.value
    for got, want in zip(lexical_terms(with_context, PAIRS), lexical_terms(without, PAIRS),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_score_depends_on_neighbours_within_the_window_only():
    """Change source piece 0 of the first pair: with k = 1 the scores of pieces 0 and 1
    move, pieces 2, 3 and NULL (</s>) do not; the reverse head, reading target windows,
    sees the change in its column of source piece 0 only."""
    model = both_heads(1, seed=3)
    rng = np.random.default_rng(3)
    model.alignment_head.lexical_context.kernel.value = jnp.asarray(
        rng.normal(size=(48, 16)).astype(np.float32) * 0.3)
    before, reverse_before = lexical_terms(model, PAIRS)
    changed = [([20, 6, 7, 8], [9, 10, 11]), PAIRS[1]]
    after, reverse_after = lexical_terms(model, changed)
    moved = ~np.isclose(before[0], after[0], rtol=1e-6, atol=1e-6).all(axis=0)  # per piece
    assert moved.tolist() == [True, True, False, False, False, False][: moved.size]
    np.testing.assert_array_equal(before[1], after[1])  # the other pair is untouched
    # The reverse head scores source tokens: only row 0 (the changed token) differs.
    rows_moved = ~np.isclose(reverse_before[0], reverse_after[0], atol=1e-6).all(axis=1)
    assert rows_moved.tolist()[:5] == [True, False, False, False, False]


def test_the_config_refusals():
    config = smoke.get_config()
    config.model.alignment_context = 1
    with pytest.raises(UserError, match="alignment_context needs model.alignment_head"):
        validate_config(config)
    config.model.alignment_head = True
    config.data.pack_length = 64
    with pytest.raises(UserError, match="alignment_context needs data.pack_length=0"):
        validate_config(config)
    config.data.pack_length = 0
    config.model.alignment_context = -1
    with pytest.raises(UserError, match="alignment_context must be 0 or more"):
        validate_config(config)
