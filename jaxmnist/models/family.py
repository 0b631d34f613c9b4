"""What every model family's config holds, and the checks of those common fields.

A family declares its own frozen config dataclass next to its `init` and `apply`
(`mlp.MLPConfig`, `cnn.CNNConfig`), derived from `ModelConfig`: `name` (the family's key
in `jaxmnist.models.MODELS`), `activation`, `dtype` (the compute dtype; parameters and
the loss stay float32), `dropout` and `tta_shift` are the fields every family has,
because the code around the models reads them (the training step asks for dropout keys,
the bench varies the dtype, inference averages over moved images). Everything else is
the family's own. `config.Config.model` is whichever family's dataclass, so `config.py`
holds no family's fields.

Like the families' config modules (`mlp_config`, `cnn_config`), this module imports no
jax: the command line reads presets and overrides before anything computes.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxmnist.errors import ConfigError

# Names only: the functions are `layers.ACTIVATIONS`' (jax), keyed by the same names.
ACTIVATIONS = ("relu", "gelu")
DTYPES = ("float32", "bfloat16")
# Test-time moves beyond a few pixels push a digit's strokes off the image.
MAX_TTA_SHIFT = 4


@dataclass(frozen=True)
class ModelConfig:
    """The fields of every family; a family's config derives from it and gives `name` the
    family's key as its default."""

    name: str  # a family of jaxmnist.models.MODELS
    activation: str = "relu"  # the nonlinearity after each hidden layer
    dtype: str = "float32"  # compute dtype; parameters and loss stay float32
    dropout: float = 0.0  # training only: rate on each dense layer's input but the pixels
    # Inference only: the mean of the class probabilities over the image and its four moves
    # by this many pixels (up, down, left, right); 0: the image alone (models.apply_uint8)
    tta_shift: int = 0


def validate_common(cfg: ModelConfig) -> None:
    """Raises ConfigError (one line) for a bad activation, dtype or dropout rate."""
    for value, choices, what in (
        (cfg.activation, ACTIVATIONS, "activation"),
        (cfg.dtype, DTYPES, "dtype"),
    ):
        if value not in choices:
            raise ConfigError(f"unknown {what} {value!r}; choose from: {', '.join(choices)}")
    if not 0 <= cfg.dropout < 1:
        raise ConfigError(f"model.dropout: a rate in [0, 1), got {cfg.dropout}")
    if not 0 <= cfg.tta_shift <= MAX_TTA_SHIFT:
        raise ConfigError(
            f"model.tta_shift: 0 (none) to {MAX_TTA_SHIFT} pixels, got {cfg.tta_shift}"
        )
