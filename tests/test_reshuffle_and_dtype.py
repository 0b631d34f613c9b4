"""Two promises of the training loop, checked through what a run writes.

Every epoch draws a fresh shuffle from its own key (seed s: `init_key, shuffle_key =
split(key(s))`, epoch e uses `split(shuffle_key, epochs)[e]`), for one model and for a
vmapped population; and `model.dtype=bfloat16` really runs the matmuls in bfloat16
(accumulating in float32). The reference runs below write the key scheme out by hand
rather than importing it.
"""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.models import apply_uint8
from jaxmnist.train import train_and_evaluate
from jaxmnist.training import step as core  # the step, its state and the epoch's shuffle


def small_cfg(dtype="float32", optimizer=None, **train):
    cfg = config_lib.get_preset("tpu101")
    train = {"batch_size": 32, "epochs": 3, "eval_batch_size": 64, "eval_train": False, **train}
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, hidden=(32,), dtype=dtype),
        optimizer=dataclasses.replace(cfg.optimizer, **(optimizer or {})),
        train=dataclasses.replace(cfg.train, **train),
        compile_cache=False,
    )


def scheme_keys(seed: int, num_epochs: int):
    """(init_key, epoch_keys (num_epochs,)) as the run's key scheme defines them."""
    init_key, shuffle_key = jax.random.split(jax.random.key(seed))
    return init_key, jax.random.split(shuffle_key, num_epochs)


@functools.cache
def reference_step(cfg, total_steps: int):
    """(optimizer, jitted train step) of `cfg`, compiled once for every seed."""
    optimizer = optim.make_optimizer(cfg.optimizer, total_steps)
    return optimizer, jax.jit(core.make_train_step(cfg, optimizer))


def reference_run(cfg, dataset, seed: int):
    """One seed trained by a plain Python loop over jitted steps, each epoch shuffled
    with its own key. Returns (per-step losses float (steps,), {param path: array})."""
    n = len(dataset.train_labels)
    plan = config_lib.plan_steps(cfg.train, n)
    optimizer, step = reference_step(cfg, plan.total_steps)
    init_key, epoch_keys = scheme_keys(seed, len(plan.epoch_steps))
    num_classes = len(dataset.spec.class_names)
    state = core.init_state(init_key, cfg, optimizer, dataset.train_images.shape[1:], num_classes)
    images = dataset.train_images.reshape(n, -1)
    labels = dataset.train_labels.astype(np.int32)
    losses = []
    for key, num_steps in zip(epoch_keys, plan.epoch_steps):
        for idx in np.asarray(core.epoch_indices(key, n, cfg.train.batch_size, num_steps)):
            state, (loss, _) = step(state, images[idx], labels[idx])
            losses.append(loss)
    params = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(jax.device_get(state.params))
    }
    return np.asarray(jax.device_get(losses), np.float64), params


def run_step_losses(run) -> np.ndarray:
    """step_loss.csv's losses, checking its steps are 1, 2, ... in order."""
    table = np.loadtxt(run / "step_loss.csv", delimiter=",", skiprows=1, ndmin=2)
    np.testing.assert_array_equal(table[:, 0], np.arange(1, len(table) + 1))
    return table[:, 1]


def run_params(run) -> dict:
    with np.load(run / "params.npz") as f:
        return {k: f[k] for k in f.files}


# --- a fresh shuffle every epoch ---------------------------------------------------


def test_epoch_keys_give_different_permutations():
    n, batch, steps = 640, 32, 20
    _, keys = scheme_keys(3, 3)
    perms = [np.asarray(core.epoch_indices(k, n, batch, steps)).ravel() for k in keys]
    for p in perms:
        np.testing.assert_array_equal(np.sort(p), np.arange(n))  # every example once
    for a, b in itertools.combinations(perms, 2):
        assert not np.array_equal(a, b)


