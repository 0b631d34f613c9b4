"""The model registry and the CNN: a family is one registry entry; pinned shapes and counts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist import models
from jaxmnist.errors import ConfigError
from jaxmnist.models import cnn

REFERENCE = config_lib.ModelConfig(name="cnn", channels=(16, 32), kernel_size=3, hidden=(128,))


def _tiny_family(seen: list) -> models.Model:
    """A throwaway family: mean brightness times a learned vector; rejects hidden=(7,)."""

    def init(key, cfg, input_shape=(28, 28), num_classes=10):
        return {"v": jnp.arange(num_classes, dtype=jnp.float32)}

    def apply(params, images, cfg, key=None):  # no dropout: the key goes unused
        seen.append(images.shape)
        return images.mean(axis=(1, 2))[:, None] * params["v"]

    def validate(cfg):
        if cfg.hidden == (7,):
            raise ConfigError("model.hidden: the tiny family refuses 7")

    return models.Model(init, apply, lambda cfg, shape, n: 3, validate)


def test_a_registered_family_is_a_config_choice_and_runs_through_apply_uint8(monkeypatch):
    seen = []
    monkeypatch.setitem(models.MODELS, "tiny_linear", _tiny_family(seen))
    cfg = config_lib.apply_overrides(config_lib.Config(), {"model.name": "tiny_linear"})
    config_lib.validate(cfg)  # accepted: the choices come from the registry
    params = models.get_model("tiny_linear").init(jax.random.key(0), cfg.model)
    images = np.full((4, 28, 28), 255, np.uint8)
    images[1] = 0
    logits = models.apply_uint8(params, jnp.asarray(images), cfg.model)
    assert seen == [(4, 28, 28)]  # (B, H, W) reaches the family unflattened
    np.testing.assert_allclose(logits[0], np.arange(10))  # 255 became 1.0
    np.testing.assert_allclose(logits[1], 0)
    # Model fields are validated by the family that reads them, and only by it.
    with pytest.raises(ConfigError, match="tiny family refuses 7"):
        config_lib.validate(dataclasses.replace(cfg, model=replace_model(cfg, hidden=(7,))))
    config_lib.validate(dataclasses.replace(cfg, model=replace_model(cfg, hidden=(-1,))))


def replace_model(cfg, **fields):
    return dataclasses.replace(cfg.model, **fields)


def test_unknown_model_lists_the_registry():
    cfg = config_lib.apply_overrides(config_lib.Config(), {"model.name": "resnet"})
    with pytest.raises(ConfigError, match="unknown model 'resnet'; choose from: mlp, cnn"):
        config_lib.validate(cfg)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.hidden": "0"}, "model.hidden: sizes must be positive"),
        ({"model.name": "cnn", "model.hidden": "0"}, "model.hidden: sizes must be positive"),
        ({"model.name": "cnn", "model.channels": "16,0"}, "model.channels"),
        ({"model.name": "cnn", "model.channels": ""}, "model.channels"),
        ({"model.name": "cnn", "model.kernel_size": "4"}, "model.kernel_size: a positive odd"),
        ({"model.name": "cnn", "model.conv_impl": "fft"}, "unknown model.conv_impl 'fft'"),
    ],
)
def test_family_fields_are_checked_with_one_line(overrides, message):
    cfg = config_lib.apply_overrides(config_lib.Config(), overrides)
    with pytest.raises(ConfigError, match=message) as err:
        config_lib.validate(cfg)
    assert "\n" not in str(err.value)


def test_cnn_fields_do_not_constrain_the_mlp():
    cfg = config_lib.apply_overrides(config_lib.Config(), {"model.kernel_size": "4"})
    config_lib.validate(cfg)  # the MLP reads no kernel size


def _init(cfg, input_shape=(28, 28)):
    return jax.jit(cnn.init, static_argnums=(1, 2, 3))(jax.random.key(0), cfg, input_shape, 10)


@pytest.fixture(scope="module")
def reference_params():
    return _init(REFERENCE)


def _apply(params, images, cfg):
    return jax.jit(cnn.apply, static_argnums=2)(params, images, cfg)


def test_reference_cnn_shapes_and_parameter_count(reference_params):
    params = reference_params
    shapes = jax.tree.map(lambda x: x.shape, params)
    assert shapes == {
        "conv": [{"w": (3, 3, 1, 16), "b": (16,)}, {"w": (3, 3, 16, 32), "b": (32,)}],
        "dense": [{"w": (1568, 128), "b": (128,)}, {"w": (128, 10), "b": (10,)}],
    }
    assert models.count_params(params) == 206_922
    # He init: weight std sqrt(2 / fan_in), fan_in = k*k*C_in for a kernel.
    assert abs(float(params["conv"][1]["w"].std()) - np.sqrt(2 / 144)) < 0.01
    logits = _apply(params, jnp.zeros((5, 28, 28)), REFERENCE)
    assert logits.shape == (5, 10) and logits.dtype == jnp.float32


def test_cnn_odd_sizes_pool_by_floor_and_too_many_blocks_is_a_config_error():
    cfg = dataclasses.replace(REFERENCE, channels=(4, 4, 4), hidden=())
    params = jax.eval_shape(lambda: cnn.init(jax.random.key(0), cfg, (28, 28), 10))
    assert params["dense"][0]["w"].shape == (3 * 3 * 4, 10)  # 28 -> 14 -> 7 -> 3
    logits = jax.eval_shape(lambda p: cnn.apply(p, jnp.zeros((2, 28, 28)), cfg), params)
    assert logits.shape == (2, 10)
    with pytest.raises(ConfigError, match="5 conv blocks halve 28x28 images to nothing"):
        cnn.init(jax.random.key(0), dataclasses.replace(cfg, channels=(4,) * 5), (28, 28), 10)


def test_cnn_computes_in_bfloat16_and_returns_float32_logits(reference_params):
    cfg = dataclasses.replace(REFERENCE, dtype="bfloat16")
    params = reference_params
    images = jnp.asarray(np.random.default_rng(1).uniform(size=(3, 28, 28)), jnp.float32)
    text = jax.jit(cnn.apply, static_argnums=2).lower(params, images, cfg).as_text()
    assert "bf16" in text
    low, high = _apply(params, images, cfg), _apply(params, images, REFERENCE)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, high, atol=0.1 * float(jnp.abs(high).max()))


def test_cnn_flops_per_example_is_pinned():
    # MACs: conv1 28*28*9*16, conv2 14*14*9*16*32, dense 1568*128 and 128*10.
    macs = [112_896, 903_168, 200_704, 1_280]
    expected = 4 * sum(macs) + 2 * sum(macs[1:])  # no input gradient for the first layer
    assert cnn.flops_per_example(REFERENCE, (28, 28), 10) == expected == 7_082_496
    assert models.get_model("cnn").flops_per_example is cnn.flops_per_example


def test_cnn_apply_refuses_flattened_images(reference_params):
    with pytest.raises(ValueError, match=r"images \(B, H, W\)"):
        cnn.apply(reference_params, jnp.zeros((2, 784)), REFERENCE)


@pytest.mark.parametrize(
    "preset, num_params", [("cnn", 206_922), ("fashion_cnn", 206_922), ("speedrun", 206_922)]
)
def test_cnn_presets_validate_and_have_pinned_parameter_counts(preset, num_params):
    cfg = config_lib.get_preset(preset)
    config_lib.validate(cfg)
    assert cfg.model.name == "cnn" and cfg.data.augment
    params = jax.eval_shape(lambda: cnn.init(jax.random.key(0), cfg.model, (28, 28), 10))
    assert models.count_params(params) == num_params
