"""Exact evaluation: every example counts.

The evaluation set is padded to a whole number of batches once, when it is placed
on the device, with a mask marking the real examples; padded rows add nothing to
the loss sum, the correct count or the confusion matrix. One compiled call
evaluates the whole set with `lax.map` over its batches. A training run evaluates
several sets (test, validation, training) with one compiled program: each set is
placed as blocks of one shape, the same number of batches of the same size
(`block_shape`, `place_eval_blocks`), and the program runs once per block.

The host arrays handed to the device are 64-byte aligned (`data.formats.ALIGNMENT`),
so that on a CPU `jax.device_put` uses them in place instead of copying them; a set
that needs no padding is a reshaped view of the loaded array, so the training set's
evaluation shares the memory the training data already uses. The training set may be
evaluated on a fixed subset (`train.eval_train_examples`): stratified by class, drawn
once from `SUBSET_SEED`, the same examples every epoch and in `jaxmnist eval`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmnist.data import formats
from jaxmnist.models import apply_uint8

# The training subset's draw: one fixed seed, so that every run (every seed, point of a
# sweep, resume or `jaxmnist eval`) with the same N evaluates the same examples.
SUBSET_SEED = 0
# The eval sets a run of several members evaluates their ensemble on too: the test set and
# the validation split, never the training set.
ENSEMBLE_SETS = ("test", "val")


class EvalData(NamedTuple):
    images: jax.Array  # uint8 (num_batches, batch, H, W), zero-padded
    labels: jax.Array  # int32 (num_batches, batch), zero-padded
    mask: jax.Array  # bool (num_batches, batch): True for real examples


class PlacedEval(NamedTuple):
    """An evaluation set on the device(s), and how many of its rows are real."""

    arrays: EvalData
    count: int


class PlacedBlocks(NamedTuple):
    """An evaluation set on the device(s) as blocks of one shape (`place_eval_blocks`),
    and how many of its rows are real."""

    blocks: tuple[EvalData, ...]
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


def pad_eval_data(
    images: np.ndarray,
    labels: np.ndarray,
    batch_size: int,
    multiple: int = 1,
    indices: np.ndarray | None = None,
    rows: int | None = None,
) -> EvalData:
    """Pads to whole batches and reshapes to (num_batches, batch, ...).

    The batch is `batch_size` capped at the set size, then rounded up to a
    multiple of `multiple` (the devices a batch is split over); padded rows are
    masked out, so every real example counts exactly once. `indices` (int, (n,)):
    evaluate only those rows of `images` and `labels`, in that order. `rows`: pad to
    that many rows instead, in batches of exactly `batch_size` (`eval_blocks`).

    Every array returned is read-only and 64-byte aligned. Images that need neither
    padding nor selection are a view of `images` (aligned as loaded, else one aligned
    copy); otherwise they are gathered straight into one aligned buffer.
    """
    n = len(labels) if indices is None else len(indices)
    if rows is None:
        batch_size = -(-min(batch_size, n) // multiple) * multiple
        rows = -(-n // batch_size) * batch_size
    num_batches = rows // batch_size
    if rows == n and indices is None:
        padded = formats.aligned(images)
    else:
        padded = _aligned_zeros((rows, *images.shape[1:]), images.dtype)
        if indices is None:
            padded[:n] = images
        else:
            np.take(images, indices, axis=0, out=padded[:n])
    padded_labels = _aligned_zeros((rows,), np.int32)
    padded_labels[:n] = labels if indices is None else np.take(labels, indices)
    mask = _aligned_zeros((rows,), np.bool_)
    mask[:n] = True
    shape = (num_batches, batch_size)
    out = EvalData(
        padded.reshape(*shape, *images.shape[1:]), padded_labels.reshape(shape), mask.reshape(shape)
    )
    for x in out:
        x.flags.writeable = False
    return out


def block_shape(counts, batch_size: int, multiple: int = 1) -> tuple[int, int]:
    """(batch, batches per block) of the blocks sets of `counts` examples are evaluated in
    with one program (`place_eval_blocks`): batches of `batch_size`, capped at the largest
    set and rounded up to a multiple of `multiple` (the devices a batch is split over),
    and as many of them per block as the smallest set fills. Every set then pads to a
    whole number of blocks: the larger ones by less than a block."""
    counts = list(counts)
    batch = -(-min(batch_size, max(counts)) // multiple) * multiple
    return batch, min(-(-n // batch) for n in counts)


def eval_blocks(
    images: np.ndarray,
    labels: np.ndarray,
    batch: int,
    block_batches: int,
    indices: np.ndarray | None = None,
) -> tuple[EvalData, ...]:
    """The set as blocks of `block_batches` batches of `batch` rows (`block_shape`), padded
    and masked as `pad_eval_data` pads: views of one padded set, so that images needing
    neither padding nor selection stay a view of `images`."""
    n = len(labels) if indices is None else len(indices)
    rows = batch * block_batches
    whole = pad_eval_data(images, labels, batch, rows=-(-n // rows) * rows, indices=indices)
    return tuple(
        EvalData(*(x[i : i + block_batches] for x in whole))
        for i in range(0, len(whole.labels), block_batches)
    )


def _aligned_zeros(shape: tuple, dtype) -> np.ndarray:
    """A zeroed C-contiguous array whose data starts on a `formats.ALIGNMENT` boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.zeros(nbytes + formats.ALIGNMENT, np.uint8)
    start = -buf.ctypes.data % formats.ALIGNMENT
    return buf[start : start + nbytes].view(dtype).reshape(shape)


