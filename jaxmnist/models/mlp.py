"""The multilayer perceptron of both reference tutorials.

Parameters are a list of `{"w": (fan_in, fan_out), "b": (fan_out,)}` dicts, float32,
with He-normal weights (std = sqrt(2 / fan_in)) and zero biases. The forward pass
runs in the configured compute dtype: inputs and weights are cast to it (bfloat16
halves memory traffic on accelerators), and the logits come back as float32 so the
loss is always computed in float32 — the codelab's mixed-precision scheme. In
training (`train=True`), with `dropout` set, the input of every dense layer after the
first (the hidden activations; never the pixels) goes through dropout.

Its config, `MLPConfig`, lives in `mlp_config` (no jax there, for the command line's
start-up); `MODEL` is the family's registry entry (`jaxmnist.models`).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp

from jaxmnist import rng
from jaxmnist.errors import ConfigError
from jaxmnist.models import Model
from jaxmnist.models.layers import ACTIVATIONS, dropout, matmul
from jaxmnist.models.mlp_config import MLPConfig


def init(key, cfg, input_shape=(28, 28), num_classes=10) -> list[dict]:
    """He-normal weights, zero biases. `cfg` is an MLPConfig."""
    sizes = [math.prod(input_shape), *cfg.hidden, num_classes]
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {
            "w": rng.flat(jax.random.normal, k, (fan_in, fan_out), dtype=jnp.float32)
            * math.sqrt(2.0 / fan_in),
            "b": jnp.zeros((fan_out,), jnp.float32),
        }
        for k, fan_in, fan_out in zip(keys, sizes[:-1], sizes[1:])
    ]


def apply(params: list[dict], images: jax.Array, cfg, key: jax.Array | None = None, train=False):
    """images: (batch, H, W) float in [0, 1] -> float32 logits (batch, C). The MLP
    flattens the images itself (a (batch, H*W) input is taken as already flat).
    `train=True`: the training step's pass, with dropout by `key`; returns `(logits,
    None)` (no running statistics). Inference (the default) returns the logits."""
    dtype = jnp.dtype(cfg.dtype)
    activation = ACTIVATIONS[cfg.activation]
    drop_key = key if train else None
    x = images.reshape(images.shape[0], -1).astype(dtype)
    for i, layer in enumerate(params):
        if i > 0:
            x = dropout(drop_key, x, cfg.dropout, i)
        x = matmul(x, layer["w"].astype(dtype)) + layer["b"].astype(dtype)
        if i < len(params) - 1:
            x = activation(x)
    logits = x.astype(jnp.float32)
    return (logits, None) if train else logits


def flops_per_example(cfg, input_shape=(28, 28), num_classes=10) -> int:
    """Matmul FLOPs of one training example: forward, plus backward without the
    input gradient of the first layer (nothing needs it). Elementwise work is
    left out; it is a few percent of this for these shapes."""
    sizes = [math.prod(input_shape), *cfg.hidden, num_classes]
    macs = [a * b for a, b in itertools.pairwise(sizes)]
    forward = 2 * sum(macs)
    backward = 2 * sum(macs) + 2 * sum(macs[1:])  # weight grads + activation grads
    return forward + backward


def validate(cfg) -> None:
    """The MLP's own field: `hidden` (sizes of its hidden layers; empty: a linear classifier).
    A field it does not have (`batch_norm`, `channels`) is refused when the config is built."""
    if any(h <= 0 for h in cfg.hidden):
        raise ConfigError(f"model.hidden: sizes must be positive, got {cfg.hidden}")


def describe(cfg) -> str:
    """The network in a few words, e.g. "mlp in → 256 → 128 → out"."""
    return f"{cfg.name} " + " → ".join(map(str, ["in", *cfg.hidden, "out"]))


MODEL = Model(init, apply, flops_per_example, validate, MLPConfig, describe)
