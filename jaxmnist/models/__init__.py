"""Model registry: a model family is one module and one entry in `MODELS`.

A family provides four pure functions, gathered in a `Model`:

- `init(key, model_cfg, input_shape=(H, W), num_classes) -> params`, a pytree of float32
  arrays;
- `apply(params, images, model_cfg, key=None) -> logits`: images float (B, H, W) in
  [0, 1], logits float32 (B, num_classes). Callers never flatten; a family that wants
  vectors (the MLP) flattens itself. `key` is given only by the training step (for
  `model.dropout`); inference passes none;
- `flops_per_example(model_cfg, input_shape, num_classes) -> int`: analytic FLOPs of one
  training example, forward and backward, for utilisation figures;
- `validate(model_cfg)`: raises `ConfigError` (one line) for a bad value of the fields the
  family reads (`config.validate` calls it, so no field is checked as another family's).

`config.validate` takes its model choices from `MODELS`; registering a family here
(`MODELS[name] = Model(...)`) is all it takes to make `--model name` work.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist.models import cnn, conv, layers, mlp


class Model(NamedTuple):
    init: Callable  # (key, ModelConfig, input_shape, num_classes) -> params
    apply: Callable  # (params, float images (B, H, W), ModelConfig, key=None) -> logits (B, C)
    flops_per_example: Callable  # (ModelConfig, input_shape, num_classes) -> int
    validate: Callable  # (ModelConfig) -> None; raises ConfigError


MODELS: dict[str, Model] = {
    "mlp": Model(mlp.init, mlp.apply, mlp.flops_per_example, mlp.validate),
    "cnn": Model(cnn.init, cnn.apply, cnn.flops_per_example, cnn.validate),
}


def get_model(name: str) -> Model:
    return MODELS[name]


def apply_uint8(params, images, cfg, key=None) -> jax.Array:
    """Logits for uint8 images (B, H, W): the one place that scales the device-resident
    bytes to [0, 1] before `cfg.name`'s apply. cfg: ModelConfig; key: dropout's, in
    training only."""
    x = images.astype(jnp.float32) * (1.0 / 255.0)
    return get_model(cfg.name).apply(params, x, cfg, key=key)


def count_params(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


__all__ = [
    "MODELS",
    "Model",
    "apply_uint8",
    "cnn",
    "conv",
    "count_params",
    "get_model",
    "layers",
    "mlp",
]
