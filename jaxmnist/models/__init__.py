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
- `run_facts(model_cfg, input_shape=None) -> dict`: facts environment.json records when a
  run starts on images of `input_shape` (the CNN's resolved convolutions); none by default;
- `first_kernel`: the params.npz key (`rundir.save_params`) of the first layer's image
  kernels, (k, k, C_in, C_out), which the report draws; None when the family has none.

Registering is `register(name, Model(...))` (or `MODELS[name] = Model(...)`): `--model
name`, `model.<field>=...` overrides of the family's own fields, saved runs, eval,
predict, export, serve and the report then work without editing any other module.

This module imports no jax, and neither do the families' configs: the command line reads
presets and overrides (`config.PRESETS`) and answers `--help` before anything computes.
A built-in family is therefore two modules: its config (`mlp_config.MLPConfig`,
`cnn_config.CNNConfig`, light) and its arithmetic (`mlp`, `cnn`: init, apply and the rest,
with jax), whose `MODEL` is its entry. `MODELS` knows a built-in family by its name and
config class, and imports its module the first time its entry is asked for
(`get_model(name)`, `MODELS[name]`); what needs the config alone (`config_fields`,
`model_config`, `switch_family`, `unknown_field_message`, iterating over the names) never
imports it. This rather than functions that import their module on each call: an entry
holds the family's real functions (`get_model("cnn").apply is cnn.apply`, what jit and
the tests see), and the config stays a plain dataclass in a module of its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import typing
from collections.abc import Callable, Iterator, MutableMapping
from typing import NamedTuple

from jaxmnist.errors import ConfigError
from jaxmnist.models.cnn_config import CNNConfig
from jaxmnist.models.family import ModelConfig
from jaxmnist.models.mlp_config import MLPConfig

if typing.TYPE_CHECKING:
    import jax


def _same(model_cfg):
    return model_cfg


def _no_facts(model_cfg, input_shape=None) -> dict:
    return {}


class Model(NamedTuple):
    init: Callable  # (key, model_cfg, input_shape, num_classes) -> params
    apply: Callable  # (params, images (B, H, W), model_cfg, key, train) -> logits (B, C)
    flops_per_example: Callable  # (model_cfg, input_shape, num_classes) -> int
    validate: Callable  # (model_cfg) -> None; raises ConfigError
    config: type  # the family's config dataclass, derived from family.ModelConfig
    describe: Callable  # (model_cfg) -> str, e.g. "mlp in → 256 → out"
    portable: Callable = _same  # (model_cfg) -> the model_cfg export traces
    run_facts: Callable = _no_facts  # (model_cfg, input_shape) -> dict for environment.json
    first_kernel: str | None = None  # params.npz key of the first layer's image kernels


class _Later(NamedTuple):
    """A family known by its config class, whose `Model` is `module.MODEL`."""

    config: type
    module: str


