"""Model registry: each model is a pair of pure functions over a parameter pytree.

`init(key, cfg) -> params` and `apply(params, images, cfg) -> logits`, where
`images` is a float array `(batch, 28, 28)` or `(batch, 784)` in [0, 1] and the
logits are float32 `(batch, num_classes)`. A CNN joins by adding an entry.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist.models import mlp


class Model(NamedTuple):
    init: Callable  # (key, ModelConfig, input_shape, num_classes) -> params
    apply: Callable  # (params, images, ModelConfig) -> float32 logits


MODELS = {"mlp": Model(mlp.init, mlp.apply)}


def get_model(name: str) -> Model:
    return MODELS[name]


def apply_uint8(params, images, cfg) -> jax.Array:
    """Logits for uint8 images (B, H, W) or (B, H*W): the one place that scales the
    device-resident bytes to [0, 1] before `cfg.name`'s apply. cfg: ModelConfig."""
    return get_model(cfg.name).apply(params, images.astype(jnp.float32) * (1.0 / 255.0), cfg)


def count_params(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


__all__ = ["MODELS", "Model", "apply_uint8", "count_params", "get_model", "mlp"]
