"""The pure training core: state, one step, and the compiled epoch.

Everything here is a pure function of its arguments, with no I/O, no devices and
no notion of seeds or files, so that `jaxmnist.training.population` can run it for one
model, `vmap` it over many, and shard it over a mesh without rewriting it.

An epoch is a plan and its steps. `plan(key) -> EpochPlan` draws a fresh
permutation of the training set (and each step's key for
augmentation and dropout); `train_steps(state, metrics, plan, data, start, stop)` runs steps
`start .. stop - 1` of it in one compiled loop, recording each step's loss in
`metrics`. The run loop calls it for a whole short epoch at once, or for parts
of about a second of a long one, with the same result either way;
`make_train_epoch` composes both into the one-call epoch the tutorials compile.
Images stay uint8 `(N, H, W)` on the device and are scaled to [0, 1] inside the
step (`models.train_apply_uint8`). A step gathers its batch from the training set
(`make_batch`), or, where the plan was drawn staged, takes it from the plan, which then
holds every step's images in order (gathered where the plan was drawn: on a TPU, the
host's CPU); either way the batch is the same. A plan may also be staged with its batches
augmented already, by a program of their own (`make_augmented_batches`), again the
same batches. Whoever runs the epoch on a mesh passes
`shard_batch`, which constrains each gathered batch to be split over the mesh's
`data` axis; the compiler then inserts the gradient all-reduce itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxmnist.data.augment import augment
from jaxmnist.models import get_model, train_apply_uint8
from jaxmnist.models.layers import STATS
from jaxmnist.training import shuffle

DROPOUT_STREAM = 0x64726F70  # fold_in data for dropout's key ("drop"), far from split indices


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: Any
    opt_state: Any
    ema: Any = None  # the parameters' moving average (`train.ema_decay`); None: none


def model_params(state: TrainState):
    """The parameters a state's model is evaluated, saved and used with: the moving
    average where the run keeps one (`train.ema_decay`), else the trained ones."""
    return state.params if state.ema is None else state.ema


def ema_decay_at(decay: float, step) -> jax.Array:
    """The decay of the moving average's update after `step` steps: `decay`, or less while
    few steps are averaged, (1 + step) / (10 + step) (as TensorFlow's
    `ExponentialMovingAverage` with `num_updates`), so that the average leaves the
    initial parameters behind within the first few hundred steps."""
    return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


class EpochMetrics(NamedTuple):
    loss: jax.Array  # float32 (num_steps,): mean training loss of each step's batch
    correct: jax.Array  # int32 (): training examples classified right, over the steps run


class TrainData(NamedTuple):
    images: jax.Array  # uint8 (N, H, W), on the device
    labels: jax.Array  # int32 (N,)


def init_state(key, cfg, optimizer, input_shape, num_classes) -> TrainState:
    """A fresh state: the model's `init` (cfg: Config) and the optimizer's state."""
    params = get_model(cfg.model.name).init(key, cfg.model, tuple(input_shape), num_classes)
    ema = jax.tree.map(jnp.copy, params) if cfg.train.ema_decay else None
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), ema)


def make_train_step(cfg, optimizer) -> Callable:
    """Returns `step(state, images_u8 (B, H, W), labels (B,), key=None) -> (state, (loss,
    correct))`; `key` is dropout's (`model.dropout`), None for none. With
    `train.label_smoothing` a > 0 the loss is the batch's mean cross-entropy against
    `optax.smooth_labels` targets (a / C on each of the C classes, 1 - a + a / C on the label).
    With `train.ema_decay` the state's moving average follows the parameters after each
    step (`ema_decay_at`)."""

    smoothing, decay = cfg.train.label_smoothing, cfg.train.ema_decay

    def loss_fn(params, images, labels, key):
        logits, stats = train_apply_uint8(params, images, cfg.model, key)
        if smoothing:  # the training loss only; evaluation keeps the plain cross-entropy
            targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), smoothing)
            loss = optax.softmax_cross_entropy(logits, targets).mean()
        else:  # 0 keeps the integer-label program exactly as it was
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, (logits, stats)

    def step(state: TrainState, images, labels, key=None):
        (loss, (logits, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, images, labels, key
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if stats is not None:  # running statistics: moved by the batch, not by the optimizer
            params = {**params, STATS: stats}
        ema = state.ema
        if ema is not None:  # after the step, statistics included; it never steers training
            d = ema_decay_at(decay, state.step.astype(jnp.float32))
            ema = optax.incremental_update(params, ema, 1.0 - d)  # d * ema + (1 - d) * params
        correct = jnp.sum(jnp.argmax(logits, -1) == labels, dtype=jnp.int32)
        return TrainState(state.step + 1, params, opt_state, ema), (loss, correct)

    return step


def epoch_indices(
    key, num_examples: int, batch_size: int, num_steps: int, platform: str | None = None
) -> jax.Array:
    """A fresh permutation, cut into `num_steps` batches (the remainder is dropped);
    `platform`: where it is drawn (`shuffle.permutation`)."""
    perm = shuffle.permutation(key, num_examples, platform)  # jax.random.permutation's
    return perm[: num_steps * batch_size].reshape(num_steps, batch_size)


class EpochPlan(NamedTuple):
    """What an epoch's steps read, drawn once from the epoch's key; staged, every step's
    batch too (`make_epoch_plan`)."""

    indices: jax.Array  # int32 (num_steps, batch): the examples of each step's batch
    keys: jax.Array | None  # uint32 (num_steps, 2): raw keys of augmentation and dropout
    images: jax.Array | None = None  # uint8 (num_steps, batch, H, W): staged, as gathered
    labels: jax.Array | None = None  # int32 (num_steps, batch): their labels


def make_epoch_plan(
    cfg, num_examples: int, num_steps: int, platform: str | None = None, staged: bool = False
) -> Callable:
    """Returns `plan(key) -> EpochPlan` for epochs of `num_steps` (a full epoch's count:
    a shorter last epoch runs the first steps of the same plan); `platform`: where the
    plan is drawn, by default JAX's default backend. The plan is the same on any.
    `staged`: `plan(key, data) -> EpochPlan` with every step's images and labels gathered
    from `data` (`step.TrainData`), before augmentation, for `make_train_steps(staged=True)`."""

    def plan(key, data=None) -> EpochPlan:
        idx = epoch_indices(key, num_examples, cfg.train.batch_size, num_steps, platform)
        keys = None
        if cfg.data.augment or cfg.model.dropout:
            # Each step its own key; the permutation keeps `key` itself, as without augmentation.
            keys = jax.random.key_data(jax.random.split(jax.random.fold_in(key, 1), num_steps))
        if not staged:
            return EpochPlan(idx, keys)
        n, *shape = data.images.shape
        images = data.images.reshape(n, -1)[idx.reshape(-1)].reshape(*idx.shape, *shape)
        return EpochPlan(idx, keys, images, data.labels[idx])

    return plan


def empty_metrics(num_steps: int) -> EpochMetrics:
    """The accumulator an epoch starts from: no losses recorded, nothing right."""
    return EpochMetrics(jnp.zeros((num_steps,), jnp.float32), jnp.zeros((), jnp.int32))


def make_batch(
    cfg,
    shard_batch: Callable[[jax.Array], jax.Array] | None = None,
    staged: bool = False,
    augmented: bool = False,
) -> Callable:
    """Returns `batch(plan, data, i) -> (images uint8 (B, H, W), labels int32 (B,))`:
    step `i`'s examples of `data` as `plan` orders them (`staged`: as the plan holds
    them), augmented with the step's key where `data.augment` is on (`augmented`: the
    plan's images are already: `make_augmented_batches`). `shard_batch(x)` is applied to
    each (see `make_train_steps`)."""
    shard = shard_batch or (lambda x: x)
    augmenting = cfg.data.augment and not augmented

    def batch(plan: EpochPlan, data, i):
        if staged:
            images, labels = shard(plan.images[i]), shard(plan.labels[i])
        else:
            # Batches are gathered as rows of the flattened images: a TPU lays (N, H, W)
            # uint8 out with N innermost, where picking examples is a strided gather.
            n, *shape = data.images.shape
            batch_idx = shard(plan.indices[i])
            images = shard(data.images.reshape(n, -1)[batch_idx].reshape(-1, *shape))
            labels = shard(data.labels[batch_idx])
        if augmenting:  # each step its own key: each image its own move
            images = shard(augment(jax.random.wrap_key_data(plan.keys[i]), images, cfg.data))
        return images, labels

    return batch


def make_augmented_batches(
    cfg, shard_batch: Callable[[jax.Array], jax.Array] | None = None, staged: bool = False
) -> Callable:
    """Returns the pure `augmented(plan, data, start, stop) -> (images uint8 (num_steps,
    batch, H, W), labels int32 (num_steps, batch))`: the batches of `plan`'s steps
    `start .. stop - 1` as the steps would make them (`make_batch`: gathered from `data`,
    or as a `staged` plan holds them, and augmented with each step's key), one step after
    another in a loop; the other steps' are zero. A plan staged with them
    (`plan._replace(images=images, labels=labels)`) is read by `make_train_steps(...,
    staged=True, augmented=True)`, whose program then holds no augmentation (`population`
    says why): the same batches, made in a program of their own."""
    batch = make_batch(cfg, shard_batch, staged)

    def augmented(plan: EpochPlan, data, start, stop):
        num_steps, size = plan.indices.shape
        shape = plan.images.shape[2:] if staged else data.images.shape[1:]
        held = (
            jnp.zeros((num_steps, size, *shape), jnp.uint8),
            jnp.zeros((num_steps, size), jnp.int32),
        )

        def body(i, held):
            images, labels = batch(plan, data, i)
            return held[0].at[i].set(images), held[1].at[i].set(labels)

        return jax.lax.fori_loop(start, stop, body, held)

    return augmented


def make_train_steps(
    cfg,
    optimizer,
    shard_batch: Callable[[jax.Array], jax.Array] | None = None,
    staged: bool = False,
    augmented: bool = False,
) -> Callable:
    """Returns the pure `train_steps(state, metrics, plan, data, start, stop) ->
    (state, metrics)`: steps `start, ..., stop - 1` of an epoch's `plan`.

    `start` and `stop` are traced, so one compiled program runs any part of an
    epoch: the run loop cuts long epochs into calls of about a second (to stop
    cleanly when asked, save a checkpoint mid-epoch, or show progress) and short
    ones into one. Each step's loss goes to `metrics.loss[i]` and its count of
    right answers adds to `metrics.correct`, so the parts of an epoch give exactly
    what the whole would: the same step runs in the same order either way.
    `shard_batch(x)` is applied to each gathered batch (images and labels), e.g. a
    sharding constraint; identity when None. `staged`: the plan holds the batches
    (`make_epoch_plan`), and `data` is not read; `augmented`: augmented already
    (`make_augmented_batches`), so the steps do not augment them again.
    """
    step = make_train_step(cfg, optimizer)
    batch = make_batch(cfg, shard_batch, staged, augmented)
    dropping = cfg.model.dropout > 0

    def train_steps(state: TrainState, metrics: EpochMetrics, plan: EpochPlan, data, start, stop):
        def body(i, carry):
            state, metrics = carry
            images, labels = batch(plan, data, i)
            # Dropout draws from its own stream of the step's key, apart from augmentation's.
            drop_key = (
                jax.random.fold_in(jax.random.wrap_key_data(plan.keys[i]), DROPOUT_STREAM)
                if dropping
                else None
            )
            state, (loss, correct) = step(state, images, labels, drop_key)
            return state, EpochMetrics(metrics.loss.at[i].set(loss), metrics.correct + correct)

        return jax.lax.fori_loop(start, stop, body, (state, metrics))

    return train_steps


def make_train_epoch(
    cfg,
    optimizer,
    num_steps: int,
    shard_batch: Callable[[jax.Array], jax.Array] | None = None,
) -> Callable:
    """Returns the pure `train_epoch(state, key, data) -> (state, EpochMetrics)`: the
    plan and every step of one epoch, as one program (what the tutorials compile)."""
    train_steps = make_train_steps(cfg, optimizer, shard_batch)

    def train_epoch(state: TrainState, key, data: TrainData):
        plan = make_epoch_plan(cfg, data.images.shape[0], num_steps)(key)
        return train_steps(state, empty_metrics(num_steps), plan, data, 0, num_steps)

    return train_epoch
