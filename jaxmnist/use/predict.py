"""Using a trained run on people's own inputs: load it, read the inputs, predict top-k classes.

`load_trained` makes a run directory (`runs.reader.open_run`) a model (config,
parameters, class names); `predict`, `export` and `serve` all start there. A run
of several seeds is used as the ensemble of its members (the mean of their softmax
probabilities, their parameters stacked along a leading member axis), or as one
member (`member`, `--member I`); `TrainedModel.describe` says which. Inputs are image
files (anything Pillow reads, made MNIST-like by `jaxmnist.use.preprocess`) or
`.npy`/`.npz` arrays already in the model's format. One bad input becomes one
error record naming it; it never stops the others.
"""

from __future__ import annotations

import re
import sys
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist.data.registry import DatasetSpec, get_spec
from jaxmnist.errors import DataError, JaxmnistError
from jaxmnist.models import apply_uint8, count_params, get_model
from jaxmnist.models.ensemble import ensemble_log_probs
from jaxmnist.runs.reader import open_run
from jaxmnist.use import chunks as chunks_lib
from jaxmnist.use import preprocess
from jaxmnist.use.members import choose_member, describe_ensemble

ARRAY_SUFFIXES = (".npy", ".npz")
CLI_BATCH = 256  # predict's one compiled batch size: the last batch is padded


class TrainedModel(NamedTuple):
    run_dir: Path
    config: config_lib.Config
    # One member's parameter pytree, or for an ensemble every member's stacked along a
    # leading member axis: what `probabilities_fn(config.model, ensemble)` takes.
    params: Any
    dataset: str
    display_name: str
    class_names: tuple[str, ...]
    image_shape: tuple[int, int]
    seed: int  # the member's seed; an ensemble's first
    seeds: int  # models (members) the run trained
    test_accuracy: float | None  # this model's, from summary.json (None if absent)
    member: int | None = 0  # the member used (0-based); None: the ensemble of all `seeds`
    # Device memory an ensemble may use (`--memory-budget-mb`); None: the run's setting,
    # else the device's free memory (`use.chunks.budget`)
    memory_budget_mb: int | None = None

    @property
    def ensemble(self) -> bool:
        return self.member is None

    @property
    def members(self) -> int:
        """How many models this model combines: `seeds` for an ensemble, else 1."""
        return self.seeds if self.ensemble else 1

    def which(self) -> str:
        """Which of the run's models this is, in words: `seed 0` (a run of one),
        `seed 5, member 1 of the run's 3` or `ensemble of 3: ..., seeds 4-6`."""
        if self.ensemble:
            return (
                f"{describe_ensemble(self.seeds)}, seeds {self.seed}-{self.seed + self.seeds - 1}"
            )
        if self.seeds > 1:
            return f"seed {self.seed}, member {self.member} of the run's {self.seeds}"
        return f"seed {self.seed}"

    def describe(self) -> str:
        """One line: the model, its data, its run, `which` and its test accuracy."""
        which = self.which()
        acc = "" if self.test_accuracy is None else f", test accuracy {self.test_accuracy:.2%}"
        return (
            f"{self.config.model.name} trained on {self.display_name} "
            f"({self.run_dir}, {which}{acc})"
        )

    def info(self) -> dict:
        """What the model is, as JSON-ready values (the API's and the export's header).
        `num_params` is one member's; `ensemble` is null for one model, else its size,
        seeds and how it combines them."""
        ensemble = None
        if self.ensemble:
            ensemble = {
                "members": self.seeds,
                "seeds": list(range(self.seed, self.seed + self.seeds)),
                "combined": describe_ensemble(self.seeds),
            }
        return {
            "model": self.config.model.name,
            "description": get_model(self.config.model.name).describe(self.config.model),
            "model_config": self.config.to_dict()["model"],
            "num_params": count_params(self.params) // self.members,
            "dataset": self.dataset,
            "display_name": self.display_name,
            "class_names": list(self.class_names),
            "input_shape": list(self.image_shape),
            "run_dir": str(self.run_dir),
            "seed": self.seed,
            "seeds_in_run": self.seeds,
            "member": self.member,
            "ensemble": ensemble,
            "which": self.which(),
            "test_accuracy": self.test_accuracy,
        }


