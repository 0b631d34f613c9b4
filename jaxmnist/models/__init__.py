"""Model registry: a model family is one module and one entry in `MODELS`.

A family provides four pure functions, gathered in a `Model`:

- `init(key, model_cfg, input_shape=(H, W), num_classes) -> params`, a pytree of float32
  arrays;
- `apply(params, images, model_cfg, key=None, train=False)`: images float (B, H, W) in
  [0, 1] -> logits float32 (B, num_classes). Callers never flatten; a family that wants
  vectors (the MLP) flattens itself. Inference by default; `train=True` is the training
  step's pass (dropout by `key`, batch statistics) and returns `(logits, stats)`: the
  moved running statistics that go to `params["stats"]`, or None for a family with none;
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
    apply: Callable  # (params, images (B, H, W), ModelConfig, key, train) -> logits (B, C)
    flops_per_example: Callable  # (ModelConfig, input_shape, num_classes) -> int
    validate: Callable  # (ModelConfig) -> None; raises ConfigError


MODELS: dict[str, Model] = {
    "mlp": Model(mlp.init, mlp.apply, mlp.flops_per_example, mlp.validate),
    "cnn": Model(cnn.init, cnn.apply, cnn.flops_per_example, cnn.validate),
}


def get_model(name: str) -> Model:
    return MODELS[name]


def apply_uint8(params, images, cfg) -> jax.Array:
    """Logits for uint8 images (B, H, W) in inference: the one place that scales the
    device-resident bytes to [0, 1] before `cfg.name`'s apply. cfg: ModelConfig."""
    return get_model(cfg.name).apply(params, _scale(images), cfg)


def train_apply_uint8(params, images, cfg, key=None) -> tuple[jax.Array, object]:
    """The training step's forward pass on uint8 images: (logits, new running statistics
    or None); `key` is dropout's."""
    return get_model(cfg.name).apply(params, _scale(images), cfg, key=key, train=True)


def _scale(images: jax.Array) -> jax.Array:
    return images.astype(jnp.float32) * (1.0 / 255.0)


def count_params(params) -> int:
    """Trainable parameters: running statistics (`params["stats"]`) are not counted."""
    if isinstance(params, dict) and layers.STATS in params:
        params = {k: v for k, v in params.items() if k != layers.STATS}
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
    "train_apply_uint8",
]
