"""Exact evaluation: every example counts.

The evaluation set is padded to a whole number of batches once, when it is placed
on the device, with a mask marking the real examples; padded rows add nothing to
the loss sum, the correct count or the confusion matrix. One compiled call
evaluates the whole set with `lax.map` over its batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmnist.errors import JaxmnistError
from jaxmnist.models import apply_uint8, get_model


class EvalData(NamedTuple):
    images: jax.Array  # uint8 (num_batches, batch, H, W), zero-padded
    labels: jax.Array  # int32 (num_batches, batch), zero-padded
    mask: jax.Array  # bool (num_batches, batch): True for real examples


class PlacedEval(NamedTuple):
    """An evaluation set on the device(s), and how many of its rows are real."""

    arrays: EvalData
    count: int


class EvalResult(NamedTuple):
    loss: float  # mean softmax cross-entropy over the real examples
    accuracy: float
    count: int  # number of real examples evaluated
    confusion: np.ndarray  # int64 (C, C): rows are true classes, columns predictions


def pad_eval_data(images: np.ndarray, labels: np.ndarray, batch_size: int, multiple: int = 1):
    """Pads to whole batches and reshapes to (num_batches, batch, ...).

    The batch is `batch_size` capped at the set size, then rounded up to a
    multiple of `multiple` (the devices a batch is split over); padded rows are
    masked out, so every real example counts exactly once.
    """
    n = len(labels)
    batch_size = -(-min(batch_size, n) // multiple) * multiple
    num_batches = -(-n // batch_size)
    pad = num_batches * batch_size - n
    images = np.concatenate([images, np.zeros((pad, *images.shape[1:]), images.dtype)])
    labels = np.concatenate([labels.astype(np.int32), np.zeros(pad, np.int32)])
    mask = np.arange(num_batches * batch_size) < n
    shape = (num_batches, batch_size)
    return EvalData(
        images.reshape(*shape, *images.shape[1:]), labels.reshape(shape), mask.reshape(shape)
    )


def place_eval_data(
    images: np.ndarray, labels: np.ndarray, batch_size: int, layout=None
) -> PlacedEval:
    """Pads (see `pad_eval_data`) and places a set: on the default device, or with
    each batch split over the `data` axis of a `parallel.Layout`."""
    if layout is None:
        data = pad_eval_data(images, labels, batch_size)
        return PlacedEval(EvalData(*jax.device_put(tuple(data))), len(labels))
    data = pad_eval_data(images, labels, batch_size, layout.data)
    placed = EvalData(*(layout.put(x, layout.eval_batches) for x in data))
    return PlacedEval(placed, len(labels))


def make_evaluate(model_cfg, num_classes: int) -> Callable:
    """Returns the pure `evaluate(params, data: EvalData) -> (loss_sum, correct, confusion)`."""

    def evaluate(params, data: EvalData):
        def batch_stats(batch):
            images, labels, mask = batch
            logits = apply_uint8(params, images, model_cfg)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            pred = jnp.argmax(logits, -1)
            weight = mask.astype(jnp.int32)
            confusion = (
                jnp.zeros((num_classes, num_classes), jnp.int32).at[labels, pred].add(weight)
            )
            return jnp.sum(jnp.where(mask, losses, 0.0)), confusion

        loss_sums, confusions = jax.lax.map(batch_stats, tuple(data))
        confusion = confusions.sum(0)
        return loss_sums.sum(), jnp.trace(confusion), confusion

    return evaluate


def compile_evaluate(model_cfg, params: Any, data: PlacedEval, num_classes: int) -> Callable:
    """Compiles `make_evaluate` for these shapes; returns `(params, data) -> EvalResult`."""
    compiled = jax.jit(make_evaluate(model_cfg, num_classes)).lower(params, data.arrays).compile()
    count = data.count

    def run(params, data: PlacedEval) -> EvalResult:
        loss_sum, correct, confusion = jax.device_get(compiled(params, data.arrays))
        return EvalResult(
            float(loss_sum) / count, int(correct) / count, count, np.asarray(confusion, np.int64)
        )

    return run


def evaluate_stacked(
    model_cfg, params: Any, data: PlacedEval, num_classes: int
) -> list[EvalResult]:
    """Evaluates S models whose parameters are stacked along a leading axis, in one
    vmapped call; returns one EvalResult per model."""
    evaluate = jax.jit(jax.vmap(make_evaluate(model_cfg, num_classes), in_axes=(0, None)))
    loss_sums, correct, confusion = jax.device_get(evaluate(params, data.arrays))
    count = data.count
    return [
        EvalResult(float(ls) / count, int(c) / count, count, np.asarray(m, np.int64))
        for ls, c, m in zip(loss_sums, correct, confusion)
    ]


@functools.lru_cache(maxsize=16)
def _compiled_predict(model_cfg) -> Callable:
    def predict(
        params, images
    ):  # uint8 (num_batches, batch, H, W) -> float32 (num_batches, batch, C)
        def batch_probs(x):
            return jax.nn.softmax(apply_uint8(params, x, model_cfg), axis=-1)

        return jax.lax.map(batch_probs, images)

    return jax.jit(predict)


def predict_probabilities(
    model_cfg, params: Any, images_u8: np.ndarray, batch_size: int = 2000
) -> np.ndarray:
    """Softmax probabilities, float32 (N, C), for uint8 images (N, H, W) or (N, H*W).

    One jitted call over the padded batches (cached per model config); the padded
    rows are dropped before returning.
    """
    n = len(images_u8)
    data = pad_eval_data(np.asarray(images_u8), np.zeros(n, np.int32), batch_size)
    probs = jax.device_get(_compiled_predict(model_cfg)(params, data.images))
    return np.asarray(probs, np.float32).reshape(-1, probs.shape[-1])[:n]


def _recorded_folder(recorded: dict | None, cfg):
    """The folder training read its data from (the run's data.json), if it still has it."""

    from jaxmnist.data import get_spec
    from jaxmnist.data.locate import scan

    if not recorded or recorded.get("dataset") != cfg.data.dataset or not recorded.get("folder"):
        return None
    folder = Path(recorded["folder"])
    return folder if scan(get_spec(cfg.data.dataset), folder).usable else None


def _check_same_data(recorded: dict | None, dataset, run_dir) -> None:
    """DataError if the run was trained on data with other checksums than `dataset`'s."""
    from jaxmnist.errors import DataError

    if not recorded or not isinstance(recorded.get("sha256"), dict):
        return
    now = {f.name: f.sha256 for f in dataset.spec.files}
    if recorded["sha256"] != now:
        raise DataError(
            f"{run_dir}: trained on {recorded.get('dataset')} data with other checksums than "
            f"{dataset.source} has; evaluating it there would not measure the same thing"
        )


def evaluate_run(run_dir, data_dir=None) -> dict:
    """Re-evaluates a run directory's saved parameters on the test and training sets.

    The data is looked for in `data_dir`, then where training read it (the run's
    data.json), then where `load_dataset` looks.

    A run of several seeds (parameters stacked along a leading seed axis) is
    evaluated seed by seed: the figures are means, with per-seed lists, and the
    confusion matrix is the first seed's.
    """
    from jaxmnist import config as config_lib
    from jaxmnist.data import load_dataset
    from jaxmnist.runs import checkpoint, rundir

    path = rundir.Path(run_dir)
    unfinished = not (path / "summary.json").exists() and checkpoint.checkpoint_steps(path)
    run = _read_config(path) if unfinished else rundir.read_run(run_dir)
    try:
        cfg = config_lib.from_dict(run["config"])
    except Exception as e:  # noqa: BLE001 -- a hand-edited or foreign config.json
        raise rundir.JaxmnistError(f"{run_dir}/config.json: not a jaxmnist config ({e})") from None
    recorded = rundir.read_data_record(run_dir)
    dataset = load_dataset(
        cfg.data.dataset,
        data_dir or _recorded_folder(recorded, cfg) or cfg.data.data_dir,
        download=cfg.data.download,
    )
    _check_same_data(recorded, dataset, run_dir)
    num_classes = len(dataset.spec.class_names)
    seeds = cfg.train.seeds
    where = {}
    if unfinished:  # the newest intact checkpoint's parameters
        params, where = _checkpoint_params(path, cfg, dataset)
        if seeds == 1:
            params = jax.tree.map(lambda x: x[0], params)
    else:
        init = get_model(cfg.model.name).init
        like = jax.eval_shape(
            lambda: init(jax.random.key(0), cfg.model, dataset.test_images.shape[1:], num_classes)
        )
        if seeds > 1:
            like = jax.tree.map(lambda x: jax.ShapeDtypeStruct((seeds, *x.shape), x.dtype), like)
        params = jax.device_put(rundir.load_params(path / rundir.PARAMS_FILE, like))
    test_set = place_eval_data(dataset.test_images, dataset.test_labels, cfg.train.eval_batch_size)
    if seeds > 1:
        return {**_evaluate_seeds(run_dir, cfg, dataset, params, test_set, num_classes), **where}
    test = compile_evaluate(cfg.model, params, test_set, num_classes)(params, test_set)
    train_set = place_eval_data(
        dataset.train_images, dataset.train_labels, cfg.train.eval_batch_size
    )
    train = compile_evaluate(cfg.model, params, train_set, num_classes)(params, train_set)
    return {
        "run_dir": str(run_dir),
        "dataset": dataset.spec.name,
        "test_accuracy": test.accuracy,
        "test_loss": test.loss,
        "num_test_examples": test.count,
        "train_accuracy": train.accuracy,
        "train_loss": train.loss,
        "num_train_examples": train.count,
        "class_names": list(dataset.spec.class_names),
        "confusion_matrix": test.confusion.tolist(),
        **where,
    }


def _read_config(path) -> dict:
    import json

    try:
        return {"config": json.loads((path / "config.json").read_text())}
    except (OSError, ValueError) as e:
        raise JaxmnistError(f"{path / 'config.json'}: cannot read the run's config ({e})") from None


def _checkpoint_params(path, cfg, dataset) -> tuple[Any, dict]:
    """Every member's parameters (member axis first) from an unfinished run's newest intact
    checkpoint, on the default device; and {"checkpoint_step", "checkpoint_epoch"}."""
    from jaxmnist.runs import checkpoint

    return checkpoint.newest_params(
        path,
        cfg,
        len(dataset.train_labels),
        dataset.train_images.shape[1:],
        len(dataset.spec.class_names),
    )


def _evaluate_seeds(run_dir, cfg, dataset, params, test_set, num_classes: int) -> dict:
    train_set = place_eval_data(
        dataset.train_images, dataset.train_labels, cfg.train.eval_batch_size
    )
    test = evaluate_stacked(cfg.model, params, test_set, num_classes)
    train = evaluate_stacked(cfg.model, params, train_set, num_classes)
    return {
        "run_dir": str(run_dir),
        "dataset": dataset.spec.name,
        "test_accuracy": float(np.mean([r.accuracy for r in test])),
        "test_loss": float(np.mean([r.loss for r in test])),
        "num_test_examples": test[0].count,
        "train_accuracy": float(np.mean([r.accuracy for r in train])),
        "train_loss": float(np.mean([r.loss for r in train])),
        "num_train_examples": train[0].count,
        "seeds": [cfg.train.seed + i for i in range(cfg.train.seeds)],
        "test_accuracy_per_seed": [r.accuracy for r in test],
        "test_loss_per_seed": [r.loss for r in test],
        "train_accuracy_per_seed": [r.accuracy for r in train],
        "class_names": list(dataset.spec.class_names),
        "confusion_matrix": test[0].confusion.tolist(),
    }