def load_trained(
    run_dir, member: str | int | None = None, memory_budget_mb: int | None = None
) -> TrainedModel:
    """The model of a run directory, read by `runs.reader.open_run` (its errors: exit 2
    for no run, 1 for a corrupt one): the ensemble of a run of several seeds, or member
    `member` (0-based: `use.members.choose_member`, ConfigError for a bad one). An
    unfinished run is read from its newest intact checkpoint, and stderr says which.
    `memory_budget_mb`: what an ensemble's program may use (`use.chunks`)."""
    run = open_run(run_dir)
    index = choose_member(member, run.members)
    if not run.finished:
        print(f"jaxmnist: {run.path} has not finished: using {run.source}", file=sys.stderr)
    spec, cfg = run.spec, run.config
    summary = run.summary() or {}
    per_seed = summary.get("test_accuracy_per_seed")
    if index is None:
        params, seed = run.params, cfg.train.seed
        accuracy = summary.get("ensemble_test_accuracy")
    else:
        params, seed = run.member_params(index), cfg.train.seed + index
        accuracy = float(per_seed[index]) if per_seed else summary.get("test_accuracy")
    return TrainedModel(
        run.path,
        cfg,
        jax.device_put(params),
        spec.name,
        spec.display_name,
        tuple(spec.class_names),
        tuple(spec.image_shape),
        seed,
        run.members,
        accuracy,
        index,
        memory_budget_mb,
    )


def probabilities_fn(model_cfg, ensemble: bool = False, chunks: int = 1) -> Callable:
    """The pure `(params, images uint8 (B, H, W[, C])) -> probabilities float32 (B, C)` of
    one model, or with `ensemble` of the members stacked on `params`' leading axis: the
    mean of their softmax probabilities (`models.ensemble.ensemble_log_probs`, the
    figure `jaxmnist eval` and training count), one function with the members vmapped,
    `chunks` of them at a time (`use.chunks`)."""

    def probabilities(params, images):
        return jax.nn.softmax(apply_uint8(params, images, model_cfg), axis=-1)

    def ensemble_probabilities(params, images):
        return jnp.exp(ensemble_log_probs(model_cfg, params, images, chunks))

    return ensemble_probabilities if ensemble else probabilities


def compile_probabilities(model: TrainedModel, params, images) -> tuple[Any, int]:
    """(`probabilities_fn`'s program compiled for `params` and `images` (arrays or shapes),
    how many chunks an ensemble's members run in): as few as fit the model's memory budget
    (`use.chunks`); one model, or an unknown budget, in one."""

    def compiled_in(chunks: int):
        if chunks not in programs:
            fn = probabilities_fn(model.config.model, model.ensemble, chunks)
            programs[chunks] = jax.jit(fn).lower(params, images).compile()
        return programs[chunks]

    programs: dict = {}
    if not model.ensemble:
        return compiled_in(1), 1
    limit, source = chunks_lib.budget(model.config, model.memory_budget_mb)
    footprint = lambda c: chunks_lib.program_bytes(compiled_in(c))
    chunks = chunks_lib.fewest_chunks(model.seeds, footprint, limit, source)
    return compiled_in(chunks), chunks


def compile_predict(model: TrainedModel, batch_size: int) -> Callable[[np.ndarray], np.ndarray]:
    """Compiles now, for one fixed batch size, and returns `images uint8 (N, H, W) ->
    probabilities float32 (N, C)` for any N: batches are padded to `batch_size`, so
    no call ever compiles again. An ensemble's members run in as few chunks as fit its
    memory budget (`compile_probabilities`); the function's `chunks` says how many."""
    shape = jax.ShapeDtypeStruct((batch_size, *model.image_shape), jnp.uint8)
    compiled, chunks = compile_probabilities(model, model.params, shape)

    def run(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, np.uint8)
        out = []
        for start in range(0, len(images), batch_size):
            batch = images[start : start + batch_size]
            padded = np.zeros((batch_size, *model.image_shape), np.uint8)
            padded[: len(batch)] = batch
            out.append(np.asarray(compiled(model.params, padded))[: len(batch)])
        return np.concatenate(out) if out else np.zeros((0, len(model.class_names)), np.float32)

    run.chunks = chunks
    return run


class Item(NamedTuple):
    name: str  # the file, with [i] or :key[i] for an array's entries
    image: np.ndarray | None  # uint8 spec.image_shape: what the model sees; None on error
    error: str | None = None