def test_run_follows_its_epoch_keys_step_by_step(tiny_dataset, tmp_path):
    cfg = small_cfg(seed=3, epochs=3)
    train_and_evaluate(cfg, tmp_path / "run", dataset=tiny_dataset)
    losses, params = reference_run(cfg, tiny_dataset, seed=3)
    assert len(losses) == 3 * (640 // 32)
    # step_loss.csv keeps 6 significant digits.
    np.testing.assert_allclose(run_step_losses(tmp_path / "run"), losses, rtol=2e-5, atol=1e-6)
    saved = run_params(tmp_path / "run")
    assert saved.keys() == params.keys()
    for name, value in params.items():
        np.testing.assert_allclose(saved[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_vmapped_seeds_follow_their_epoch_keys(tiny_dataset, tmp_path):
    cfg = small_cfg(seed=5, seeds=2, epochs=2)
    summary = train_and_evaluate(cfg, tmp_path / "run", dataset=tiny_dataset)
    assert summary["seeds"] == [5, 6]
    refs = [reference_run(cfg, tiny_dataset, seed=s) for s in (5, 6)]
    # The file holds the mean over the seeds of each step's loss.
    mean_losses = np.mean([losses for losses, _ in refs], axis=0)
    np.testing.assert_allclose(run_step_losses(tmp_path / "run"), mean_losses, rtol=1e-4)
    saved = run_params(tmp_path / "run")
    for i, (_, params) in enumerate(refs):
        for name, value in params.items():
            np.testing.assert_allclose(
                saved[name][i], value, rtol=1e-4, atol=1e-5, err_msg=f"seed {5 + i} {name}"
            )


def test_frozen_model_sees_every_example_each_epoch_in_a_new_order(tiny_dataset, tmp_path):
    # With a learning rate far below float32 resolution the parameters never change,
    # so a step's loss depends only on its batch: each epoch's mean is the same (every
    # example once), but the sequence of batch losses differs from epoch to epoch.
    cfg = small_cfg(optimizer={"name": "sgd", "lr": 1e-30, "momentum": 0.0}, epochs=3)
    train_and_evaluate(cfg, tmp_path / "run", dataset=tiny_dataset)
    epochs = run_step_losses(tmp_path / "run").reshape(3, 640 // 32)
    np.testing.assert_allclose(epochs.mean(1), epochs[0].mean(), rtol=1e-5)
    for a, b in itertools.combinations(epochs, 2):
        assert not np.allclose(a, b, rtol=1e-3)


# --- the compute dtype -------------------------------------------------------------


def dot_dtypes(fn, *args) -> tuple[list, set]:
    """The dtype of every dot_general operand in `fn`'s jaxpr, nested jaxprs included,
    and the set of the dots' result dtypes."""
    dots = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                dots.append(eqn)
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    operands = [v.aval.dtype for eqn in dots for v in eqn.invars]
    return operands, {eqn.outvars[0].aval.dtype for eqn in dots}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmuls_run_in_the_configured_dtype(dtype):
    cfg = small_cfg(dtype=dtype)
    optimizer = optim.make_optimizer(cfg.optimizer, 10)
    state = core.init_state(jax.random.key(0), cfg, optimizer, (28, 28), 10)
    images = jnp.zeros((8, 784), jnp.uint8)
    labels = jnp.zeros((8,), jnp.int32)

    forward, results = dot_dtypes(lambda p, x: apply_uint8(p, x, cfg.model), state.params, images)
    assert len(forward) == 2 * 2  # two layers, two operands each
    assert set(forward) == {jnp.dtype(dtype)}
    assert results == {jnp.dtype(jnp.float32)}  # bfloat16 accumulates in float32

    step, results = dot_dtypes(core.make_train_step(cfg, optimizer), state, images, labels)
    assert len(step) > len(forward)  # the backward pass's matmuls are there too
    assert set(step) == {jnp.dtype(dtype)}
    assert results == {jnp.dtype(jnp.float32)}


def test_bfloat16_logits_are_close_to_float32_but_not_equal(tiny_dataset):
    cfg = small_cfg()
    optimizer = optim.make_optimizer(cfg.optimizer, 10)
    params = core.init_state(jax.random.key(0), cfg, optimizer, (28, 28), 10).params
    images = jnp.asarray(tiny_dataset.test_images[:64])
    f32 = np.asarray(apply_uint8(params, images, cfg.model))
    bf16 = np.asarray(apply_uint8(params, images, small_cfg(dtype="bfloat16").model))
    assert f32.dtype == bf16.dtype == np.float32
    assert not np.array_equal(f32, bf16)
    # bfloat16 keeps 8 significant bits: errors of a fraction of a percent of the logits.
    scale = np.abs(f32).max()
    np.testing.assert_allclose(bf16, f32, atol=0.05 * scale)
    assert np.abs(bf16 - f32).max() > 1e-4 * scale
