"""The training core: state, the compiled epoch, and the run loop.

An epoch is one compiled call over device-resident data: a pure function
`train_epoch(state, key, data) -> (state, EpochMetrics)` that shuffles on the
device and `lax.scan`s over the steps, with the state donated and no host
synchronisation inside. Images stay uint8 on the device and are scaled to [0, 1]
inside the step. Because the epoch is a pure function of its arguments, a later
stage can `vmap` it over seeds or shard it over devices unchanged.

`train_population(cfg, members, dataset)` is the one run loop around it: compile
ahead of time (so compile time is measured apart from training time), run the
epochs, evaluate exactly after each, stop early at a target accuracy. Its
members are models that differ only in seed and optimizer hyperparameters: one
member runs the plain programs; several run the same epoch under `jax.vmap`
(`jaxmnist.population`), in chunks that fit in memory (`jaxmnist.memory`).
`train_and_evaluate(cfg, workdir)` trains `train.seeds` seeds of one config
with it and writes the run directory; `jaxmnist.sweep` runs grids through it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmnist import config as config_lib
from jaxmnist import evaluate as evaluate_lib
from jaxmnist import optim, rundir, runtime
from jaxmnist.errors import TrainingError
from jaxmnist.models import apply_uint8, count_params, get_model


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

        state, (loss, correct) = jax.lax.scan(
            chunk, state, idx[: chunks * every].reshape(chunks, every, -1)
        )
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


def _check_finite(
    losses: np.ndarray, epoch: int, first_step: int, members, stop: bool
) -> list[int]:
    """Members (indices) whose loss went non-finite; with `stop`, a TrainingError for the first.

    losses: float32 (members, steps) of this epoch.
    """
    bad = ~np.isfinite(losses)
    diverged = [i for i in range(len(losses)) if bad[i].any()]
    if diverged and stop:
        i = diverged[0]
        at = first_step + int(np.argmax(bad[i])) + 1
        who = f" for seed {members[i].seed}" if len(members) > 1 else ""
        raise TrainingError(
            f"training loss became non-finite{who} at step {at} (epoch {epoch}, steps "
            f"{first_step + 1}-{first_step + losses.shape[1]}); check input scaling and lower "
            f"the learning rate (optimizer.lr={members[i].lr:g})"
        )
    return diverged


class RunResult(NamedTuple):
    """What `train_population` did. Evaluations hold one row per member."""

    population: Any  # jaxmnist.population.Population: members, chunks, compiled programs
    states: list  # one TrainState per chunk (stacked when there are several members)
    plan: config_lib.StepPlan
    records: list[dict]  # per epoch; figures are means over the members, plus per-member lists
    test: Any  # population.Evaluation after the last epoch run
    info: dict  # what the run told the reporter when it started
    compile_seconds: float
    train_seconds: float  # compiled epochs only
    eval_seconds: float
    steps: int  # steps run: fewer than planned when the target accuracy stopped the run
    reached: (
        list  # per point: {"epoch", "train_seconds"} when its mean reached the target, else None
    )
    diverged: list[int]  # members whose loss became non-finite (when not stopping for it)


def train_population(
    cfg,
    members,
    dataset,
    reporter: Reporter | None = None,
    *,
    points=None,
    run=None,
    events=None,
    stop_on_nonfinite: bool = True,
) -> RunResult:
    """Trains `members` (`jaxmnist.population.Member`s: seed and hyperparameters) of `cfg`.

    One member is today's single-model run. Several train in one vmapped program
    (per memory chunk). `points[i]` names the point member i belongs to (default:
    all one point); `cfg.train.target_accuracy` stops the run after the first
    epoch at which every point's mean test accuracy has reached it. With `run` and
    `events`, writes the run's start and per-epoch files. With `stop_on_nonfinite`
    false, a diverging member is recorded in `diverged` instead of raising.
    """
    from jaxmnist import memory
    from jaxmnist.population import Population, epoch_record

    reporter = reporter or Reporter()
    spec, n_train = dataset.spec, len(dataset.train_labels)
    config_lib.validate(cfg, num_train_examples=n_train)
    plan = config_lib.plan_steps(cfg.train, n_train)
    input_shape, num_classes = dataset.train_images.shape[1:], len(spec.class_names)
    optimizer = optim.make_optimizer(cfg.optimizer, plan.total_steps)
    shapes = jax.eval_shape(
        lambda k: init_state(k, cfg, optimizer, input_shape, num_classes), jax.random.key(0)
    )
    info = {
        "dataset": spec.name,
        "source": dataset.source,
        "num_params": count_params(shapes.params),
        "steps_per_epoch": plan.steps_per_epoch,
        "epochs": len(plan.epoch_steps),
        "total_steps": plan.total_steps,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
    }
    chunks = (1,)
    if len(members) > 1:  # estimated before allocating anything: chunks that fit, or one clear line
        chunks, about = memory.chunks_for(cfg, shapes, dataset, len(members))
        info.update(models=len(members), seeds=sorted({m.seed for m in members}), **about)
    pop = Population(
        cfg, optimizer, members, chunks, input_shape, num_classes, len(plan.epoch_steps)
    )
    states = pop.init_states()
    train_data = place_train_data(dataset.train_images, dataset.train_labels)
    eval_sets = {
        "test": evaluate_lib.place_eval_data(
            dataset.test_images, dataset.test_labels, cfg.train.eval_batch_size
        )
    }
    if cfg.train.eval_train:
        eval_sets["train"] = evaluate_lib.place_eval_data(
            dataset.train_images, dataset.train_labels, cfg.train.eval_batch_size
        )
    if run:
        run.write_start(cfg, info)
    reporter.on_start(info)

    # Compile every distinct program ahead of time, so that compile time is
    # measured on its own and training never compiles.
    compile_start = time.perf_counter()
    chunk_offset = [0]  # steps of this epoch done by earlier chunks, for the progress bar
    progress = (
        (lambda step: reporter.on_progress(int(step) + chunk_offset[0]))
        if reporter.wants_progress
        else None
    )
    pop.compile(states, plan.epoch_steps, train_data, eval_sets, progress, cfg.train.progress_every)
    compile_seconds = time.perf_counter() - compile_start
    reporter.on_compiled(compile_seconds)

    points = np.zeros(len(members), int) if points is None else np.asarray(points)
    reached = [None] * (int(points.max()) + 1)
    target = cfg.train.target_accuracy
    train_seconds = eval_seconds = 0.0
    first_step = 0
    records, diverged = [], []
    for epoch, num_steps in enumerate(plan.epoch_steps, start=1):
        reporter.on_epoch_start(epoch, num_steps * len(chunks), first_step)

        def before_chunk(i, num_steps=num_steps):
            chunk_offset[0] = i * num_steps

        t0 = time.perf_counter()
        with jax.transfer_guard("disallow"):
            states, metrics = pop.train_epoch(
                states,
                epoch - 1,
                num_steps,
                train_data,
                before_chunk if progress and len(chunks) > 1 else None,
            )
            metrics = jax.block_until_ready(metrics)
        epoch_seconds = time.perf_counter() - t0
        train_seconds += epoch_seconds
        losses, correct = pop.host_metrics(metrics)
        for i in _check_finite(losses, epoch, first_step, members, stop_on_nonfinite):
            if i not in diverged:
                diverged.append(i)

        t0 = time.perf_counter()
        test = pop.evaluate(states, "test", eval_sets["test"])
        train_eval = (
            pop.evaluate(states, "train", eval_sets["train"]) if cfg.train.eval_train else None
        )
        eval_seconds += time.perf_counter() - t0
        first_step += num_steps
        record = epoch_record(
            epoch,
            first_step,
            num_steps * cfg.train.batch_size,
            losses,
            correct,
            test,
            train_eval,
            pop.learning_rates(states),
            epoch_seconds,
        )
        records.append(record)
        mean_losses = losses[0] if len(members) == 1 else losses.mean(0)
        if run:
            run.append_metrics(record, mean_losses)
        if events:
            events.write_epoch(record, mean_losses)
        reporter.on_epoch_end(record)
        if target is not None:
            for p in range(len(reached)):
                if reached[p] is None and test.accuracy[points == p].mean() >= target:
                    reached[p] = {"epoch": epoch, "train_seconds": train_seconds}
            if all(reached):
                break
    return RunResult(
        pop,
        states,
        plan,
        records,
        test,
        info,
        compile_seconds,
        train_seconds,
        eval_seconds,
        first_step,
        reached,
        diverged,
    )


def train_and_evaluate(
    cfg: config_lib.Config,
    workdir: str | os.PathLike | None,
    reporter: Reporter | None = None,
    dataset=None,
) -> dict:
    """Trains and evaluates `cfg.train.seeds` models as `cfg` says; returns the summary dict.

    With a `workdir`, writes config.json, environment.json, metrics.jsonl,
    summary.json, confusion_matrix.json and params.npz there (several seeds:
    per-seed figures and parameters stacked along a leading seed axis). `dataset`
    (a `jaxmnist.data.Dataset`) skips loading, for tests.
    """
    from jaxmnist.data import load_dataset
    from jaxmnist.population import seed_members, seed_summary

    wall_start = time.perf_counter()
    reporter = reporter or Reporter()
    if cfg.compile_cache:
        runtime.enable_compilation_cache()
    run = rundir.RunWriter(workdir) if workdir is not None else None
    if dataset is None:
        dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=cfg.data.download)
    config_lib.validate(cfg, num_train_examples=len(dataset.train_labels))
    if run:
        run.write_data(dataset)  # where the data came from, for `jaxmnist eval`
    events = _event_writer(run, cfg)
    r = train_population(cfg, seed_members(cfg), dataset, reporter, run=run, events=events)

    models = len(r.population)
    examples = r.steps * cfg.train.batch_size * models
    summary = {
        "dataset": dataset.spec.name,
        "test_accuracy": float(r.test.accuracy.mean()),
        "test_loss": float(r.test.loss.mean()),
        "train_loss": r.records[-1]["train_loss"],
        "train_accuracy": r.records[-1]["train_accuracy"],
        "num_test_examples": r.test.count,
        "num_params": r.info["num_params"],
        "epochs": len(r.records),
        "steps": r.steps,
        "compile_seconds": r.compile_seconds,
        "train_seconds": r.train_seconds,
        "eval_seconds": r.eval_seconds,
        "examples_per_second": examples / r.train_seconds,
        "steady_epoch_seconds": _steady_epoch_seconds(r.records, r.plan),
        "wall_seconds": time.perf_counter() - wall_start,
    }
    if models > 1:
        summary.update(seed_summary(r))
    if cfg.train.target_accuracy is not None:
        summary.update(_target_summary(cfg, r))
    if run:
        params = r.population.member_params(r.states, 0)  # predictions: the first seed's model
        _save_predictions(run, cfg, params, dataset, r.test.confusion[0], events, r.steps)
        per_seed = r.test.confusion if models > 1 else None
        run.write_end(
            summary,
            r.test.confusion[0],
            r.population.params(r.states),
            dataset.spec.class_names,
            confusion_per_seed=per_seed,
        )
    reporter.on_finish(summary)
    return summary


def _target_summary(cfg, r: RunResult) -> dict:
    reached = r.reached[0]
    return {
        "target_accuracy": cfg.train.target_accuracy,
        "target_reached": reached is not None,
        "epochs_planned": len(r.plan.epoch_steps),
        "epochs_to_target": reached and reached["epoch"],
        "time_to_target_seconds": reached and reached["train_seconds"],
        "time_to_target_with_compile_seconds": reached
        and reached["train_seconds"] + r.compile_seconds,
    }


def _event_writer(run, cfg: config_lib.Config):
    """TensorBoard events in the run directory when the config asks for them."""
    if run is None or not cfg.tensorboard:
        return None
    from jaxmnist.report.tensorboard import EventWriter

    return EventWriter(run.path, cfg.to_dict())


def _save_predictions(run, cfg, params, dataset, confusion, events, step: int) -> None:
    """test_predictions.npz for reports (and the final TensorBoard images)."""
    from jaxmnist.report.predictions import save_test_predictions

    probs = evaluate_lib.predict_probabilities(
        cfg.model, params, dataset.test_images, cfg.train.eval_batch_size
    )
    save_test_predictions(run.path, probs, dataset.test_labels, dataset.test_images)
    if events:
        events.write_final(
            step,
            confusion,
            dataset.spec.class_names,
            probs,
            dataset.test_labels,
            dataset.test_images,
        )
        events.close()


def _steady_epoch_seconds(records: list[dict], plan) -> float | None:
    """Median time of full epochs after the first (which may still warm caches)."""
    full = [
        r["epoch_seconds"] for r, n in zip(records, plan.epoch_steps) if n == plan.steps_per_epoch
    ]
    return float(np.median(full[1:])) if len(full) > 1 else None