def subset_indices(labels: np.ndarray, n: int, seed: int = SUBSET_SEED) -> np.ndarray:
    """`n` of the examples whose labels are `labels` (int, (N,)), stratified by class:
    int64 (n,) indices, ascending.

    The examples are shuffled with `seed`, grouped by class (keeping the shuffled order
    within each class), and every (N/n)-th is taken; so each class gets its share of
    `n` to within one example, and the draw depends on `labels`, `n` and `seed` alone.
    """
    total = len(labels)
    order = np.random.default_rng(seed).permutation(total)
    by_class = order[np.argsort(labels[order], kind="stable")]
    picks = (np.arange(n) * total + total // 2) // n
    return np.sort(by_class[picks])


def train_eval_indices(train_cfg, labels: np.ndarray) -> np.ndarray | None:
    """The training examples a run evaluates after each epoch (`train.eval_train_examples`):
    a subset's indices (see `subset_indices`), or None for the whole training set. Call it
    only with `train_cfg.eval_train` set."""
    n = train_cfg.eval_train_examples
    if n is None or n >= len(labels):
        return None
    return subset_indices(labels, n)


def train_eval_facts(train_cfg, num_train: int) -> dict:
    """What a run records about its training-set evaluation, for its info, summary and
    metrics: `train_eval_examples` (how many examples `train_accuracy` and `train_set_loss`
    cover) and, for a subset, `train_eval_subset_seed`. Empty when it evaluates none."""
    if not train_cfg.eval_train:
        return {}
    n = train_cfg.eval_train_examples
    if n is None or n >= num_train:
        return {"train_eval_examples": num_train}
    return {"train_eval_examples": n, "train_eval_subset_seed": SUBSET_SEED}


def place_eval_data(
    images: np.ndarray,
    labels: np.ndarray,
    batch_size: int,
    layout=None,
    indices: np.ndarray | None = None,
) -> PlacedEval:
    """Pads (see `pad_eval_data`; `indices`: only those examples) and places a set: on
    the default device, or with each batch split over the `data` axis of a
    `parallel.Layout`."""
    count = len(labels) if indices is None else len(indices)
    if layout is None:
        data = pad_eval_data(images, labels, batch_size, indices=indices)
        return PlacedEval(EvalData(*jax.device_put(tuple(data))), count)
    data = pad_eval_data(images, labels, batch_size, layout.data, indices)
    placed = EvalData(*(layout.put(x, layout.eval_batches) for x in data))
    return PlacedEval(placed, count)


def place_eval_blocks(
    images: np.ndarray,
    labels: np.ndarray,
    shape: tuple[int, int],
    layout,
    indices: np.ndarray | None = None,
) -> PlacedBlocks:
    """The set's `eval_blocks` of `shape` (batch, batches per block: `block_shape`), each
    placed with its batches split over the `data` axis of a `parallel.Layout`."""
    count = len(labels) if indices is None else len(indices)
    blocks = eval_blocks(images, labels, *shape, indices=indices)
    placed = tuple(EvalData(*(layout.put(x, layout.eval_batches) for x in b)) for b in blocks)
    return PlacedBlocks(placed, count)


def make_evaluate(model_cfg, num_classes: int, log_probs: bool = False) -> Callable:
    """Returns the pure `evaluate(params, data: EvalData) -> EvalSums`; with `log_probs`,
    `(EvalSums, log_p)`, where log_p, float32 (num_batches, batch, C), is every example's
    log-softmax, from the same logits (what an ensemble adds up: `with_ensemble`)."""

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
            out = jnp.sum(jnp.where(mask, losses, 0.0)), confusion
            return (*out, jax.nn.log_softmax(logits, axis=-1)) if log_probs else out

        loss_sums, confusions, *log_p = jax.lax.map(batch_stats, tuple(data))
        confusion = confusions.sum(0)
        sums = EvalSums(loss_sums.sum(), jnp.trace(confusion), confusion)
        return (sums, log_p[0]) if log_probs else sums

    return evaluate


def with_ensemble(evaluate_members: Callable) -> Callable:
    """From `evaluate_members(params, data) -> (EvalSums, log_p)` over S members stacked on
    a leading axis (`make_evaluate` with `log_probs`, vmapped), the pure
    `(params, data) -> (EvalSums, log_sums)`: the members' sums, and for every example the
    log of their summed softmax probabilities, float32 (num_batches, batch, C). One pass
    over the set gives both. The `log_sums` of a population's chunks add with
    `jnp.logaddexp`, so chunks make one ensemble; `ensemble_sums` gives its figures."""

    def evaluate(params, data: EvalData):
        sums, log_p = evaluate_members(params, data)
        return sums, jax.nn.logsumexp(log_p, axis=0)

    return evaluate


def compile_evaluate(model_cfg, params: Any, data: PlacedEval, num_classes: int) -> Callable:
    """Compiles `make_evaluate` for these shapes; returns `(params, data) -> EvalResult`."""
    compiled = jax.jit(make_evaluate(model_cfg, num_classes)).lower(params, data.arrays).compile()
    count = data.count

    def run(params, data: PlacedEval) -> EvalResult:
        sums = jax.device_get(compiled(params, data.arrays))
        return result_of(sums, count)

    return run


def stacked_program(model_cfg, num_classes: int, ensemble: bool) -> Callable:
    """The jitted `(params, data: EvalData) -> EvalSums` of S models stacked on a leading
    axis, vmapped; with `ensemble`, `(EvalSums, log_sums)` (`with_ensemble`)."""
    members = jax.vmap(make_evaluate(model_cfg, num_classes, ensemble), in_axes=(0, None))
    return jax.jit(with_ensemble(members) if ensemble else members)


def evaluate_stacked(
    model_cfg,
    params: Any,
    data: PlacedEval,
    num_classes: int,
    ensemble: bool = False,
    chunks: int = 1,
    program: Callable | None = None,
) -> tuple[list[EvalResult], EvalResult | None]:
    """Evaluates S models whose parameters are stacked along a leading axis, in one
    vmapped call, or in `chunks` calls of S / chunks of them one after another: one
    EvalResult per model, and with `ensemble` the ensemble's (the mean of their softmax
    probabilities, from the same pass; the chunks' `log_sums` add), else None.
    `program`: `stacked_program`'s, compiled for a chunk, where the caller has it."""
    size = jax.tree.leaves(params)[0].shape[0]
    each = size // chunks
    program = program or stacked_program(model_cfg, num_classes, ensemble)
    outs = [
        program(jax.tree.map(lambda x, i=i: x[i * each : (i + 1) * each], params), data.arrays)
        for i in range(chunks)
    ]
    if not ensemble:
        sums = jax.device_get(outs)
        return [result_of(EvalSums(*m), data.count) for part in sums for m in zip(*part)], None
    parts, log_sums = zip(*outs)
    together, _ = jax.jit(ensemble_of_chunks, static_argnums=(1, 3))(
        list(log_sums), size, data.arrays, num_classes
    )
    parts, together = jax.device_get((parts, together))
    results = [result_of(EvalSums(*m), data.count) for part in parts for m in zip(*part)]
    return results, result_of(together, data.count)


def result_of(sums: EvalSums, count: int) -> EvalResult:
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


def predict_program(model_cfg, params: Any, images_shape: tuple, batch_size: int = 2000):
    """The compiled program `predict_probabilities` runs for `params` (arrays, or
    `jax.ShapeDtypeStruct`s with their shardings) on uint8 images of `images_shape`
    (N, H, W), compiled ahead: a run compiles the one for its saved predictions while
    it trains."""
    n, *shape = images_shape
    batch = min(batch_size, n)
    device = jax.tree.leaves(params)[0].sharding
    images = jax.ShapeDtypeStruct((-(-n // batch), batch, *shape), np.uint8, sharding=device)
    return _compiled_predict(model_cfg).lower(params, images).compile()


def predict_probabilities(
    model_cfg, params: Any, images_u8: np.ndarray, batch_size: int = 2000, program=None
) -> np.ndarray:
    """Softmax probabilities, float32 (N, C), for uint8 images (N, H, W) or (N, H*W).

    One jitted call over the padded batches (cached per model config), or `program`
    (`predict_program`'s, for these shapes); the padded rows are dropped before returning.
    """
    n = len(images_u8)
    data = pad_eval_data(np.asarray(images_u8), np.zeros(n, np.int32), batch_size)
    predict = program or _compiled_predict(model_cfg)
    probs = jax.device_get(predict(params, data.images))
    return np.asarray(probs, np.float32).reshape(-1, probs.shape[-1])[:n]


def ensemble_of_chunks(
    chunk_log_sums, members: int, data: EvalData, num_classes: int
) -> tuple[EvalSums, jax.Array]:
    """The ensemble of `members` members evaluated in chunks, from each chunk's `log_sums`
    (`with_ensemble`'s): its `EvalSums` (`ensemble_sums`) and every example's log of the
    mean probabilities, float32 (num_batches, batch, C). The chunks' probabilities add, so
    their logs add as `logaddexp`. Pure."""
    total = chunk_log_sums[0]
    for more in chunk_log_sums[1:]:
        total = jnp.logaddexp(total, more)
    return ensemble_sums(total, members, data, num_classes), total - jnp.log(members)


def ensemble_sums(log_sums: jax.Array, members: int, data: EvalData, num_classes: int) -> EvalSums:
    """The ensemble's `EvalSums` from its `members` members' summed probabilities
    (`log_sums`, as `with_ensemble` returns them, of every chunk together): its loss is
    the cross-entropy of the mean probabilities, its prediction their argmax. Pure."""
    log_p = log_sums - jnp.log(members)
    losses = -jnp.take_along_axis(log_p, data.labels[..., None], axis=-1)[..., 0]
    pred = jnp.argmax(log_p, axis=-1)
    confusion = (
        jnp.zeros((num_classes, num_classes), jnp.int32)
        .at[data.labels, pred]
        .add(data.mask.astype(jnp.int32))
    )
    return EvalSums(jnp.sum(jnp.where(data.mask, losses, 0.0)), jnp.trace(confusion), confusion)
