"""Exact evaluation: every example counts.

The evaluation set is padded to a whole number of batches once, when it is placed
on the device, with a mask marking the real examples; padded rows add nothing to
the loss sum, the correct count or the confusion matrix. One compiled call
evaluates the whole set with `lax.map` over its batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmnist.models import apply_uint8


class EvalData(NamedTuple):
    images: jax.Array  # uint8 (num_batches, batch, H, W), zero-padded
    labels: jax.Array  # int32 (num_batches, batch), zero-padded
    mask: jax.Array  # bool (num_batches, batch): True for real examples


class PlacedEval(NamedTuple):
    """An evaluation set on the device(s), and how many of its rows are real."""

    arrays: EvalData
    count: int


class EvalSums(NamedTuple):
    """What one evaluation adds up over a set's real examples (device arrays)."""

    loss_sum: jax.Array  # float32 (): summed softmax cross-entropy
    correct: jax.Array  # int32 ()
    confusion: jax.Array  # int32 (C, C): rows are true classes, columns predictions


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
    """Returns the pure `evaluate(params, data: EvalData) -> EvalSums`."""

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
        return EvalSums(loss_sums.sum(), jnp.trace(confusion), confusion)

    return evaluate


def compile_evaluate(model_cfg, params: Any, data: PlacedEval, num_classes: int) -> Callable:
    """Compiles `make_evaluate` for these shapes; returns `(params, data) -> EvalResult`."""
    compiled = jax.jit(make_evaluate(model_cfg, num_classes)).lower(params, data.arrays).compile()
    count = data.count

    def run(params, data: PlacedEval) -> EvalResult:
        sums = jax.device_get(compiled(params, data.arrays))
        return _result(sums, count)

    return run


def evaluate_stacked(
    model_cfg, params: Any, data: PlacedEval, num_classes: int
) -> list[EvalResult]:
    """Evaluates S models whose parameters are stacked along a leading axis, in one
    vmapped call; returns one EvalResult per model."""
    evaluate = jax.jit(jax.vmap(make_evaluate(model_cfg, num_classes), in_axes=(0, None)))
    sums = jax.device_get(evaluate(params, data.arrays))
    return [_result(EvalSums(*member), data.count) for member in zip(*sums)]


def _result(sums: EvalSums, count: int) -> EvalResult:
    """Means over the `count` real examples, from one model's sums on the host."""
    return EvalResult(
        float(sums.loss_sum) / count,
        int(sums.correct) / count,
        count,
        np.asarray(sums.confusion, np.int64),
    )


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
