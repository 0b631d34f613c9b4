"""The model registry and the CNN: a family is one registry entry; pinned shapes and counts."""

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from jaxmnist import config as config_lib
from jaxmnist import models, optim
from jaxmnist.errors import ConfigError
from jaxmnist.models import cnn, conv, mlp, onednn
from jaxmnist.models.family import ModelConfig
from jaxmnist.models.layers import ACTIVATIONS, matmul

REFERENCE = cnn.CNNConfig(channels=(16, 32), kernel_size=(3,), hidden=(128,))


@dataclass(frozen=True)
class TinyConfig(ModelConfig):
    name: str = "tiny_linear"
    hidden: tuple[int, ...] = (256,)  # read by nothing but its validate


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

    return models.Model(init, apply, lambda cfg, shape, n: 3, validate, TinyConfig, str)


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
    with pytest.raises(ConfigError, match="unknown model 'resnet'; choose from: mlp, cnn"):
        config_lib.apply_overrides(config_lib.Config(), {"model.name": "resnet"})
    wrong = dataclasses.replace(config_lib.Config(), model=mlp.MLPConfig(name="resnet"))
    with pytest.raises(ConfigError, match="unknown model 'resnet'; choose from: mlp, cnn"):
        config_lib.validate(wrong)
    # A family's name on another family's dataclass is a caller's bug, said in one line.
    mixed = dataclasses.replace(config_lib.Config(), model=mlp.MLPConfig(name="cnn"))
    with pytest.raises(ConfigError, match="a MLPConfig is not the cnn model's config"):
        config_lib.validate(mixed)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.hidden": "0"}, "model.hidden: sizes must be positive"),
        ({"model.name": "cnn", "model.hidden": "0"}, "model.hidden: sizes must be positive"),
        ({"model.name": "cnn", "model.channels": "16,0"}, "model.channels"),
        ({"model.name": "cnn", "model.channels": ""}, "model.channels"),
        ({"model.name": "cnn", "model.kernel_size": "4"}, "model.kernel_size: positive odd sizes"),
        ({"model.name": "cnn", "model.conv_impl": "fft"}, "unknown model.conv_impl 'fft'"),
        ({"model.name": "cnn", "model.padding": "full"}, "unknown model.padding 'full'"),
        ({"model.name": "cnn", "model.kernel_size": "5,3,3"}, r"one per conv block \(2\)"),
        (
            {"model.name": "cnn", "model.padding": "valid", "model.kernel_size": "0"},
            "model.kernel_size: positive sizes",
        ),
        ({"optimizer.b1": "1"}, r"optimizer.b1 must be in \[0, 1\)"),
        ({"optimizer.b2": "-0.1"}, r"optimizer.b2 must be in \[0, 1\)"),
    ],
)
def test_family_fields_are_checked_with_one_line(overrides, message):
    cfg = config_lib.apply_overrides(config_lib.Config(), overrides)
    with pytest.raises(ConfigError, match=message) as err:
        config_lib.validate(cfg)
    assert "\n" not in str(err.value)


def test_cnn_fields_are_not_the_mlps():
    # The MLP has no kernel size: naming one is an error, not a value silently ignored.
    with pytest.raises(
        ConfigError, match=r"'model.kernel_size' for the mlp model \(a field of cnn\)"
    ):
        config_lib.apply_overrides(config_lib.Config(), {"model.kernel_size": "4"})
    assert "model.kernel_size" not in config_lib.field_names(config_lib.Config())
    assert "model.kernel_size" in config_lib.field_names(config_lib.get_preset("cnn"))


def test_the_registry_entries_describe_port_and_record_their_family():
    tpu101, speedrun = (config_lib.get_preset(p).model for p in ("tpu101", "speedrun"))
    codelab = config_lib.get_preset("codelab").model
    mlp_entry, cnn_entry = models.get_model("mlp"), models.get_model("cnn")
    assert mlp_entry.describe(codelab) == "mlp in → 256 → 128 → out"
    assert cnn_entry.describe(REFERENCE) == "cnn in → conv 3×3×16 → conv 3×3×32 → 128 → out"
    bn = dataclasses.replace(speedrun, batch_norm=True)
    assert cnn_entry.describe(bn) == (
        "cnn in → conv 5×5×24 → conv 3×3×32 → 256 → out, valid padding, batch norm"
    )
    # Export traces the portable formulation; the MLP has nothing to swap.
    assert mlp_entry.portable(tpu101) == tpu101
    onednn_cfg = dataclasses.replace(REFERENCE, conv_impl="onednn")
    ported = cnn_entry.portable(onednn_cfg)
    assert ported.conv_impl == conv.portable("onednn") != "onednn"
    assert dataclasses.replace(ported, conv_impl="onednn") == onednn_cfg  # nothing else moved
    # environment.json: the CNN's resolved convolution, nothing for the MLP.
    assert mlp_entry.run_facts(tpu101) == {}
    assert cnn_entry.run_facts(REFERENCE) == {"conv_impl": conv.resolve("auto")}
    assert (mlp_entry.first_kernel, cnn_entry.first_kernel) == (None, "['conv'][0]['w']")
    assert (mlp_entry.config, cnn_entry.config) == (mlp.MLPConfig, cnn.CNNConfig)


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
    with pytest.raises(ConfigError, match="5 conv blocks shrink 28x28 images to nothing"):
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


