"""The CNN's config: the fields a preset or a `model.*` override sets for the CNN.

Kept apart from `cnn` (its init and apply, which need jax) so that the command line can
read presets and overrides, and answer `--help`, without importing jax; `cnn.CNNConfig`
is this same class, and the registry names both modules (`jaxmnist.models`). What the
fields mean is `cnn`'s docstring; their checks are `cnn.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxmnist.models.family import ModelConfig


@dataclass(frozen=True)
class CNNConfig(ModelConfig):
    """The CNN's config: the common fields (`family.ModelConfig`), its conv blocks and its
    dense head."""

    name: str = "cnn"
    hidden: tuple[int, ...] = (256,)  # dense layers after the convs
    channels: tuple[int, ...] = (16, 32)  # output channels of each conv + pool block
    kernel_size: tuple[int, ...] = (3,)  # square kernels, one for all blocks or one each
    pool: tuple[int, ...] = (1,)  # 2x2 max-pooling after a block: 1 or 0, for all or each
    padding: str = "same"  # "same" (zero padding, odd kernels) or "valid" (none)
    conv_impl: str = "auto"  # auto, xla, im2col, patches, onednn (see models/conv.py)
    batch_norm: bool = False  # batch normalisation after each convolution
    residual: bool = False  # a block's input added to its convolution's output, where they agree
