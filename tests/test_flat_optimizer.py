"""`train.flat_optimizer` (training/step.py `flat_adamw`): Adam's moments as one vector
each. The same update as the per-array AdamW, weight decay's mask included, on a train
state of far fewer arrays; a run cannot switch layouts on resume."""

import jax
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from test_grad_accum import micro_batches, tiny_config
from test_train import flat

from common.errors import UserError


def trained(flat_optimizer: bool, grad_accum_steps: int = 1) -> dict:
    from training.step import create_train_state, make_train_step

    cfg = tiny_config(grad_accum_steps, warmup_steps=2)
    cfg.train.weight_decay = 0.1  # large enough that a wrong mask would show
    cfg.train.flat_optimizer = flat_optimizer
    graphdef, state = create_train_state(cfg, 50, 50)
    step = make_train_step(graphdef, cfg.train)
    for batch in micro_batches():
        state, _ = step(state, batch)
    return state


def moments(state: dict) -> tuple[np.ndarray, np.ndarray]:
    """Adam's (mu, nu), raveled in the parameters' order, from either layout."""
    adam = next(s for s in jax.tree.leaves(state["opt_state"], is_leaf=lambda s: hasattr(s, "mu"))
                if hasattr(s, "mu"))
    return ravel_pytree(adam.mu)[0], ravel_pytree(adam.nu)[0]


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_flat_adamw_updates_as_the_per_array_adamw(grad_accum_steps):
    """Every parameter but the attention key biases, whose gradient is zero in exact
    arithmetic (a softmax does not see a shift shared by all keys): what they get is
    rounding noise, which Adam scales up to the learning rate's size, so any change in the
    order of a sum (another program) gives them other values; both runs keep them tiny."""
    trees, flats = trained(False, grad_accum_steps), trained(True, grad_accum_steps)
    a, b = flat(trees["params"]), flat(flats["params"])
    assert a.keys() == b.keys()
    noise = [key for key in a if key.endswith("['key']['bias']")]
    assert len(noise) == 3  # encoder self-, decoder self- and cross-attention (1 layer each)
    for key in a:
        if key in noise:
            assert max(np.abs(a[key]).max(), np.abs(b[key]).max()) < 1e-2, key
        else:
            np.testing.assert_allclose(b[key], a[key], atol=2e-6, rtol=1e-5, err_msg=key)
    for tree_moment, flat_moment in zip(moments(trees), moments(flats), strict=True):
        np.testing.assert_allclose(flat_moment, tree_moment, atol=1e-7, rtol=1e-5)


def test_weight_decay_skips_the_masked_arrays():
    """Decay alone (zero gradients): the matrices shrink by lr * wd * p, the biases and
    layer-norm scales (ndim 1) stay, as optax.adamw with the same mask."""
    import jax.numpy as jnp
    import optax

    from training.step import flat_adamw

    params = {"kernel": jnp.full((2, 3), 2.0), "bias": jnp.full((3,), 2.0)}
    mask = lambda tree: jax.tree.map(lambda x: x.ndim > 1, tree)  # noqa: E731
    zeros = jax.tree.map(jnp.zeros_like, params)
    for make in (flat_adamw, optax.adamw):
        optimizer = make(0.5, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1, mask=mask)
        updates, _ = optimizer.update(zeros, optimizer.init(params), params)
        np.testing.assert_allclose(updates["kernel"], -0.5 * 0.1 * 2.0)
        np.testing.assert_array_equal(updates["bias"], 0.0)


def test_the_flat_state_holds_far_fewer_arrays():
    from configs import multi30k_de_en
    from training.step import create_train_state

    cfg = multi30k_de_en.get_config()  # the tiny recipe's model
    counts = {}
    for flat_optimizer in (False, True):
        cfg.train.flat_optimizer = flat_optimizer
        _, state = create_train_state(cfg, 8000, 8000)
        counts[flat_optimizer] = len(jax.tree.leaves(state))
    params = len(jax.tree.leaves(state["params"]))
    assert counts[False] == 3 * params + 4  # parameters, two moments each; counters
    assert counts[True] == params + 6  # parameters, two vectors; counters


def test_a_run_cannot_switch_layouts_on_resume():
    from configs import smoke
    from configs.resume import check_resume_config

    saved, new = smoke.get_config(), smoke.get_config()
    new.train.flat_optimizer = True
    with pytest.raises(UserError, match="train.flat_optimizer"):
        check_resume_config(saved, new, "runs/x", allowed=("train.flat_optimizer",))
    del saved.train["flat_optimizer"]  # a run saved before the key existed: trees
    check_resume_config(saved, smoke.get_config(), "runs/x")
    with pytest.raises(UserError, match="train.flat_optimizer"):
        check_resume_config(saved, new, "runs/x")


@pytest.mark.parametrize("flat_optimizer", [False, True])
def test_adam_eps_is_the_configs(flat_optimizer):
    """`train.adam_eps` is Adam's denominator floor: under a constant gradient g the
    bias-corrected moments are g and g^2, so an update is -lr * g / (|g| + eps), and eps = 1
    shrinks a gradient of 0.5 to a third. (The second update: warmup's first rate is 0.)"""
    import jax.numpy as jnp

    from configs import smoke
    from training.step import build_optimizer, learning_rate_schedule

    cfg = smoke.get_config()
    cfg.train.grad_clip = 0.0
    cfg.train.flat_optimizer = flat_optimizer
    cfg.train.schedule, cfg.train.warmup_steps = "constant", 0
    lr = float(learning_rate_schedule(cfg.train)(1))
    assert lr > 0
    params = {"kernel": jnp.ones((2, 3)), "bias": jnp.ones((3,))}
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    for eps, factor in ((1.0, 0.5 / 1.5), (1e-9, 1.0)):
        cfg.train.adam_eps = eps
        optimizer = build_optimizer(cfg.train)
        _, state = optimizer.update(grads, optimizer.init(params), params)
        updates, _ = optimizer.update(grads, state, params)
        decay = cfg.train.weight_decay * lr  # decoupled, on the kernel only
        np.testing.assert_allclose(updates["bias"], -lr * factor, rtol=1e-6)
        np.testing.assert_allclose(updates["kernel"], -lr * factor - decay, rtol=1e-6)
