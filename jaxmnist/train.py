"""The training core: state, the compiled epoch, and the run loop.

An epoch is one compiled call over device-resident data: a pure function
`train_epoch(state, key, data) -> (state, EpochMetrics)` that shuffles on the
device and `lax.scan`s over the steps, with the state donated and no host
synchronisation inside. Images stay uint8 on the device and are scaled to [0, 1]
inside the step. Because the epoch is a pure function of its arguments, a later
stage can `vmap` it over seeds or shard it over devices unchanged.

`train_and_evaluate(cfg, workdir)` is the run loop around it: load data, compile
ahead of time (so compile time is measured apart from training time), run the
epochs, evaluate exactly after each, and write the run directory.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmnist import config as config_lib
from jaxmnist import evaluate as evaluate_lib
from jaxmnist import optim, rundir, runtime
from jaxmnist.errors import TrainingError
from jaxmnist.models import count_params, get_model


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: Any
    opt_state: Any


class EpochMetrics(NamedTuple):
    loss: jax.Array  # float32 (num_steps,): mean training loss of each step's batch
    correct: jax.Array  # int32 (): training examples classified right, over the epoch


class TrainData(NamedTuple):
    images: jax.Array  # uint8 (N, H*W), on the device
    labels: jax.Array  # int32 (N,)


def init_state(key, cfg: config_lib.Config, optimizer, input_shape, num_classes) -> TrainState:
    params = get_model(cfg.model.name).init(key, cfg.model, input_shape, num_classes)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def make_train_step(cfg: config_lib.Config, optimizer) -> Callable:
    """Returns `step(state, images_u8 (B, D), labels (B,)) -> (state, (loss, correct))`."""
    apply = get_model(cfg.model.name).apply

    def loss_fn(params, images, labels):
        logits = apply(params, images.astype(jnp.float32) * (1.0 / 255.0), cfg.model)
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
    cfg: config_lib.Config,
    optimizer,
    num_steps: int,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 0,
) -> Callable:
    """Returns the pure `train_epoch(state, key, data) -> (state, EpochMetrics)`.

    With `progress`, the device reports the number of steps done every
    `progress_every` steps through a host callback; the scan is split into chunks
    so that no per-step condition or host synchronisation is needed.
    """
    step = make_train_step(cfg, optimizer)
    batch_size = cfg.train.batch_size

    def run_steps(state, idx, data: TrainData):
        def body(state, batch_idx):
            return step(state, data.images[batch_idx], data.labels[batch_idx])

        return jax.lax.scan(body, state, idx)

    def train_epoch(state: TrainState, key, data: TrainData):
        idx = epoch_indices(key, data.images.shape[0], batch_size, num_steps)
        if progress is None:
            state, (loss, correct) = run_steps(state, idx, data)
            return state, EpochMetrics(loss, correct.sum())
        every = progress_every or max(1, num_steps // 20)
        chunks, rest = divmod(num_steps, every)

        def chunk(state, chunk_idx):
            state, out = run_steps(state, chunk_idx, data)
            jax.debug.callback(progress, state.step)
            return state, out

        state, (loss, correct) = jax.lax.scan(chunk, state, idx[: chunks * every].reshape(chunks, every, -1))
        loss, correct = loss.reshape(-1), correct.reshape(-1)
        if rest:
            state, (loss_r, correct_r) = chunk(state, idx[chunks * every :])
            loss, correct = jnp.concatenate([loss, loss_r]), jnp.concatenate([correct, correct_r])
        return state, EpochMetrics(loss, correct.sum())

    return train_epoch


class Reporter:
    """What the run loop tells the outside world; the CLI subclasses it."""

    def on_start(self, info: dict) -> None: ...
    def on_compiled(self, seconds: float) -> None: ...
    def on_epoch_start(self, epoch: int, num_steps: int, first_step: int) -> None: ...
    def on_progress(self, global_step: int) -> None: ...
    def on_epoch_end(self, record: dict) -> None: ...
    def on_finish(self, summary: dict) -> None: ...

    wants_progress = False


def place_train_data(images: np.ndarray, labels: np.ndarray) -> TrainData:
    """Copies a training set to the default device once, images kept as uint8."""
    flat = images.reshape(images.shape[0], -1)
    return TrainData(jax.device_put(flat), jax.device_put(labels.astype(np.int32)))


def _check_finite(losses: np.ndarray, epoch: int, first_step: int, cfg) -> None:
    bad = ~np.isfinite(losses)
    if bad.any():
        at = first_step + int(np.argmax(bad)) + 1
        raise TrainingError(
            f"training loss became non-finite at step {at} (epoch {epoch}, steps "
            f"{first_step + 1}-{first_step + len(losses)}); check input scaling and lower "
            f"the learning rate (optimizer.lr={cfg.optimizer.lr:g})"
        )


def train_and_evaluate(
    cfg: config_lib.Config,
    workdir: str | os.PathLike | None,
    reporter: Reporter | None = None,
    dataset=None,
) -> dict:
    """Trains and evaluates one model as `cfg` says; returns the summary dict.

    With a `workdir`, writes config.json, environment.json, metrics.jsonl,
    summary.json, confusion_matrix.json and params.npz there. `dataset` (a
    `jaxmnist.data.Dataset`) skips loading, for tests.
    """
    from jaxmnist.data import load_dataset

    wall_start = time.perf_counter()
    reporter = reporter or Reporter()
    if cfg.compile_cache:
        runtime.enable_compilation_cache()
    run = rundir.RunWriter(workdir) if workdir is not None else None
    if dataset is None:
        dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=cfg.data.download)
    spec = dataset.spec
    config_lib.validate(cfg, num_train_examples=len(dataset.train_labels))
    plan = config_lib.plan_steps(cfg.train, len(dataset.train_labels))
    input_shape, num_classes = dataset.train_images.shape[1:], len(spec.class_names)

    optimizer = optim.make_optimizer(cfg.optimizer, plan.total_steps)
    init_key, shuffle_key = jax.random.split(jax.random.key(cfg.train.seed))
    state = jax.jit(lambda k: init_state(k, cfg, optimizer, input_shape, num_classes))(init_key)
    train_data = place_train_data(dataset.train_images, dataset.train_labels)
    test_set = evaluate_lib.place_eval_data(
        dataset.test_images, dataset.test_labels, cfg.train.eval_batch_size
    )
    train_eval_set = (
        evaluate_lib.place_eval_data(
            dataset.train_images, dataset.train_labels, cfg.train.eval_batch_size
        )
        if cfg.train.eval_train
        else None
    )
    info = {
        "dataset": spec.name,
        "source": dataset.source,
        "num_params": count_params(state.params),
        "steps_per_epoch": plan.steps_per_epoch,
        "epochs": len(plan.epoch_steps),
        "total_steps": plan.total_steps,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
    }
    if run:
        run.write_start(cfg, info)
    events = _event_writer(run, cfg)
    reporter.on_start(info)

    # Compile every distinct program ahead of time, so that compile time is
    # measured on its own and training never compiles.
    compile_start = time.perf_counter()
    progress = reporter.on_progress if reporter.wants_progress else None
    epoch_fns = {}
    for n in sorted(set(plan.epoch_steps)):
        fn = make_train_epoch(cfg, optimizer, n, progress, cfg.train.progress_every)
        epoch_fns[n] = (
            jax.jit(fn, donate_argnums=0).lower(state, shuffle_key, train_data).compile()
        )
    evaluate = evaluate_lib.compile_evaluate(cfg.model, state.params, test_set, num_classes)
    evaluate_train = (
        evaluate_lib.compile_evaluate(cfg.model, state.params, train_eval_set, num_classes)
        if train_eval_set is not None
        else None
    )
    compile_seconds = time.perf_counter() - compile_start
    reporter.on_compiled(compile_seconds)

    epoch_keys = list(jax.random.split(shuffle_key, len(plan.epoch_steps)))  # unstacked once
    train_seconds = eval_seconds = 0.0
    first_step = 0
    records = []
    for epoch, num_steps in enumerate(plan.epoch_steps, start=1):
        reporter.on_epoch_start(epoch, num_steps, first_step)
        t0 = time.perf_counter()
        with jax.transfer_guard("disallow"):
            state, metrics = epoch_fns[num_steps](state, epoch_keys[epoch - 1], train_data)
            metrics = jax.block_until_ready(metrics)
        epoch_seconds = time.perf_counter() - t0
        train_seconds += epoch_seconds
        losses, correct = jax.device_get((metrics.loss, metrics.correct))
        _check_finite(losses, epoch, first_step, cfg)

        t0 = time.perf_counter()
        test = evaluate(state.params, test_set)
        train_eval = evaluate_train(state.params, train_eval_set) if evaluate_train else None
        eval_seconds += time.perf_counter() - t0
        first_step += num_steps
        record = {
            "epoch": epoch,
            "step": first_step,
            "train_loss": float(losses.mean()),
            "train_accuracy": (
                train_eval.accuracy if train_eval else float(correct) / (num_steps * cfg.train.batch_size)
            ),
            "train_batch_accuracy": float(correct) / (num_steps * cfg.train.batch_size),
            "test_loss": test.loss,
            "test_accuracy": test.accuracy,
            "learning_rate": _learning_rate(state),
            "epoch_seconds": epoch_seconds,
            "examples_per_second": num_steps * cfg.train.batch_size / epoch_seconds,
        }
        records.append(record)
        if run:
            run.append_metrics(record, losses)
        if events:
            events.write_epoch(record, losses)
        reporter.on_epoch_end(record)

    examples = plan.total_steps * cfg.train.batch_size
    summary = {
        "dataset": spec.name,
        "test_accuracy": test.accuracy,
        "test_loss": test.loss,
        "train_loss": records[-1]["train_loss"],
        "train_accuracy": records[-1]["train_accuracy"],
        "num_test_examples": test.count,
        "num_params": info["num_params"],
        "epochs": len(plan.epoch_steps),
        "steps": plan.total_steps,
        "compile_seconds": compile_seconds,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "examples_per_second": examples / train_seconds,
        "steady_epoch_seconds": _steady_epoch_seconds(records, plan),
        "wall_seconds": time.perf_counter() - wall_start,
    }
    if run:
        _save_predictions(run, cfg, state.params, dataset, test.confusion, events, plan.total_steps)
        run.write_end(summary, test.confusion, jax.device_get(state.params), spec.class_names)
    reporter.on_finish(summary)
    return summary


def _event_writer(run, cfg: config_lib.Config):
    """TensorBoard events in the run directory when the config asks for them."""
    if run is None or not cfg.tensorboard:
        return None
    from jaxmnist.report.tensorboard import EventWriter

    return EventWriter(run.path, cfg.to_dict())


def _save_predictions(run, cfg, params, dataset, confusion, events, step: int) -> None:
    """test_predictions.npz for reports (and the final TensorBoard images)."""
    from jaxmnist.report.predictions import save_test_predictions

    probs = evaluate_lib.predict_probabilities(cfg.model, params, dataset.test_images, cfg.train.eval_batch_size)
    save_test_predictions(run.path, probs, dataset.test_labels, dataset.test_images)
    if events:
        events.write_final(step, confusion, dataset.spec.class_names,
                           probs, dataset.test_labels, dataset.test_images)
        events.close()


def _learning_rate(state: TrainState) -> float | None:
    lr = optim.current_learning_rate(state.opt_state)
    return None if lr is None else float(jax.device_get(lr))


def _steady_epoch_seconds(records: list[dict], plan) -> float | None:
    """Median time of full epochs after the first (which may still warm caches)."""
    full = [r["epoch_seconds"] for r, n in zip(records, plan.epoch_steps) if n == plan.steps_per_epoch]
    return float(np.median(full[1:])) if len(full) > 1 else None
