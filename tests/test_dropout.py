"""Dropout: training only, its own draw per step and per member, reproducible from the
seed, and never in evaluation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist.errors import ConfigError
from jaxmnist.models import get_model, layers, model_config
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members


def test_inverted_dropout_zeroes_at_the_rate_and_rescales_the_rest():
    x = jnp.full((200, 500), 2.0, jnp.float32)
    out = np.asarray(layers.dropout(jax.random.key(0), x, 0.25, 0))
    assert set(np.unique(out).tolist()) == {0.0, float(np.float32(2.0) / np.float32(0.75))}
    assert (out == 0).mean() == pytest.approx(0.25, abs=0.01)
    other_layer = np.asarray(layers.dropout(jax.random.key(0), x, 0.25, 1))
    assert not np.array_equal(out, other_layer)  # each layer its own mask
    np.testing.assert_array_equal(layers.dropout(None, x, 0.25, 0), x)
    np.testing.assert_array_equal(layers.dropout(jax.random.key(0), x, 0.0, 0), x)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_a_model_drops_only_in_training(name):
    own = {"cnn": {"channels": (4, 8)}}.get(name, {})  # the family's own fields
    cfg = model_config(name, hidden=(32,), dropout=0.5, **own)
    model = get_model(name)
    params = model.init(jax.random.key(0), cfg)
    images = jax.random.uniform(jax.random.key(1), (16, 28, 28))
    plain = model.apply(params, images, dataclasses.replace(cfg, dropout=0.0))
    np.testing.assert_array_equal(model.apply(params, images, cfg), plain)  # inference
    # A key alone does not make a pass a training one.
    np.testing.assert_array_equal(model.apply(params, images, cfg, key=jax.random.key(2)), plain)

    def train(k):
        logits, stats = model.apply(params, images, cfg, key=jax.random.key(k), train=True)
        assert stats is None  # no batch norm here
        return logits

    a = train(2)
    np.testing.assert_array_equal(a, train(2))
    assert not np.allclose(a, plain) and not np.allclose(a, train(3))


def cfg_with(dropout: float, seeds: int = 1, seed: int = 3):
    cfg = config_lib.get_preset("tpu101")
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, hidden=(64,), dropout=dropout),
        train=dataclasses.replace(
            cfg.train, batch_size=32, epochs=2, seeds=seeds, eval_batch_size=64, seed=seed
        ),
        compile_cache=False,
    )


def train(cfg, dataset):
    r = train_population(cfg, seed_members(cfg), dataset)
    return r, [np.asarray(x) for x in jax.tree.leaves(r.population.params(r.states))]


@pytest.mark.slow
def test_training_with_dropout_is_reproducible_and_evaluation_is_deterministic(tiny_dataset):
    a, pa = train(cfg_with(0.3), tiny_dataset)
    b, pb = train(cfg_with(0.3), tiny_dataset)
    _, plain = train(cfg_with(0.0), tiny_dataset)
    for x, y in zip(pa, pb, strict=True):
        np.testing.assert_array_equal(x, y)
    fields = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")
    assert [[r[f] for f in fields] for r in a.records] == [
        [r[f] for f in fields] for r in b.records
    ]
    assert not all(np.array_equal(x, y) for x, y in zip(pa, plain, strict=True))


def test_each_member_drops_its_own_units_as_if_alone(tiny_dataset):
    _, pair = train(cfg_with(0.3, seeds=2), tiny_dataset)
    _, alone = train(cfg_with(0.3, seed=4), tiny_dataset)
    for x, y in zip(pair, alone, strict=True):
        np.testing.assert_allclose(x[1], y[0], rtol=1e-4, atol=1e-5)
        assert not np.allclose(x[0], x[1])


@pytest.mark.parametrize("rate", ["1", "-0.1", "nan"])
def test_a_rate_outside_zero_to_one_is_a_config_error(rate):
    cfg = config_lib.apply_overrides(config_lib.Config(), {"model.dropout": rate})
    with pytest.raises(ConfigError, match="model.dropout: a rate in"):
        config_lib.validate(cfg)
