"""jaxmnist: train and benchmark MNIST-family image classifiers with JAX and Optax.

The public surface is small: a `Config` (with `PRESETS`), `train_and_evaluate`,
`load_dataset`, `open_run`, and the pure pieces a notebook may want to compose
itself. They are imported on first use, so that `import jaxmnist` (and the command
line's `--help`) does not start JAX.
"""

import importlib
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("jaxmnist")  # one source of truth: pyproject.toml
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"

_PUBLIC = {  # name -> the module that defines it
    "PRESETS": "jaxmnist.config",
    "Config": "jaxmnist.config",
    "apply_overrides": "jaxmnist.config",
    "get_preset": "jaxmnist.config",
    "ConfigError": "jaxmnist.errors",
    "DataError": "jaxmnist.errors",
    "JaxmnistError": "jaxmnist.errors",
    "TrainingError": "jaxmnist.errors",
    "load_dataset": "jaxmnist.data",
    "open_run": "jaxmnist.runs.reader",
    "train_and_evaluate": "jaxmnist.train",
    "TrainState": "jaxmnist.training.step",
    "make_train_epoch": "jaxmnist.training.step",
}

__all__ = [  # noqa: RUF022 -- the public names, as _PUBLIC lists them
    "__version__",
    "PRESETS",
    "Config",
    "apply_overrides",
    "get_preset",
    "ConfigError",
    "DataError",
    "JaxmnistError",
    "TrainingError",
    "load_dataset",
    "open_run",
    "train_and_evaluate",
    "TrainState",
    "make_train_epoch",
]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'jaxmnist' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
