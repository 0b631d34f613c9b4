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

from jaxmnist import compile_cache, hostmem
from jaxmnist.data.locate import default_cache_dir
from jaxmnist.data.registry import get_spec
from jaxmnist.models import apply_uint8, get_model, onednn, param_shapes


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Turns on JAX's persistent compilation cache, so a second identical run skips
    most of its compile time; None (and one warning) when it cannot be written, and
    the run goes on without it. See `jaxmnist.compile_cache`."""
    return compile_cache.enable(Path(directory) if directory else default_cache_dir() / "xla")


def largest_copy_bytes(dataset: str, model_cfg, members: int) -> int:
    """The most bytes a run copies between host and device at once, known before anything
    opens: the training images of `dataset` (uint8), or with several `members` one
    parameter of every model of `model_cfg` together (checkpoints fetch each such array),
    whichever is more. The parameters' shapes need no device (`models.param_shapes`)."""
    spec = get_spec(dataset)
    images = spec.train_size * int(np.prod(spec.image_shape))
    if members == 1:  # one model's largest array is far below any buffer's floor
        return images
    shapes = param_shapes(model_cfg, spec.image_shape, spec.num_classes)
    largest = max(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    return max(images, members * largest)


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
        "host_allocator": hostmem.describe(),
        "tpu_transfer_buffer": hostmem.describe_tpu_buffer(),
        "onednn": onednn.describe(),
    }


def placement_report(layout, cfg) -> dict:
    """Where a run's arrays land on the mesh of `layout` (a `parallel.Layout`).

    Places one parameter tree per `members` slot, a training batch, a stand-in
    for the training set and an evaluation batch exactly as a run would, runs the
    model on the batch, and reports each array's sharding spec and devices: the
    codelab's device-placement check, for any mesh. Shapes are those of the images and
    classes of `cfg.data.dataset`."""
    spec = get_spec(cfg.data.dataset)
    model = get_model(cfg.model.name)
    members, batch, shape = layout.members, cfg.train.batch_size, spec.image_shape

    def init(keys):
        return jax.vmap(lambda k: model.init(k, cfg.model, shape, spec.num_classes))(keys)

    keys = jax.random.split(jax.random.key(0), members)
    params = jax.jit(init, out_shardings=layout.by_member)(keys)
    images = layout.put(np.zeros((batch, *shape), np.uint8), layout.batch)
    train_set = layout.put(np.zeros((4 * batch, *shape), np.uint8), layout.replicated)
    eval_set = layout.put(np.zeros((2, batch, *shape), np.uint8), layout.eval_batches)
    forward = jax.vmap(lambda p, x: apply_uint8(p, x, cfg.model), in_axes=(0, None))
    logits = jax.jit(forward)(params, images)

    def where(x) -> dict:
        return {
            "shape": list(x.shape),
            "spec": str(x.sharding.spec) if hasattr(x.sharding, "spec") else "",
            "devices": sorted(str(d) for d in x.devices()),
        }

    return {
        **layout.describe(),
        "params": {
            jax.tree_util.keystr(k): where(v)
            for k, v in jax.tree_util.tree_leaves_with_path(params)
        },
        "batch": where(images),
        "train_set": where(train_set),
        "eval_batches": where(eval_set),
        "logits": where(logits),
    }
