"""Model registry: a model family is one module and one entry in `MODELS`.

A family provides its config and a few pure functions, gathered in a `Model`:

- `config`: its frozen config dataclass, derived from `family.ModelConfig` (the fields
  every family has: `name`, `activation`, `dtype`, `dropout`) and declaring the family's
  own fields with their defaults (`mlp.MLPConfig`, `cnn.CNNConfig`);
- `init(key, model_cfg, input_shape=(H, W), num_classes) -> params`, a pytree of float32
  arrays;
- `apply(params, images, model_cfg, key=None, train=False)`: images float (B, H, W) in
  [0, 1] -> logits float32 (B, num_classes). Callers never flatten; a family that wants
  vectors (the MLP) flattens itself. Inference by default; `train=True` is the training
  step's pass (dropout by `key`, batch statistics) and returns `(logits, stats)`: the
  moved running statistics that go to `params["stats"]`, or None for a family with none;
- `flops_per_example(model_cfg, input_shape, num_classes) -> int`: analytic FLOPs of one
  training example, forward and backward, for utilisation figures;
- `validate(model_cfg)`: raises `ConfigError` (one line) for a bad value of the family's
  own fields (`config.validate` calls it after checking the common ones);
- `describe(model_cfg) -> str`: the network in a few words, starting with the family's
  name ("mlp in → 256 → out"), for the report (which adds activation and dtype);
- `portable(model_cfg) -> model_cfg`: the formulation `export` traces, one that every
  backend can run (the CNN swaps a oneDNN convolution for XLA's); identity by default;
- `run_facts(model_cfg) -> dict`: facts environment.json records when a run starts (the
  CNN's resolved convolution); none by default;
- `first_kernel`: the params.npz key (`rundir.save_params`) of the first layer's image
  kernels, (k, k, C_in, C_out), which the report draws; None when the family has none.

Registering is `register(name, Model(...))` (or `MODELS[name] = Model(...)`): `--model
name`, `model.<field>=...` overrides of the family's own fields, saved runs, eval,
predict, export, serve and the report then work without editing any other module.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist.errors import ConfigError
from jaxmnist.models import cnn, conv, layers, mlp
from jaxmnist.models.cnn import CNNConfig
from jaxmnist.models.family import ModelConfig
from jaxmnist.models.mlp import MLPConfig


def _same(model_cfg):
    return model_cfg


def _no_facts(model_cfg) -> dict:
    return {}


class Model(NamedTuple):
    init: Callable  # (key, model_cfg, input_shape, num_classes) -> params
    apply: Callable  # (params, images (B, H, W), model_cfg, key, train) -> logits (B, C)
    flops_per_example: Callable  # (model_cfg, input_shape, num_classes) -> int
    validate: Callable  # (model_cfg) -> None; raises ConfigError
    config: type  # the family's config dataclass, derived from family.ModelConfig
    describe: Callable  # (model_cfg) -> str, e.g. "mlp in → 256 → out"
    portable: Callable = _same  # (model_cfg) -> the model_cfg export traces
    run_facts: Callable = _no_facts  # (model_cfg) -> dict recorded in environment.json
    first_kernel: str | None = None  # params.npz key of the first layer's image kernels


MODELS: dict[str, Model] = {
    "mlp": Model(mlp.init, mlp.apply, mlp.flops_per_example, mlp.validate, MLPConfig, mlp.describe),
    "cnn": Model(
        cnn.init,
        cnn.apply,
        cnn.flops_per_example,
        cnn.validate,
        CNNConfig,
        cnn.describe,
        portable=cnn.portable,
        run_facts=cnn.run_facts,
        first_kernel="['conv'][0]['w']",
    ),
}


def register(name: str, model: Model) -> None:
    """Adds (or replaces) family `name`; `unregister` takes it away again (tests)."""
    if not (isinstance(model.config, type) and issubclass(model.config, ModelConfig)):
        raise TypeError(f"model {name!r}: its config must derive from models.family.ModelConfig")
    MODELS[name] = model


def unregister(name: str) -> None:
    MODELS.pop(name, None)


def get_model(name: str) -> Model:
    """The registered family `name`; ConfigError (one line) listing the choices if none."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from: {', '.join(MODELS)}")
    return MODELS[name]


def config_fields(name: str) -> tuple[str, ...]:
    """The field names of family `name`'s config, common ones first."""
    return tuple(f.name for f in dataclasses.fields(get_model(name).config))


def model_config(name: str, **fields) -> ModelConfig:
    """Family `name`'s config: its defaults, with `fields` (already typed) replaced.
    ConfigError (one line) for an unknown family or a field the family does not have."""
    known = config_fields(name)
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise ConfigError(unknown_field_message(name, unknown[0]))
    return get_model(name).config(**{**fields, "name": name})


def unknown_field_message(name: str, field: str) -> str:
    """e.g. "unknown config field 'model.channels' for the mlp model (a field of cnn); its
    fields: model.name, ..." (one line)."""
    owners = [other for other in MODELS if other != name and field in config_fields(other)]
    owned = f" (a field of {', '.join(owners)})" if owners else ""
    fields = ", ".join(f"model.{f}" for f in config_fields(name))
    return f"unknown config field 'model.{field}' for the {name} model{owned}; its fields: {fields}"


def switch_family(model_cfg: ModelConfig, name: str) -> ModelConfig:
    """`model_cfg` as family `name`'s config. The fields both families declare with the same
    type carry over (the common ones always; the MLP's and the CNN's `hidden` too, as when
    one config held every family's fields); the rest take `name`'s defaults. The same
    family: `model_cfg` unchanged."""
    if name == model_cfg.name and isinstance(model_cfg, get_model(name).config):
        return model_cfg
    target = typing.get_type_hints(get_model(name).config)
    source = typing.get_type_hints(type(model_cfg))
    carried = {
        f.name: getattr(model_cfg, f.name)
        for f in dataclasses.fields(model_cfg)
        if f.name != "name" and target.get(f.name, object()) == source[f.name]
    }
    return model_config(name, **carried)


def apply_uint8(params, images, cfg) -> jax.Array:
    """Logits for uint8 images (B, H, W) in inference: the one place that scales the
    device-resident bytes to [0, 1] before `cfg.name`'s apply. cfg: a family's config."""
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
    "CNNConfig",
    "MLPConfig",
    "Model",
    "ModelConfig",
    "apply_uint8",
    "cnn",
    "config_fields",
    "conv",
    "count_params",
    "get_model",
    "layers",
    "mlp",
    "model_config",
    "register",
    "switch_family",
    "train_apply_uint8",
    "unknown_field_message",
    "unregister",
]
