"""The pure training core: state, one step, and the compiled epoch.

Everything here is a pure function of its arguments, with no I/O, no devices and
no notion of seeds or files, so that `jaxmnist.population` can run it for one
model, `vmap` it over many, and shard it over a mesh without rewriting it.

An epoch is `train_epoch(state, key, data) -> (state, EpochMetrics)`: a fresh
permutation of the training set drawn on the device from `key`, then `lax.scan`
over the steps. Images stay uint8 `(N, H, W)` on the device and are scaled to
[0, 1] inside the step (`models.apply_uint8`). Whoever runs the epoch on a mesh
passes `shard_batch`, which constrains each gathered batch to be split over the
mesh's `data` axis; the compiler then inserts the gradient all-reduce itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxmnist.data.augment import augment
from jaxmnist.models import apply_uint8, get_model


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: Any
    opt_state: Any


class EpochMetrics(NamedTuple):
    loss: jax.Array  # float32 (num_steps,): mean training loss of each step's batch
    correct: jax.Array  # int32 (): training examples classified right, over the epoch


class TrainData(NamedTuple):
    images: jax.Array  # uint8 (N, H, W), on the device
    labels: jax.Array  # int32 (N,)


def init_state(key, cfg, optimizer, input_shape, num_classes) -> TrainState:
    """A fresh state: the model's `init` (cfg: Config) and the optimizer's state."""
    params = get_model(cfg.model.name).init(key, cfg.model, tuple(input_shape), num_classes)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def make_train_step(cfg, optimizer) -> Callable:
    """Returns `step(state, images_u8 (B, H, W), labels (B,)) -> (state, (loss, correct))`."""

    def loss_fn(params, images, labels):
        logits = apply_uint8(params, images, cfg.model)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, logits

    def step(state: TrainState, images, labels):
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, images, labels
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        correct = jnp.sum(jnp.argmax(logits, -1) == labels, dtype=jnp.int32)
        return TrainState(state.step + 1, params, opt_state), (loss, correct)

    return step


def epoch_indices(key, num_examples: int, batch_size: int, num_steps: int) -> jax.Array:
    """A fresh permutation, cut into `num_steps` batches (the remainder is dropped)."""
    perm = jax.random.permutation(key, num_examples)
    return perm[: num_steps * batch_size].reshape(num_steps, batch_size)


def make_train_epoch(
    cfg,
    optimizer,
    num_steps: int,
    progress: Callable[[Any], None] | None = None,
    progress_every: int = 0,
    shard_batch: Callable[[jax.Array], jax.Array] | None = None,
) -> Callable:
    """Returns the pure `train_epoch(state, key, data) -> (state, EpochMetrics)`.

    With `progress`, the device reports the number of steps done every
    `progress_every` steps through a host callback; the scan is split into chunks
    so that no per-step condition or host synchronisation is needed.
    `shard_batch(x)` is applied to each gathered batch (images and labels), e.g. a
    sharding constraint; identity when None.
    """
    step = make_train_step(cfg, optimizer)
    batch_size = cfg.train.batch_size
    shard = shard_batch or (lambda x: x)
    augmenting = cfg.data.augment

    def run_steps(state, batches, data: TrainData):
        """batches: (indices (S, B),) or, augmenting, (indices, raw keys (S, 2))."""

        def body(state, batch):
            batch_idx = shard(batch[0])
            images = shard(data.images[batch_idx])
            if augmenting:  # each step its own key: each image its own move
                images = shard(augment(jax.random.wrap_key_data(batch[1]), images, cfg.data))
            return step(state, images, shard(data.labels[batch_idx]))

        return jax.lax.scan(body, state, batches)

    def train_epoch(state: TrainState, key, data: TrainData):
        idx = epoch_indices(key, data.images.shape[0], batch_size, num_steps)
        batches = (idx,)
        if augmenting:  # the permutation keeps `key` itself, as without augmentation
            keys = jax.random.split(jax.random.fold_in(key, 1), num_steps)
            batches = (idx, jax.random.key_data(keys))
        if progress is None:
            state, (loss, correct) = run_steps(state, batches, data)
            return state, EpochMetrics(loss, correct.sum())
        every = progress_every or max(1, num_steps // 20)
        chunks, rest = divmod(num_steps, every)

        def chunk(state, chunk_idx):
            state, out = run_steps(state, chunk_idx, data)
            jax.debug.callback(progress, state.step)
            return state, out

        head = jax.tree.map(lambda x: x[: chunks * every].reshape(chunks, every, -1), batches)
        state, (loss, correct) = jax.lax.scan(chunk, state, head)
        loss, correct = loss.reshape(-1), correct.reshape(-1)
        if rest:
            tail = jax.tree.map(lambda x: x[chunks * every :], batches)
            state, (loss_r, correct_r) = chunk(state, tail)
            loss, correct = jnp.concatenate([loss, loss_r]), jnp.concatenate([correct, correct_r])
        return state, EpochMetrics(loss, correct.sum())

    return train_epoch