class Registry(MutableMapping):
    """name -> `Model`, in the order of registration. An entry given as `_Later` is loaded
    (its module imported, jax with it) when it is first read; `config(name)` never loads."""

    def __init__(self, entries: dict[str, Model | _Later]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Model:
        entry = self._entries[name]
        if isinstance(entry, _Later):
            # start-up: a family's jax code loads when a command first uses the family
            entry = self._entries[name] = importlib.import_module(entry.module).MODEL
        return entry

    def __setitem__(self, name: str, model: Model) -> None:
        self._entries[name] = model

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:  # Mapping's would load the entry
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def config(self, name: str) -> type:
        """Family `name`'s config class, without loading its module; KeyError if none."""
        return self._entries[name].config


MODELS: Registry = Registry(
    {
        "mlp": _Later(MLPConfig, "jaxmnist.models.mlp"),
        "cnn": _Later(CNNConfig, "jaxmnist.models.cnn"),
    }
)


def register(name: str, model: Model) -> None:
    """Adds (or replaces) family `name`; `unregister` takes it away again (tests)."""
    if not (isinstance(model.config, type) and issubclass(model.config, ModelConfig)):
        raise TypeError(f"model {name!r}: its config must derive from models.family.ModelConfig")
    MODELS[name] = model


def unregister(name: str) -> None:
    if name in MODELS:  # not pop: it would load a built-in family to drop it
        del MODELS[name]


def _known(name: str) -> str:
    """`name`, or ConfigError (one line) listing the choices if no family has it."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from: {', '.join(MODELS)}")
    return name


def get_model(name: str) -> Model:
    """The registered family `name` (a built-in one's jax code imported on first use);
    ConfigError (one line) listing the choices if none."""
    return MODELS[_known(name)]


def config_class(name: str) -> type:
    """Family `name`'s config dataclass, without importing its jax code; ConfigError (one
    line) listing the choices if none."""
    return MODELS.config(_known(name))


def config_fields(name: str) -> tuple[str, ...]:
    """The field names of family `name`'s config, common ones first."""
    return tuple(f.name for f in dataclasses.fields(config_class(name)))


def model_config(name: str, **fields) -> ModelConfig:
    """Family `name`'s config: its defaults, with `fields` (already typed) replaced.
    ConfigError (one line) for an unknown family or a field the family does not have."""
    known = config_fields(name)
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise ConfigError(unknown_field_message(name, unknown[0]))
    return config_class(name)(**{**fields, "name": name})


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
    if name == model_cfg.name and isinstance(model_cfg, config_class(name)):
        return model_cfg
    target = typing.get_type_hints(config_class(name))
    source = typing.get_type_hints(type(model_cfg))
    carried = {
        f.name: getattr(model_cfg, f.name)
        for f in dataclasses.fields(model_cfg)
        if f.name != "name" and target.get(f.name, object()) == source[f.name]
    }
    return model_config(name, **carried)


def apply_uint8(params, images, cfg) -> jax.Array:
    """Logits for uint8 images (B, H, W) in inference: the one place that scales the
    device-resident bytes to [0, 1] before `cfg.name`'s apply. cfg: a family's config.

    With `cfg.tta_shift` n > 0 (test-time augmentation), each image is also moved by n
    pixels up, down, left and right (zero fill), the five views go through the model in
    one batch, and the result is the log of their mean softmax probabilities: logits
    whose softmax is that mean, so that every caller (evaluation, ensembles, predict,
    export, serve) uses the averaged prediction without knowing."""
    model = get_model(cfg.name)
    if not cfg.tta_shift:
        return model.apply(params, _scale(images), cfg)
    import jax  # not at the top: this module is read before jax loads (start-up)
    import jax.numpy as jnp

    views = _moved_views(images, cfg.tta_shift)
    logits = model.apply(params, _scale(views.reshape(-1, *images.shape[1:])), cfg)
    log_probs = jax.nn.log_softmax(logits).reshape(len(views), images.shape[0], -1)
    return jax.nn.logsumexp(log_probs, axis=0) - jnp.log(len(views))


def _moved_views(images, n: int):
    """(5, B, H, W[, C]): the images, then moved by n pixels down, up, right and left, the
    pixels moved in zeros."""
    import jax.numpy as jnp  # not at the top: this module is read before jax loads

    h, w = images.shape[1:3]
    pad = [(0, 0), (n, n), (n, n)] + [(0, 0)] * (images.ndim - 3)
    padded = jnp.pad(images, pad)
    crops = [(n, n), (0, n), (2 * n, n), (n, 0), (n, 2 * n)]  # (top, left) of each view
    return jnp.stack([padded[:, t : t + h, l : l + w] for t, l in crops])


def train_apply_uint8(params, images, cfg, key=None) -> tuple[jax.Array, object]:
    """The training step's forward pass on uint8 images: (logits, new running statistics
    or None); `key` is dropout's."""
    return get_model(cfg.name).apply(params, _scale(images), cfg, key=key, train=True)


def _scale(images: jax.Array) -> jax.Array:
    return images.astype("float32") * (1.0 / 255.0)


def param_shapes(model_cfg, input_shape: tuple[int, ...], num_classes: int):
    """One model's parameter tree as `jax.ShapeDtypeStruct`s, from a raw key's shape: no
    key and no array is made on any device (`jax.eval_shape`). cfg: a family's config."""
    import jax  # not at the top: this module is read before jax loads (start-up)
    import numpy as np

    model = get_model(model_cfg.name)
    return jax.eval_shape(
        lambda raw: model.init(jax.random.wrap_key_data(raw), model_cfg, input_shape, num_classes),
        jax.ShapeDtypeStruct((2,), np.uint32),
    )


def count_params(params) -> int:
    """Trainable parameters: running statistics (`params["stats"]`) are not counted."""
    import jax  # not at the top: this module is read before jax loads (start-up)

    from jaxmnist.models.layers import STATS  # start-up: layers imports jax

    if isinstance(params, dict) and STATS in params:
        params = {k: v for k, v in params.items() if k != STATS}
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))


__all__ = [
    "MODELS",
    "CNNConfig",
    "MLPConfig",
    "Model",
    "ModelConfig",
    "Registry",
    "apply_uint8",
    "config_class",
    "config_fields",
    "count_params",
    "get_model",
    "model_config",
    "param_shapes",
    "register",
    "switch_family",
    "train_apply_uint8",
    "unknown_field_message",
    "unregister",
]
