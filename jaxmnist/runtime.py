"""The JAX runtime around a run: compilation cache, environment, device placement.

`environment()` is what every run and benchmark saves next to its figures, so a
number can always be traced to the software and hardware that produced it.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import jax
import numpy as np

from jaxmnist.data.locate import default_cache_dir


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Turns on JAX's persistent compilation cache, so a second identical run skips
    most of its compile time; None (and one warning) when it cannot be written, and
    the run goes on without it. See `jaxmnist.compile_cache`."""
    from jaxmnist import compile_cache

    return compile_cache.enable(Path(directory) if directory else default_cache_dir() / "xla")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Versions, backend and devices: saved as environment.json with every run."""
    devices = jax.devices()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "optax": _version("optax"),
        "numpy": np.__version__,
        "jaxmnist": _version("jaxmnist"),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "devices": [str(d) for d in devices],
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def placement_report() -> dict:
    """Where a parameter tree and a batch actually land — the codelab's check.

    Places a small MLP's parameters and a uint8 batch with `jax.device_put`, runs
    one forward pass, and reports each array's devices."""
    from jaxmnist.config import ModelConfig
    from jaxmnist.models import apply_uint8, mlp

    params = jax.jit(lambda k: mlp.init(k, ModelConfig()))(jax.random.key(0))
    batch = jax.device_put(np.zeros((128, 28, 28), np.uint8))
    logits = jax.jit(lambda p, x: apply_uint8(p, x, ModelConfig()))(params, batch)

    def where(x) -> list[str]:
        return sorted(str(d) for d in x.devices())

    return {
        "default_device": str(jax.devices()[0]),
        "params": {
            jax.tree_util.keystr(k): where(v)
            for k, v in jax.tree_util.tree_leaves_with_path(params)
        },
        "batch": where(batch),
        "logits": where(logits),
        "on_default_device": all(
            where(x) == [str(jax.devices()[0])] for x in [*jax.tree.leaves(params), batch, logits]
        ),
    }
