"""The convolutional network: conv blocks, then dense layers.

Each block is a SAME, stride-1 convolution with `kernel_size`² kernels (`channels[i]`
output channels), a bias, the activation, and 2×2 max-pooling; the pooled maps are
flattened and go through dense layers of sizes `hidden` and a linear classifier. The
reference CNN is `channels=(16, 32), kernel_size=3, hidden=(128,)`: conv 3×3 1→16, ReLU,
pool; conv 3×3 16→32, ReLU, pool; dense 1568→128, ReLU; dense 128→10 (206,922 parameters).

Parameters are `{"conv": [{"w": (k, k, C_in, C_out), "b": (C_out,)}, ...], "dense":
[{"w": (fan_in, fan_out), "b": (fan_out,)}, ...]}`, float32, He-normal weights (std =
sqrt(2 / fan_in), fan_in = k²·C_in for a kernel) and zero biases. The compute dtype scheme
is the MLP's: images and weights are cast to `dtype`, the logits come back float32.
With `dropout` set and a key given (training), the input of every dense layer (the
flattened feature maps, then each hidden layer's activations) goes through dropout.

Pure functions rather than Flax: the model has no state (no batch norm: see below), so
`init`/`apply` over a pytree is all a module system would give, and plain functions vmap
over a population of models and shard without any adapter; it keeps one dependency out;
and the convolution's formulation, which decides CPU speed, is ours to choose per backend
(`jaxmnist.models.conv`, `model.conv_impl`). Dropout needs only a key, which the step
passes. Batch normalisation is left out: batch statistics would make the model stateful
for every caller (the step, evaluation, populations, checkpoints, export), and the
presets reach their targets without it.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp

from jaxmnist.errors import ConfigError
from jaxmnist.models import conv
from jaxmnist.models.layers import ACTIVATIONS, dropout


def _feature_shape(cfg, input_shape) -> tuple[int, int, int]:
    """(H, W, C) after the conv blocks; each pool halves H and W (floor)."""
    h, w = input_shape
    for _ in cfg.channels:
        h, w = h // 2, w // 2
    return h, w, cfg.channels[-1]


def init(key, cfg, input_shape=(28, 28), num_classes=10) -> dict:
    """He-normal weights, zero biases. cfg: ModelConfig with `channels`, `kernel_size`,
    `hidden`. Raises ConfigError when the images are too small for the number of blocks."""
    h, w, c = _feature_shape(cfg, input_shape)
    if h == 0 or w == 0:
        raise ConfigError(
            f"model.channels: {len(cfg.channels)} conv blocks halve {input_shape[0]}x"
            f"{input_shape[1]} images to nothing; use fewer blocks"
        )
    k = cfg.kernel_size
    convs = list(itertools.pairwise((1, *cfg.channels)))
    dense = [h * w * c, *cfg.hidden, num_classes]
    keys = iter(jax.random.split(key, len(convs) + len(dense) - 1))

    def he(shape, fan_in):
        return jax.random.normal(next(keys), shape, jnp.float32) * math.sqrt(2.0 / fan_in)

    return {
        "conv": [
            {"w": he((k, k, cin, cout), k * k * cin), "b": jnp.zeros((cout,), jnp.float32)}
            for cin, cout in convs
        ],
        "dense": [
            {"w": he((fan_in, fan_out), fan_in), "b": jnp.zeros((fan_out,), jnp.float32)}
            for fan_in, fan_out in itertools.pairwise(dense)
        ],
    }


def apply(params: dict, images: jax.Array, cfg, key: jax.Array | None = None) -> jax.Array:
    """images: float (B, H, W) in [0, 1] -> float32 logits (B, num_classes). `key`: the
    training step's dropout key; None (inference) applies no dropout."""
    if images.ndim != 3:
        raise ValueError(f"cnn.apply takes images (B, H, W), got shape {images.shape}")
    dtype = jnp.dtype(cfg.dtype)
    activation = ACTIVATIONS[cfg.activation]
    impl = conv.resolve(cfg.conv_impl)
    x = images[..., None].astype(dtype)  # NHWC with one channel
    for layer in params["conv"]:
        x = conv.conv2d(x, layer["w"].astype(dtype), impl) + layer["b"].astype(dtype)
        x = conv.max_pool(activation(x))
    x = x.reshape(x.shape[0], -1)
    for i, layer in enumerate(params["dense"]):
        x = dropout(key, x, cfg.dropout, i)
        x = x @ layer["w"].astype(dtype) + layer["b"].astype(dtype)
        if i < len(params["dense"]) - 1:
            x = activation(x)
    return x.astype(jnp.float32)


def flops_per_example(cfg, input_shape=(28, 28), num_classes=10) -> int:
    """Multiply-add FLOPs (2 per MAC) of one training example: forward, weight gradients,
    and input gradients of every layer but the first (the images need none). Bias,
    activation and pooling work is left out (a few percent for these shapes)."""
    h, w = input_shape
    macs = []
    for cin, cout in itertools.pairwise((1, *cfg.channels)):
        macs.append(h * w * cfg.kernel_size**2 * cin * cout)
        h, w = h // 2, w // 2
    sizes = [h * w * cfg.channels[-1], *cfg.hidden, num_classes]
    macs += [a * b for a, b in itertools.pairwise(sizes)]
    return 2 * sum(macs) + 2 * sum(macs) + 2 * sum(macs[1:])


def validate(cfg) -> None:
    """The CNN reads `channels`, `kernel_size`, `conv_impl` and `hidden` (its dense head)."""
    if not cfg.channels or any(c <= 0 for c in cfg.channels):
        raise ConfigError(
            f"model.channels: one or more positive channel counts, got {cfg.channels}"
        )
    if cfg.kernel_size <= 0 or cfg.kernel_size % 2 == 0:
        raise ConfigError(
            f"model.kernel_size: a positive odd size (SAME padding), got {cfg.kernel_size}"
        )
    if cfg.conv_impl not in conv.CHOICES:
        raise ConfigError(
            f"unknown model.conv_impl {cfg.conv_impl!r}; choose from: {', '.join(conv.CHOICES)}"
        )
    if any(h <= 0 for h in cfg.hidden):
        raise ConfigError(f"model.hidden: sizes must be positive, got {cfg.hidden}")