# The published 1-epoch MNIST net: conv 5x5 1->24 and 3x3 24->32, both unpadded, dense 256.
VALID = dataclasses.replace(
    REFERENCE, channels=(24, 32), kernel_size=(5, 3), padding="valid", hidden=(256,)
)


# VGG-style: two convolutions between pools (the second block keeps its map's size).
VGG = dataclasses.replace(REFERENCE, channels=(8, 8, 16), pool=(1, 0, 1), hidden=(32,))


def _reference_forward(params, images, cfg):
    """The CNN as textbooks write it: lax's convolution, bias, activation, then pooling
    (where the block has it)."""
    x = images[..., None]
    pools = cfg.pool * len(cfg.channels) if len(cfg.pool) == 1 else cfg.pool
    for layer, pooled in zip(params["conv"], pools, strict=True):
        x = lax.conv_general_dilated(
            x, layer["w"], (1, 1), cfg.padding.upper(), dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        x = ACTIVATIONS[cfg.activation](x + layer["b"])
        if pooled:
            x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    x = x.reshape(x.shape[0], -1)
    for i, layer in enumerate(params["dense"]):
        x = x @ layer["w"] + layer["b"]
        x = ACTIVATIONS[cfg.activation](x) if i < len(params["dense"]) - 1 else x
    return x


@pytest.mark.parametrize("impl", ["im2col", "onednn"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("cfg", [REFERENCE, VALID, VGG], ids=["same", "valid-5-3", "vgg"])
def test_cnn_equals_the_textbook_order_of_its_operations(cfg, activation, impl):
    # With ReLU the block pools before the bias and activation (they commute); with GELU,
    # which dips below zero, it must not. Either way the function is the textbook one.
    # Beside oneDNN's convolution, a block with ReLU pools, adds and rectifies in one call.
    if impl == "onednn" and not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    cfg = dataclasses.replace(cfg, activation=activation, conv_impl=impl)
    params = _init(cfg)
    params = jax.tree.map(  # nonzero biases, so their place in the block matters; centred,
        # so that maps of positive inputs still have negative values for the activation
        lambda x: (
            np.asarray(x) + (0.05 * np.arange(x.size, dtype=x.dtype).reshape(x.shape) % 0.3 - 0.15)
        ),
        params,
    )
    images = jnp.asarray(np.random.default_rng(3).uniform(size=(4, 28, 28)), jnp.float32)
    got, want = (
        _apply(params, images, cfg),
        jax.jit(_reference_forward, static_argnums=2)(params, images, cfg),
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.abs(want).max()))
    text = jax.jit(cnn.apply, static_argnums=2).lower(params, images, cfg).as_text()
    # Custom calls per kind: a convolution for each block, a pooling for each pooled one.
    convs = len(cfg.channels) * (impl == "onednn")
    pooled = (len(cfg.channels) - cfg.pool.count(0)) * (impl == "onednn")
    fused = pooled * (activation == "relu")
    assert text.count("jaxmnist_onednn_conv_forward") == convs
    assert text.count("jaxmnist_onednn_pool_bias_relu") == fused
    assert text.count("jaxmnist_onednn_pool_forward") == pooled - fused
    # Training: the same, the pooling writing its workspace for the gradient.
    step = jax.jit(jax.grad(lambda p: cnn.apply(p, images, cfg, train=True)[0].sum()))
    text = step.lower(params).as_text()
    assert text.count("jaxmnist_onednn_conv_forward") == convs
    assert text.count("jaxmnist_onednn_pool_bias_relu_forward") == fused
    assert text.count("jaxmnist_onednn_pool_backward") == pooled
    if impl == "onednn":
        # Its forward pass rounds differently: a near-tie in a pooling window can go the
        # other way and send a gradient elsewhere (test_conv checks its gradients).
        return
    grad = jax.jit(jax.grad(lambda p: _apply(p, images, cfg).sum()))(params)
    want_grad = jax.jit(jax.grad(lambda p: _reference_forward(p, images, cfg).sum()))(params)
    for g, w in zip(jax.tree.leaves(grad), jax.tree.leaves(want_grad), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * float(jnp.abs(w).max()))


def test_valid_padding_and_kernel_sizes_per_block_shape_the_network():
    params = jax.eval_shape(lambda: cnn.init(jax.random.key(0), VALID, (28, 28), 10))
    shapes = jax.tree.map(lambda x: x.shape, params)
    assert shapes == {  # 28 -conv5-> 24 -pool-> 12 -conv3-> 10 -pool-> 5: 5*5*32 = 800
        "conv": [{"w": (5, 5, 1, 24), "b": (24,)}, {"w": (3, 3, 24, 32), "b": (32,)}],
        "dense": [{"w": (800, 256), "b": (256,)}, {"w": (256, 10), "b": (10,)}],
    }
    assert models.count_params(params) == 215_194
    macs = [24 * 24 * 25 * 24, 10 * 10 * 9 * 24 * 32, 800 * 256, 256 * 10]
    assert cnn.flops_per_example(VALID, (28, 28), 10) == 4 * sum(macs) + 2 * sum(macs[1:])
    even = dataclasses.replace(VALID, kernel_size=(4,))  # valid padding takes even kernels
    config_lib.validate(dataclasses.replace(config_lib.Config(), model=even))
    too_big = dataclasses.replace(VALID, kernel_size=(13,))  # 28 -> 16 -> 8 -> -4
    with pytest.raises(ConfigError, match="smaller kernels"):
        cnn.init(jax.random.key(0), too_big, (28, 28), 10)


def test_blocks_without_pooling_keep_their_map_size():
    params = jax.eval_shape(lambda: cnn.init(jax.random.key(0), VGG, (28, 28), 10))
    shapes = jax.tree.map(lambda x: x.shape, params)
    assert shapes == {  # 28 -pool-> 14 -(no pool)-> 14 -pool-> 7: 7*7*16 = 784
        "conv": [
            {"w": (3, 3, 1, 8), "b": (8,)},
            {"w": (3, 3, 8, 8), "b": (8,)},
            {"w": (3, 3, 8, 16), "b": (16,)},
        ],
        "dense": [{"w": (784, 32), "b": (32,)}, {"w": (32, 10), "b": (10,)}],
    }
    macs = [28 * 28 * 9 * 8, 14 * 14 * 9 * 8 * 8, 14 * 14 * 9 * 8 * 16, 784 * 32, 32 * 10]
    assert cnn.flops_per_example(VGG, (28, 28), 10) == 4 * sum(macs) + 2 * sum(macs[1:])
    assert cnn.describe(VGG) == (
        "cnn in → conv 3×3×8 → pool → conv 3×3×8 → conv 3×3×16 → pool → 32 → out"
    )
    assert "pool" not in cnn.describe(REFERENCE)  # every block pools: said once, in the docs
    # One flag for every block: 0 pools nowhere (28 * 28 * 16 features).
    flat = dataclasses.replace(VGG, pool=(0,))
    assert cnn.init(jax.random.key(0), flat)["dense"][0]["w"].shape == (28 * 28 * 16, 32)
    for bad in ((1, 0), (1, 2, 1)):
        with pytest.raises(ConfigError, match=r"model.pool: 1 \(pool\) or 0"):
            cnn.validate(dataclasses.replace(VGG, pool=bad))
    cfg = config_lib.apply_overrides(
        config_lib.Config(), {"model.name": "cnn", "model.pool": "1,0"}
    )
    assert cfg.model.pool == (1, 0)  # the command line's form; two blocks by default
    config_lib.validate(cfg)


def _moved(images: np.ndarray, down: int, right: int) -> np.ndarray:
    """The images moved `down` rows and `right` columns (either negative), zeros moved in."""
    out = np.zeros_like(images)
    h, w = images.shape[1:3]
    rows, cols = slice(max(down, 0), h + min(down, 0)), slice(max(right, 0), w + min(right, 0))
    src = slice(max(-down, 0), h - max(down, 0)), slice(max(-right, 0), w - max(right, 0))
    out[:, rows, cols] = images[:, src[0], src[1]]
    return out


@pytest.mark.parametrize("shape", [(5, 28, 28), (5, 28, 28, 3)], ids=["grey", "colour"])
def test_tta_shift_predicts_the_mean_probability_of_five_moved_views(shape):
    cfg = dataclasses.replace(REFERENCE, hidden=(16,))
    images = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    params = _init(cfg, shape[1:])
    plain = jax.jit(models.apply_uint8, static_argnums=2)
    assert models.apply_uint8(params, images, dataclasses.replace(cfg, tta_shift=0)).shape == (
        5,
        10,
    )
    for n in (1, 2):
        views = [_moved(images, dy, dx) for dy, dx in ((0, 0), (n, 0), (-n, 0), (0, n), (0, -n))]
        want = np.mean([jax.nn.softmax(plain(params, v, cfg)) for v in views], axis=0)
        got = plain(params, images, dataclasses.replace(cfg, tta_shift=n))
        np.testing.assert_allclose(jax.nn.softmax(got), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.exp(got).sum(-1), 1, rtol=1e-5)  # log-probabilities
    with pytest.raises(ConfigError, match=r"model.tta_shift: 0 \(none\) to 4 pixels, got 5"):
        config_lib.validate(
            config_lib.apply_overrides(config_lib.Config(), {"model.tta_shift": "5"})
        )


def test_adam_decay_rates_reach_optax_and_leave_the_state_shape_alone():
    base = config_lib.OptimizerConfig(name="adam", lr=1e-2)
    tuned = dataclasses.replace(base, b1=0.7, b2=0.9)
    params = {"w": jnp.asarray([1.0, -2.0, 3.0])}
    grads = [{"w": jnp.asarray(g)} for g in ([0.5, -1.0, 2.0], [0.1, 0.3, -0.2])]

    def run(opt):
        state = opt.init(params)
        for g in grads:
            updates, state = opt.update(g, state, params)
        return updates, state

    got, state = run(optim.make_optimizer(tuned, 10))
    want, _ = run(optax.adam(1e-2, b1=0.7, b2=0.9))
    np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)
    default, default_state = run(optim.make_optimizer(base, 10))
    assert not np.allclose(default["w"], got["w"])  # the rates changed the update
    assert jax.tree.structure(state) == jax.tree.structure(default_state)  # old checkpoints fit


def test_cnn_apply_refuses_flattened_images(reference_params):
    with pytest.raises(ValueError, match=r"images \(B, H, W\)"):
        cnn.apply(reference_params, jnp.zeros((2, 784)), REFERENCE)


@pytest.mark.parametrize(
    "preset, num_params, augment",
    [
        ("cnn", 206_922, True),
        ("fashion_cnn", 206_922, True),
        ("speedrun", 215_194, True),
        ("record", 1_867_850, True),
        ("fashion_record", 1_867_850, True),
    ],
)
def test_cnn_presets_validate_and_have_pinned_parameter_counts(preset, num_params, augment):
    cfg = config_lib.get_preset(preset)
    config_lib.validate(cfg)
    assert cfg.model.name == "cnn" and cfg.data.augment == augment
    params = jax.eval_shape(lambda: cnn.init(jax.random.key(0), cfg.model, (28, 28), 10))
    assert models.count_params(params) == num_params


def test_matmul_is_exact_in_float32_and_accumulates_bfloat16_in_float32():
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(2, 5, 64)), jnp.float32)  # (..., K): leading axes kept
    b = jnp.asarray(rng.normal(size=(64, 3)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32)
    np.testing.assert_array_equal(jax.jit(matmul)(a, b), a @ b)

    low = [x.astype(jnp.bfloat16) for x in (a, b, g)]
    out, vjp = jax.vjp(jax.jit(matmul), *low[:2])
    assert out.dtype == jnp.bfloat16 and out.shape == (2, 5, 3)
    # The float32 product of the bfloat16 inputs, rounded once to bfloat16 (half an ulp;
    # one ulp allowed, for a kernel that sums in another order).
    wide = low[0].astype(jnp.float32) @ low[1].astype(jnp.float32)
    np.testing.assert_allclose(np.asarray(out, np.float32), wide, rtol=2**-7, atol=1e-6)
    da, db = vjp(low[2])
    assert (da.dtype, db.dtype) == (jnp.bfloat16, jnp.bfloat16)
    _, vjp32 = jax.vjp(lambda a, b: a @ b, a, b)
    for got, want in zip((da, db), vjp32(g)):
        scale = float(jnp.abs(want).max())
        np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=0.02 * scale)