def _array_items(path: Path, image_shape: tuple[int, ...]) -> list[Item]:
    """The images of an .npy/.npz file: arrays (N, *image_shape) or one `image_shape`."""
    name, shape = str(path), tuple(image_shape)
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                arrays = {k: loaded[k] for k in loaded.files}
        else:
            arrays = {"": loaded}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(f"{name}: cannot read as a NumPy file ({e})") from None
    # An .npz may hold labels beside the images (Keras's mnist.npz): use the image arrays.
    images = {k: a for k, a in arrays.items() if a.shape[-len(shape) :] == shape}
    if not images:
        shapes = ", ".join(f"{k or 'array'} {a.shape}" for k, a in arrays.items())
        dims = ", ".join(map(str, shape))
        raise DataError(f"{name}: no (N, {dims}) or ({dims}) array in it ({shapes or 'empty'})")
    items = []
    for key, array in images.items():
        label = f"{name}:{key}" if key else name
        batch = preprocess.as_model_input(array, label, shape)
        if array.ndim == len(shape):
            items.append(Item(label, batch[0]))
        else:
            items.extend(Item(f"{label}[{i}]", image) for i, image in enumerate(batch))
    return items


def read_inputs(
    paths: Sequence[str], preprocess_images: bool = True, dataset: str | DatasetSpec = "mnist"
) -> list[Item]:
    """Every input's model-ready image, uint8 of `dataset`'s image shape (image files made
    like its images, or fed as they are without `preprocess_images`; arrays as they are),
    or its error, in the order given."""
    spec = get_spec(dataset)
    items = []
    for p in paths:
        path = Path(p)
        try:
            if path.is_dir():
                raise DataError(f"{p}: is a directory")
            if path.suffix.lower() in ARRAY_SUFFIXES:
                items.extend(_array_items(path, spec.image_shape))
                continue
            try:
                data = path.read_bytes()
            except OSError as e:
                raise DataError(f"{p}: cannot read ({e.strerror or e})") from None
            image = preprocess.image_to_model_input(data, p, preprocess_images, spec)
            items.append(Item(p, image))
        except DataError as e:
            items.append(Item(p, None, str(e)))
    return items


def top_k(probs: np.ndarray, class_names: Sequence[str], k: int) -> list[dict]:
    """The `k` likeliest classes of one probability vector (C,), likeliest first."""
    order = np.argsort(-probs, kind="stable")[:k]
    return [
        {"class": int(i), "name": class_names[i], "probability": float(probs[i])} for i in order
    ]


def predict_items(model: TrainedModel, items: list[Item], k: int) -> list[dict]:
    """One record per item: {"input", "top": [...]} or {"input", "error"}; a record of an
    input that is black after preprocessing also has {"warning": preprocess.NO_INK}."""
    good = [it for it in items if it.error is None]
    probs = compile_predict(model, min(CLI_BATCH, max(1, len(good))))(
        np.stack([it.image for it in good]) if good else np.zeros((0, *model.image_shape))
    )
    found = iter(probs)
    records = []
    for it in items:
        if it.error:
            records.append({"input": it.name, "error": it.error})
            continue
        record = {"input": it.name, "top": top_k(next(found), model.class_names, k)}
        if not preprocess.has_ink(it.image):
            record["warning"] = preprocess.NO_INK
        records.append(record)
    return records


def write_inputs(folder: Path, items: list[Item]) -> list[Path]:
    """Each good item's model input as a PNG (grayscale or RGB), numbered in input order."""
    written = []
    for i, it in enumerate(items, 1):
        if it.image is None:
            continue
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(it.name).name)[-80:]
        out = folder / f"{i:04d}-{stem}.png"
        try:
            out.write_bytes(preprocess.to_png(it.image))
        except OSError as e:
            raise JaxmnistError(f"{out}: cannot write ({e.strerror or e})") from None
        written.append(out)
    return written


def format_table(records: list[dict]) -> str:
    """The good records as an aligned table: input, then each top class and probability."""
    rows = [
        [r["input"], *(f"{t['name']} {t['probability']:.1%}" for t in r["top"])]
        for r in records
        if "top" in r
    ]
    if not rows:
        return ""
    k = max(len(r) for r in rows) - 1
    header = ["input", *(f"top-{i}" for i in range(1, k + 1))]
    rows.insert(0, header)
    widths = [max(len(r[c]) for r in rows if c < len(r)) for c in range(k + 1)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)
