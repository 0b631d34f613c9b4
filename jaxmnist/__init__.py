"""jaxmnist: train and benchmark MNIST-family image classifiers with JAX and Optax.

The public surface is small: a `Config` (with `PRESETS`), `train_and_evaluate`,
`load_dataset`, and the pure pieces a notebook may want to compose itself.
"""

from importlib import metadata as _metadata

from jaxmnist.config import PRESETS, Config, apply_overrides, get_preset
from jaxmnist.data import load_dataset
from jaxmnist.errors import ConfigError, DataError, JaxmnistError, TrainingError
from jaxmnist.training.loop import train_and_evaluate
from jaxmnist.training.step import TrainState, make_train_epoch

try:
    __version__ = _metadata.version("jaxmnist")  # one source of truth: pyproject.toml
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"

__all__ = [
    "PRESETS",
    "Config",
    "ConfigError",
    "DataError",
    "JaxmnistError",
    "TrainState",
    "TrainingError",
    "__version__",
    "apply_overrides",
    "get_preset",
    "load_dataset",
    "make_train_epoch",
    "train_and_evaluate",
]
