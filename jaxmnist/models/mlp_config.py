"""The MLP's config: the fields a preset or a `model.*` override sets for the MLP.

Kept apart from `mlp` (its init and apply, which need jax) so that the command line can
read presets and overrides, and answer `--help`, without importing jax; `mlp.MLPConfig`
is this same class, and the registry names both modules (`jaxmnist.models`).
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxmnist.models.family import ModelConfig


@dataclass(frozen=True)
class MLPConfig(ModelConfig):
    """The MLP's config: the common fields (`family.ModelConfig`) and its hidden layers."""

    name: str = "mlp"
    hidden: tuple[int, ...] = (256,)  # sizes of the hidden layers; empty: a linear classifier
