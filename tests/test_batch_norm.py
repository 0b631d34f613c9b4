"""Batch normalisation in the CNN: batch statistics in training, running statistics in
inference, the statistics moved by the step (never by the optimizer), carried by every
reader of a run's parameters."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.errors import ConfigError
from jaxmnist.models import cnn, count_params
from jaxmnist.training.step import init_state, make_train_step

BN = cnn.CNNConfig(channels=(4, 8), hidden=(16,), batch_norm=True)


@pytest.fixture(scope="module")
def images():
    return jax.random.uniform(jax.random.key(1), (32, 28, 28))


def test_parameters_gain_a_scale_per_conv_and_statistics_that_are_not_counted():
    params = cnn.init(jax.random.key(0), BN)
    plain = cnn.init(jax.random.key(0), dataclasses.replace(BN, batch_norm=False))
    assert [sorted(layer) for layer in params["conv"]] == [["b", "scale", "w"]] * 2
    assert [s["mean"].shape for s in params["stats"]] == [(4,), (8,)]
    np.testing.assert_array_equal(params["stats"][1]["var"], np.ones(8))
    assert count_params(params) == count_params(plain) + 4 + 8  # the scales only


def test_training_normalises_by_the_batch_and_inference_by_the_running_statistics(images):
    params = cnn.init(jax.random.key(0), BN)
    x = cnn.conv.conv2d(images[..., None], params["conv"][0]["w"], "xla")
    layer = {**params["conv"][0], "scale": jnp.full((4,), 2.0), "b": jnp.full((4,), 0.5)}
    y, new = cnn._batch_norm(x, layer, params["stats"][0], train=True)
    np.testing.assert_allclose(y.mean(axis=(0, 1, 2)), 0.5, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=(0, 1, 2)), 2.0, rtol=1e-3)
    np.testing.assert_allclose(new["mean"], 0.1 * x.mean(axis=(0, 1, 2)), rtol=1e-5)
    np.testing.assert_allclose(new["var"], 0.9 + 0.1 * x.var(axis=(0, 1, 2)), rtol=1e-5)
    # With the batch's own statistics as the running ones, inference is the training pass.
    batch = {"mean": x.mean(axis=(0, 1, 2)), "var": x.var(axis=(0, 1, 2))}
    y_inf, none = cnn._batch_norm(x, layer, batch, train=False)
    assert none is None
    np.testing.assert_allclose(y_inf, y, rtol=1e-4, atol=1e-5)


def test_a_block_without_pooling_normalises_and_activates_its_whole_map(images):
    cfg = dataclasses.replace(BN, channels=(4, 4, 8), pool=(0, 1, 1))
    params = cnn.init(jax.random.key(0), cfg)
    stats = [
        {"mean": jnp.full(s["mean"].shape, 0.1), "var": jnp.full(s["var"].shape, 2.0)}
        for s in params["stats"]
    ]
    params = {**params, "stats": stats}
    x = images[..., None]
    for i, (layer, pooled) in enumerate(zip(params["conv"], (0, 1, 1), strict=True)):
        x = cnn.conv.conv2d(x, layer["w"], "xla")
        x = (x - 0.1) / jnp.sqrt(2.0 + cnn.BN_EPSILON) * layer["scale"] + layer["b"]
        x = jax.nn.relu(x)
        if pooled:
            x = x.reshape(x.shape[0], x.shape[1] // 2, 2, x.shape[2] // 2, 2, -1).max((2, 4))
        assert x.shape[1:3] == ((28, 28), (14, 14), (7, 7))[i]
    x = jax.nn.relu(x.reshape(32, -1) @ params["dense"][0]["w"] + params["dense"][0]["b"])
    want = x @ params["dense"][1]["w"] + params["dense"][1]["b"]
    np.testing.assert_allclose(cnn.apply(params, images, cfg), want, rtol=1e-4, atol=1e-4)
    _, moved = cnn.apply(params, images, cfg, train=True)
    assert len(moved) == 3  # every convolution's statistics move, pooled or not


def test_inference_does_not_depend_on_the_batch_training_does(images):
    params = cnn.init(jax.random.key(0), BN)
    full = cnn.apply(params, images, BN)
    np.testing.assert_array_equal(cnn.apply(params, images[:5], BN), full[:5])
    train_full, _ = cnn.apply(params, images, BN, train=True)
    train_part, _ = cnn.apply(params, images[:5], BN, train=True)
    assert not np.allclose(train_part, train_full[:5])


def test_the_step_moves_the_statistics_and_the_optimizer_leaves_them_alone(images):
    cfg = config_lib.apply_overrides(
        config_lib.get_preset("cnn"),
        {
            "model.channels": "4,8",
            "model.hidden": "16",
            "model.batch_norm": "true",
            "optimizer.name": "adamw",
            "optimizer.weight_decay": "0.5",
            "optimizer.lr": "0.1",
        },
    )
    optimizer = optim.make_optimizer(cfg.optimizer, 10)
    state = init_state(jax.random.key(0), cfg, optimizer, (28, 28), 10)
    u8 = (images * 255).astype(jnp.uint8)
    labels = jnp.arange(32) % 10
    new, _ = jax.jit(make_train_step(cfg, optimizer))(state, u8, labels)
    _, expected = cnn.apply(state.params, u8.astype(jnp.float32) / 255.0, cfg.model, train=True)
    for got, want in zip(jax.tree.leaves(new.params["stats"]), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)  # no decay, no Adam step
    assert not np.allclose(new.params["conv"][0]["scale"], 1.0)  # the scales do train


def test_the_mlp_refuses_batch_norm():
    # The MLP's config has no such field: it is refused as the override is read.
    with pytest.raises(ConfigError, match="'model.batch_norm' for the mlp model .a field of cnn"):
        config_lib.apply_overrides(config_lib.Config(), {"model.batch_norm": "true"})


def test_a_batch_norm_cnn_trains_and_its_saved_run_evaluates_the_same(
    tiny_cnn_run, tiny_registered, capsys
):
    from jaxmnist.cli import main

    summary = json.loads((tiny_cnn_run / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.5 and len(summary["seeds"]) == 2
    with np.load(tiny_cnn_run / "params.npz") as saved:
        means = [saved[k] for k in saved.files if "stats" in k and "mean" in k]
    assert means and all(np.abs(m).max() > 0 for m in means)  # moved from their zeros
    assert main(["eval", str(tiny_cnn_run), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["test_accuracy"] == summary["test_accuracy"]


def test_the_written_out_gradient_equals_autodiff_of_the_formula():
    x = jax.random.normal(jax.random.key(2), (8, 6, 6, 5)) * 3 + 1
    scale, shift = jnp.linspace(0.5, 2, 5), jnp.linspace(-1, 1, 5)
    weights = jax.random.normal(jax.random.key(3), x.shape)

    def formula(x, scale, shift):
        mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
        return (x - mean) / jnp.sqrt(var + cnn.BN_EPSILON) * scale + shift

    def loss(f):
        return lambda *a: jnp.sum(jnp.tanh(f(*a)) * weights)

    y, mean, var = cnn._normalise(x, scale, shift)
    np.testing.assert_allclose(y, formula(x, scale, shift), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, x.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, x.var(axis=(0, 1, 2)), rtol=1e-5)
    ours = jax.grad(loss(lambda *a: cnn._normalise(*a)[0]), argnums=(0, 1, 2))(x, scale, shift)
    auto = jax.grad(loss(formula), argnums=(0, 1, 2))(x, scale, shift)
    for a, b in zip(ours, auto, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
