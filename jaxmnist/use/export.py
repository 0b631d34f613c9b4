"""Exporting a trained model as one file that runs with only `jax` and `flatbuffers` installed.

The file is a JSON header on its first line, then the bytes of a `jax.export`
serialisation: the StableHLO of `images uint8 (batch, *image_shape) -> probabilities
float32 (batch, C)` with a symbolic batch size and the trained parameters embedded as
constants. `image_shape` is the dataset's, (H, W) or (H, W, C); the header says it, and
how a person's image is made into one. Loading it needs `json`, `jax` (with `flatbuffers`,
which `jax.export.deserialize` imports) and nothing of jaxmnist:

    with open(path, "rb") as f:
        header = json.loads(f.readline())
        model = jax.export.deserialize(bytearray(f.read()))
    probs = model.call(images_uint8)

The function is the one `jaxmnist eval` runs (`models.apply_uint8` then a
softmax), so the exported model predicts exactly what eval counts. The export of a
run of several seeds is, unless one member is chosen, their ensemble: still one
function of the same signature, the members' stacked parameters embedded and the
members vmapped inside, returning the mean of their softmax probabilities (the
header's `trained.ensemble` says how many), in as few chunks of members as fit the memory
budget where it is exported (`use.chunks`; `ensemble_chunks` in the header). The file is
written to a temporary name beside the target and renamed into place: a failed
export never leaves a file that looks complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import tempfile
from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxmnist.data.registry import get_spec
from jaxmnist.errors import ConfigError, JaxmnistError
from jaxmnist.models import get_model
from jaxmnist.use import preprocess
from jaxmnist.use.members import describe_ensemble
from jaxmnist.use.predict import (
    CLI_BATCH,
    TrainedModel,
    compile_probabilities,
    probabilities_fn,
)

FORMAT = "jaxmnist-export/1"
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export lowers for


def check_output(out) -> Path:
    """The export's path, after checking it can be written; ConfigError if not."""
    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; --out names the file to write")
    if not path.parent.is_dir():
        raise ConfigError(f"{path}: folder {path.parent} does not exist")
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        raise ConfigError(f"{path}: cannot write in {path.parent} ({e.strerror or e})") from None
    return path


def make_header(model: TrainedModel, exported: jax.export.Exported, platforms) -> dict:
    """What a server needs to know besides the function: classes, input format, versions."""
    try:
        version = metadata.version("jaxmnist")
    except metadata.PackageNotFoundError:
        version = None
    spec = get_spec(model.dataset)
    return {
        "format": FORMAT,
        "class_names": list(model.class_names),
        "input": {
            "shape": ["batch", *spec.image_shape],
            "dtype": "uint8",
            **preprocess.describe(spec),  # "scaling" and "preprocessing", in words
        },
        "output": {"shape": ["batch", len(model.class_names)], "dtype": "float32"},
        "output_meaning": "class probabilities (softmax), in class_names order"
        + (f"; the {describe_ensemble(model.seeds)}" if model.ensemble else ""),
        "platforms": list(platforms),
        "test_accuracy": model.test_accuracy,
        "jaxmnist_version": version,
        "jax_version": jax.__version__,
        "calling_convention_version": exported.calling_convention_version,
        "trained": model.info(),
    }


def export_model(model: TrainedModel, out, platforms=("cpu", "cuda", "tpu")) -> dict:
    """Writes `model` to `out` (see the module docstring); returns the header."""
    platforms = tuple(platforms)
    unknown = [p for p in platforms if p not in PLATFORMS]
    if unknown or not platforms:
        raise ConfigError(
            f"unknown platform {', '.join(unknown) or '(none)'}; choose from {', '.join(PLATFORMS)}"
        )
    path = check_output(out)
    params = jax.device_get(model.params)  # host arrays: embedded in the module as constants
    # What the family runs everywhere: a custom call of this process (oneDNN) cannot travel.
    model_cfg = get_model(model.config.model.name).portable(model.config.model)
    # An ensemble's members in as few chunks as fit the memory budget here, at the batch
    # `predict` runs (`use.chunks`); the exported program runs them so wherever it goes.
    chunks = 1
    if model.ensemble:
        reference = jax.ShapeDtypeStruct((CLI_BATCH, *model.image_shape), jnp.uint8)
        portable = model._replace(config=dataclasses.replace(model.config, model=model_cfg))
        _, chunks = compile_probabilities(portable, params, reference)
    probabilities = probabilities_fn(model_cfg, model.ensemble, chunks)
    (batch,) = jax.export.symbolic_shape("batch")
    spec = jax.ShapeDtypeStruct((batch, *model.image_shape), jnp.uint8)
    try:
        exported = jax.export.export(
            jax.jit(lambda images: probabilities(params, images)), platforms=platforms
        )(spec)
    except (ValueError, NotImplementedError) as e:  # an op one of the platforms lacks
        raise JaxmnistError(f"cannot export for {', '.join(platforms)}: {e}") from None
    header = make_header(model, exported, platforms)
    if model.ensemble:
        header["ensemble_chunks"] = chunks  # members run members / chunks at a time
    blob = exported.serialize()
    _atomic_write(path, json.dumps(header).encode() + b"\n" + bytes(blob))
    return header


def _atomic_write(path: Path, data: bytes) -> None:
    # open(..., "x"), as `runs.rundir.atomic_write` does: the file gets the umask's
    # permissions (mkstemp's 0600 would keep the model from anyone the folder is shared with).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise JaxmnistError(f"{path}: cannot write ({e.strerror or e})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_export(path) -> tuple[dict, jax.export.Exported]:
    """(header, exported) from a file `export_model` wrote: the loader that
    docs/using-a-model.md shows."""
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        exported = jax.export.deserialize(bytearray(f.read()))
    return header, exported
