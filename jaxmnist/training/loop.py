"""The run loop: set up, compile, run epochs from any starting epoch, call back.

`train_population(cfg, members, dataset, callbacks)` trains a population
(`jaxmnist.training.population`: one model or many, on the mesh of a
`parallel.Layout`) in three stages:

    setup      plan the steps, estimate memory and cut the members into chunks,
               initialise the states, place the data on the mesh
    compile    every distinct program ahead of time, so compile time is measured
               on its own and training never compiles
    epochs     run each epoch in calls of about half a second (`pacing`: a short
               epoch is one call), so that a stop, a checkpoint or progress can
               come between them; evaluate exactly, hand an `EpochEnd` to every
               callback, then ask the stop rules whether to go on

The loop writes nothing itself: the terminal, the run directory, TensorBoard and
checkpoints are callbacks. It can start at a later epoch with the state and the
accumulators of an earlier run (`Progress`), even in the middle of an epoch,
which is what resuming needs.
`train_and_evaluate(cfg, workdir)` trains `train.seeds` seeds of one config and
writes the run directory; `jaxmnist.sweep` runs grids through `train_population`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import optim, runtime
from jaxmnist.errors import TrainingError
from jaxmnist.models import conv, count_params
from jaxmnist.runs import rundir
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training import memory, pacing, parallel
from jaxmnist.training.population import Evaluation, Population, seed_members
from jaxmnist.training.step import TrainData, init_state

__all__ = [
    "Callback",
    "EpochEnd",
    "Progress",
    "Reporter",
    "RunResult",
    "StepsEnd",
    "place_train_data",
    "train_and_evaluate",
    "train_population",
]


class Callback:
    """Hooks of the run loop; subclasses override what they need."""

    def on_start(self, info: dict) -> None: ...
    def on_compiled(self, seconds: float) -> None: ...
    def on_estimate(self, epoch_seconds: float, seconds_per_step: float) -> None: ...
    def on_epoch_start(self, epoch: int, num_steps: int, first_step: int) -> None: ...
    def on_steps(self, end: StepsEnd) -> None: ...
    def on_epoch_end(self, end: EpochEnd) -> None: ...
    def on_finish(self, summary: dict) -> None: ...


Reporter = Callback  # what the terminal and sweep reporters subclass


class EpochEnd(NamedTuple):
    """What an epoch did, handed to every callback."""

    epoch: int
    step: int  # optimizer steps taken so far
    record: dict  # the metrics.jsonl line: means over the members, plus per-member lists
    step_losses: np.ndarray  # float32 (steps,): this epoch's losses, mean over the members
    losses: np.ndarray  # float32 (members, steps)
    test: Evaluation
    states: list  # one TrainState per chunk, on the devices (stacked along members)
    population: Population
    stopping: bool = False  # a stop was asked for (in any process): the run ends here


class StepsEnd(NamedTuple):
    """Where the loop stands after a call that did not end its epoch."""

    epoch: int  # the epoch under way (1-based)
    step: int  # optimizer steps taken so far
    epoch_step: int  # of them, in this epoch
    states: list  # one TrainState per chunk (donated to the next call: copy to keep)
    metrics: list  # one step.EpochMetrics per chunk: this epoch's accumulators so far
    population: Population
    train_seconds: float  # training time so far, this epoch's part included
    epoch_seconds: float  # this epoch's part
    stopping: bool = False  # a stop was asked for (in any process): the run ends here


class Progress(NamedTuple):
    """Where a run stands: enough to start the loop again there, mid-epoch too."""

    epoch: int = 0  # epochs done
    step: int = 0
    records: tuple = ()
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    epoch_step: int = 0  # steps done in epoch `epoch + 1`
    metrics: list | None = None  # its accumulators (per chunk), when epoch_step > 0
    epoch_seconds: float = 0.0  # its training time so far


class RunResult(NamedTuple):
    """What `train_population` did. Evaluations hold one row per member."""

    population: Population
    states: list  # one TrainState per chunk, stacked along the member axis
    plan: config_lib.StepPlan
    records: list[dict]  # per epoch, from the first epoch of the run
    test: Evaluation | None  # after the last epoch run (None: stopped inside the first)
    info: dict  # what the run told the callbacks when it started
    compile_seconds: float
    train_seconds: float  # compiled epochs only
    eval_seconds: float
    steps: int  # steps run: fewer than planned when a stop rule ended the run
    reached: list  # per point: {"epoch", "train_seconds"} when its mean reached the target
    diverged: list[int]  # members whose loss became non-finite (when not stopping for it)
    stopped: bool = False  # ended early because a stop was asked for (`interrupt`)


def place_train_data(images: np.ndarray, labels: np.ndarray, layout=None) -> TrainData:
    """Copies a training set to the device(s) once, images kept as uint8 (N, H, W);
    with a `parallel.Layout`, replicated on every device of its mesh."""
    labels = labels.astype(np.int32)
    if layout is None:
        return TrainData(jax.device_put(images), jax.device_put(labels))
    return TrainData(layout.put(images, layout.replicated), layout.put(labels, layout.replicated))


def _check_finite(losses, epoch: int, first_step: int, members, stop: bool) -> list[int]:
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


class TargetAccuracy:
    """Stop rule: stop after the first epoch at which every point's mean test
    accuracy has reached `target`. `points[i]` is the point member i belongs to."""

    def __init__(self, target: float | None, points: np.ndarray):
        self.target, self.points = target, points
        self.reached: list = [None] * (int(points.max()) + 1)

    def __call__(self, end: EpochEnd, train_seconds: float) -> bool:
        return self.update(end.epoch, end.test.accuracy, train_seconds)

    def update(self, epoch: int, accuracy: np.ndarray, train_seconds: float) -> bool:
        """accuracy: (members,) after `epoch`; True once every point has reached the target."""
        if self.target is None:
            return False
        for p in range(len(self.reached)):
            mean = accuracy[self.points == p].mean()
            if self.reached[p] is None and mean >= self.target:
                self.reached[p] = {"epoch": epoch, "train_seconds": train_seconds}
        return all(self.reached)

    def replay(self, records) -> bool:
        """Goes over the metrics.jsonl records of a resumed run's earlier epochs; True
        when they had already reached the target (the run was complete)."""
        done, seconds = False, 0.0
        for r in records:
            seconds += r["epoch_seconds"]
            accuracy = np.asarray(r.get("test_accuracy_per_seed", [r["test_accuracy"]]))
            done = self.update(r["epoch"], accuracy, seconds)
        return done


class Setup(NamedTuple):
    """A run set up and ready to compile: nothing has been compiled yet."""

    cfg: config_lib.Config
    plan: config_lib.StepPlan
    population: Population
    states: list
    train_data: TrainData
    eval_sets: dict  # name -> evaluate.PlacedEval
    info: dict


def setup_run(cfg, members, dataset, layout: parallel.Layout | None = None) -> Setup:
    """Plans, checks memory, initialises the states and places the data (see the module doc)."""
    spec, n_train = dataset.spec, len(dataset.train_labels)
    config_lib.validate(cfg, num_train_examples=n_train)
    layout = layout or parallel.build_layout(1)
    parallel.check_layout(layout, num_models=len(members), batch_size=cfg.train.batch_size)
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
        "device": str(layout.mesh.devices.flat[0]),
        **layout.describe(),
    }
    if cfg.model.name == "cnn":  # the convolution's formulation, as `auto` (or the user) chose
        info["conv_impl"] = conv.resolve(cfg.model.conv_impl)
    # Estimated before anything is allocated: chunks that fit, or one clear line.
    chunks, about = memory.chunks_for(cfg, shapes, dataset, len(members), layout.members)
    if len(members) > 1:
        info.update(models=len(members), seeds=sorted({m.seed for m in members}), **about)
    pop = Population(
        cfg, optimizer, members, chunks, input_shape, num_classes, len(plan.epoch_steps), layout
    )
    states = pop.init_states()
    train_data = place_train_data(dataset.train_images, dataset.train_labels, layout)
    sets = {"test": (dataset.test_images, dataset.test_labels)}
    if cfg.train.eval_train:
        sets["train"] = (dataset.train_images, dataset.train_labels)
    eval_sets = {
        name: evaluate_lib.place_eval_data(x, y, cfg.train.eval_batch_size, layout)
        for name, (x, y) in sets.items()
    }
    return Setup(cfg, plan, pop, states, train_data, eval_sets, info)


def train_population(
    cfg,
    members,
    dataset,
    callbacks=(),
    *,
    points=None,
    layout: parallel.Layout | None = None,
    stop_on_nonfinite: bool = True,
    start: tuple[Progress, list] | Callable[[Setup], tuple[Progress, list]] | None = None,
    stop_rules: tuple[Callable[[EpochEnd, float], bool], ...] = (),
    interrupt: Callable[[], bool] | None = None,
    every_steps: tuple[int, ...] = (),
) -> RunResult:
    """Trains `members` (`population.Member`s: seed and hyperparameters) of `cfg`.

    `callbacks`: a `Callback` or a sequence of them. `points[i]` names the point
    member i belongs to (default: all one point); `cfg.train.target_accuracy`
    stops the run after the first epoch at which every point's mean test
    accuracy has reached it; `stop_rules` may end it earlier. With
    `stop_on_nonfinite` false, a diverging member is recorded in `diverged`
    instead of raising. `start=(progress, states)` continues a run after
    `progress.epoch` epochs from those states; `start` may also be a function of the
    `Setup` returning them (a checkpoint restored onto its mesh). `interrupt()` is
    asked after every call (about every half second): when it (in any process)
    says so, the run ends there, mid-epoch or not, after the callbacks have seen a
    `StepsEnd` or `EpochEnd` with `stopping` set. Calls also end at every multiple
    of each of `every_steps` (e.g. where a checkpoint is due).
    """
    calls = _Callbacks(callbacks)
    run = setup_run(cfg, members, dataset, layout)
    if callable(start):
        start = start(run)
    states = run.states if start is None else start[1]
    calls.on_start(run.info)
    compile_seconds = _compile(run)
    calls.on_compiled(compile_seconds)
    points = np.zeros(len(members), int) if points is None else np.asarray(points)
    target = TargetAccuracy(cfg.train.target_accuracy, points)
    progress = Progress() if start is None else start[0]
    every = (*every_steps, cfg.train.progress_every)
    loop = _Loop(run, calls, target, stop_on_nonfinite, interrupt or (lambda: False), every)
    return loop.run(states, progress, (target, *stop_rules), compile_seconds)


class _Callbacks(Callback):
    """Many callbacks as one."""

    def __init__(self, callbacks):
        if isinstance(callbacks, Callback):
            callbacks = [callbacks]
        self.items = [c for c in callbacks if c is not None]

    def _each(self, name: str, *args) -> None:
        for c in self.items:
            getattr(c, name)(*args)

    def on_start(self, info: dict) -> None:
        self._each("on_start", info)

    def on_compiled(self, seconds: float) -> None:
        self._each("on_compiled", seconds)

    def on_estimate(self, epoch_seconds: float, seconds_per_step: float) -> None:
        self._each("on_estimate", epoch_seconds, seconds_per_step)

    def on_epoch_start(self, epoch: int, num_steps: int, first_step: int) -> None:
        self._each("on_epoch_start", epoch, num_steps, first_step)

    def on_steps(self, end: StepsEnd) -> None:
        self._each("on_steps", end)

    def on_epoch_end(self, end: EpochEnd) -> None:
        self._each("on_epoch_end", end)


def _compile(run: Setup) -> float:
    """Compiles every distinct program ahead of time; returns the seconds it took."""
    start = time.perf_counter()
    run.population.compile(run.states, run.plan.steps_per_epoch, run.train_data, run.eval_sets)
    parallel.agree(0.0, False)  # several processes: its collective compiles here too
    return time.perf_counter() - start


class _Loop:
    """The epochs of one run (see the module doc)."""

    def __init__(self, run: Setup, calls, target, stop_on_nonfinite, interrupt, every):
        self.setup, self.calls, self.target = run, calls, target
        self.stop_on_nonfinite, self.interrupt = stop_on_nonfinite, interrupt
        self.pacer = pacing.Pacer(every)
        self.estimated, self.calls_made = False, 0

    def run_steps(self, states, metrics, plans, done: int, num_steps: int, step: int):
        """One call, from step `done` of the epoch; returns (states, metrics, steps run,
        seconds, stopping)."""
        pop = self.setup.population
        stop = self.pacer.next_stop(done, num_steps, step)
        t0 = time.perf_counter()
        states, metrics = pop.train_steps(states, metrics, plans, self.setup.train_data, done, stop)
        jax.block_until_ready(metrics)
        seconds = time.perf_counter() - t0
        # Every process paces by the slowest clock and stops when any is asked to.
        paced, stopping = parallel.agree(seconds, self.interrupt())
        self.pacer.record(stop - done, paced)
        self.calls_made += 1
        # The run's first call (one step) still warms up: the estimate waits for the
        # second, unless that one step was already slow enough to leave the user waiting.
        if not self.estimated and (self.calls_made >= 2 or paced >= 2.0):
            self.estimated = True
            total = self.pacer.epoch_seconds(self.setup.plan.steps_per_epoch)
            self.calls.on_estimate(total, self.pacer.seconds_per_step)
        return states, metrics, stop - done, seconds, stopping

    def epoch_steps(self, epoch: int, states, metrics, done: int, step: int, clock: list):
        """Runs epoch `epoch` from its step `done` in calls until it ends or a stop is agreed;
        returns (states, metrics, steps done in the epoch, stopping). `clock` holds
        [train seconds, this epoch's seconds], advanced by each call."""
        pop, num_steps = self.setup.population, self.setup.plan.epoch_steps[epoch - 1]
        plans = pop.plan_epoch(epoch - 1)
        stopping = False
        while done < num_steps:
            states, metrics, n, seconds, stopping = self.run_steps(
                states, metrics, plans, done, num_steps, step + done
            )
            done += n
            clock[0] += seconds
            clock[1] += seconds
            if done == num_steps:
                break
            if stopping:  # never save a bad state: a non-finite loss ends the run here
                losses, _, _ = pop.host_metrics(states, metrics, done)
                self.check_finite(losses, epoch, step, [])
            end = StepsEnd(
                epoch, step + done, done, states, metrics, pop, clock[0], clock[1], stopping
            )
            self.calls.on_steps(end)
            if stopping:
                break
        return states, metrics, done, stopping

    def run(self, states, progress: Progress, stop_rules, compile_seconds: float) -> RunResult:
        run, calls, pop = self.setup, self.calls, self.setup.population
        cfg = run.cfg
        clock = [progress.train_seconds, 0.0]  # train seconds, this epoch's seconds
        eval_seconds = progress.eval_seconds
        step = progress.step - progress.epoch_step  # at the start of the epoch under way
        records, diverged = list(progress.records), []
        test, stopping = None, False
        partial = progress if progress.epoch_step else None  # resumed inside an epoch
        epochs = range(progress.epoch + 1, len(run.plan.epoch_steps) + 1)
        if self.target.replay(progress.records):  # a resumed run had already reached it
            epochs = ()
        for epoch in epochs:
            num_steps = run.plan.epoch_steps[epoch - 1]
            done = partial.epoch_step if partial else 0
            clock[1] = partial.epoch_seconds if partial else 0.0
            calls.on_epoch_start(epoch, num_steps, step)
            with jax.transfer_guard("disallow"):
                metrics = partial.metrics if partial else pop.new_metrics()
                states, metrics, done, stopping = self.epoch_steps(
                    epoch, states, metrics, done, step, clock
                )
            partial = None
            if done < num_steps:  # stopped inside the epoch
                step += done
                break
            step += num_steps
            losses, correct, lrs = pop.host_metrics(states, metrics, num_steps)
            self.check_finite(losses, epoch, step - num_steps, diverged)
            t0 = time.perf_counter()
            test = pop.evaluate(states, "test", run.eval_sets["test"])
            train_eval = None
            if cfg.train.eval_train:
                train_eval = pop.evaluate(states, "train", run.eval_sets["train"])
            eval_seconds += time.perf_counter() - t0
            record = epoch_record(
                epoch,
                step,
                num_steps * cfg.train.batch_size,
                losses,
                correct,
                test,
                train_eval,
                lrs,
                clock[1],
            )
            records.append(record)
            end = EpochEnd(epoch, step, record, losses.mean(0), losses, test, states, pop, stopping)
            calls.on_epoch_end(end)
            if sum(bool(rule(end, clock[0])) for rule in stop_rules) or stopping:
                break
        if test is None and not stopping:  # resumed at its last checkpoint, or past its target
            test = pop.evaluate(states, "test", run.eval_sets["test"])
        return RunResult(
            pop,
            states,
            run.plan,
            records,
            test,
            run.info,
            compile_seconds,
            clock[0],
            eval_seconds,
            step,
            self.target.reached,
            diverged,
            stopping,
        )

    def check_finite(self, losses, epoch: int, first_step: int, diverged: list) -> None:
        members = self.setup.population.members
        for i in _check_finite(losses, epoch, first_step, members, self.stop_on_nonfinite):
            if i not in diverged:
                diverged.append(i)


def epoch_record(
    epoch: int,
    step: int,
    examples: int,
    losses,
    correct,
    test: Evaluation,
    train_eval: Evaluation | None,
    learning_rates,
    seconds: float,
) -> dict:
    """One metrics.jsonl line. losses: float32 (N, steps); correct: (N,) right in the
    epoch's batches; examples: training examples per member this epoch.

    Figures are means over the members, so one member's line is exactly a single
    run's; several members add per-member lists (`*_per_seed`) and the spread of
    test accuracy. examples_per_second counts every member's examples.
    """
    train_loss = losses.mean(axis=1)
    batch_accuracy = correct / examples
    train_accuracy = train_eval.accuracy if train_eval is not None else batch_accuracy
    record = {
        "epoch": epoch,
        "step": step,
        "train_loss": float(train_loss.mean()),
        "train_accuracy": float(train_accuracy.mean()),
        "train_batch_accuracy": float(batch_accuracy.mean()),
        "test_loss": float(test.loss.mean()),
        "test_accuracy": float(test.accuracy.mean()),
        "learning_rate": None if learning_rates is None else float(learning_rates.mean()),
        "epoch_seconds": seconds,
        "examples_per_second": len(losses) * examples / seconds,
    }
    if len(losses) > 1:
        record.update(
            test_accuracy_std=float(test.accuracy.std(ddof=1)),
            test_accuracy_per_seed=test.accuracy.tolist(),
            test_loss_per_seed=test.loss.tolist(),
            train_accuracy_per_seed=np.asarray(train_accuracy, np.float64).tolist(),
            train_loss_per_seed=train_loss.astype(np.float64).tolist(),
        )
    return record


def seed_summary(result: RunResult) -> dict:
    """summary.json's multi-seed fields: the seeds, the test accuracy's mean, std,
    95% CI, min and max, and the per-seed figures."""
    from jaxmnist import stats

    acc = result.test.accuracy
    last = result.records[-1]
    return {
        "seeds": [m.seed for m in result.population.members],
        **stats.spread(acc).to_json("test_accuracy"),
        "test_accuracy_per_seed": acc.tolist(),
        "test_loss_per_seed": result.test.loss.tolist(),
        "train_accuracy_per_seed": last["train_accuracy_per_seed"],
        "chunks": list(result.population.chunks),
    }


class _RunFiles(Callback):
    """The run directory's per-epoch files, through `rundir.RunWriter`."""

    def __init__(self, run: rundir.RunWriter, cfg):
        self.run, self.cfg = run, cfg

    def on_start(self, info: dict) -> None:
        self.run.write_start(self.cfg, info)

    def on_epoch_end(self, end: EpochEnd) -> None:
        self.run.append_metrics(end.record, end.step_losses)


class _Events(Callback):
    """TensorBoard scalars per epoch (`report.tensorboard.EventWriter`); a resumed run
    writes its earlier epochs again first (the event files start afresh)."""

    def __init__(self, writer, resume=None):
        self.writer, self.resume = writer, resume

    def on_start(self, info: dict) -> None:
        if self.resume is not None:
            self.resume.replay(self.writer)

    def on_epoch_end(self, end: EpochEnd) -> None:
        self.writer.write_epoch(end.record, end.step_losses)


def train_and_evaluate(
    cfg: config_lib.Config,
    workdir: str | os.PathLike | None,
    reporter: Callback | None = None,
    dataset=None,
    layout: parallel.Layout | None = None,
    *,
    checkpoints=None,
    resume=None,
    stop=None,
) -> dict:
    """Trains and evaluates `cfg.train.seeds` models as `cfg` says; returns the summary dict.

    With a `workdir`, writes config.json, environment.json, metrics.jsonl,
    summary.json, confusion_matrix.json and params.npz there (several seeds:
    per-seed figures and parameters stacked along a leading seed axis); in a
    multi-process run only process 0 writes or reports. `dataset` (a
    `jaxmnist.data.Dataset`) skips loading, for tests; `layout` defaults to the
    mesh `cfg.parallel` asks for. `checkpoints` (`checkpoint.CheckpointOptions`)
    saves Orbax checkpoints in workdir/checkpoints; `resume` (`resume.Resumer`)
    continues workdir from its newest checkpoint; `stop` (`preemption.StopRequest`)
    ends the run within about a second, after a checkpoint, with `preemption.Stopped`.
    """
    from jaxmnist.data import load_dataset

    wall_start = time.perf_counter()
    main = parallel.is_main_process()
    if layout is None:
        layout = layout_for(cfg)
    parallel.check_layout(layout, num_models=cfg.train.seeds, batch_size=cfg.train.batch_size)
    if cfg.compile_cache:
        runtime.enable_compilation_cache()
    run = None
    if workdir is not None and main:
        run = resume.writer() if resume else rundir.RunWriter(workdir)
    if dataset is None:
        dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=cfg.data.download)
    config_lib.validate(cfg, num_train_examples=len(dataset.train_labels))
    if run:
        run.write_data(dataset)  # where the data came from, for `jaxmnist eval`
    events = _event_writer(run, cfg)
    saver = _checkpointer(workdir, checkpoints, resume)
    callbacks = [
        reporter if main else None,
        run and _RunFiles(run, cfg),
        events and _Events(events, resume),
        saver,
    ]
    try:
        r = train_population(
            cfg,
            seed_members(cfg),
            dataset,
            callbacks,
            layout=layout,
            start=resume,
            interrupt=stop and (lambda: stop.requested),
            every_steps=(checkpoints.every_steps,) if saver else (),
        )
    except TrainingError as e:  # a non-finite loss: the bad state was never checkpointed
        if run and saver:
            from jaxmnist.runs.resume import mark_diverged

            mark_diverged(workdir, str(e))
        raise
    finally:
        if saver:
            saver.close()  # waits for the last asynchronous write
    complete = r.steps == r.plan.total_steps or all(r.reached)  # a late signal changes nothing
    if r.stopped and not complete:
        from jaxmnist.training.preemption import Stopped

        if events:
            events.close()
        raise Stopped(
            f"stopped at step {r.steps}; resume with: jaxmnist train --resume {workdir}",
            stop.exit_code,
        )

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
        "devices": layout.size,
        "mesh": layout.describe()["mesh"],
        "wall_seconds": time.perf_counter() - wall_start,
    }
    if models > 1:
        summary.update(seed_summary(r))
    if cfg.train.target_accuracy is not None:
        summary.update(_target_summary(cfg, r))
    params = r.population.params(r.states)  # every process: the gather is collective
    if run:
        first = jax.tree.map(lambda x: x[0], params)  # predictions: the first seed's model
        _save_predictions(run, cfg, first, dataset, r.test.confusion[0], events, r.steps)
        per_seed = r.test.confusion if models > 1 else None
        run.write_end(
            summary,
            r.test.confusion[0],
            params if models > 1 else first,
            dataset.spec.class_names,
            confusion_per_seed=per_seed,
        )
    if reporter is not None and main:
        reporter.on_finish(summary)
    return summary


def _checkpointer(workdir, options, resume):
    """The checkpoint callback (every process: an Orbax save is collective), or None."""
    if workdir is None or options is None:
        return None
    from jaxmnist.runs.checkpoint import Checkpointer

    return Checkpointer(workdir, options, resume=resume)


def layout_for(cfg, num_models: int | None = None) -> parallel.Layout:
    """The mesh `cfg.parallel` asks for (a ConfigError when it cannot be had)."""
    mesh = parallel.parse_mesh(cfg.parallel.mesh)
    if cfg.parallel.devices is None:  # one device, unless a mesh names more
        devices = mesh["members"] * mesh["data"] if mesh else 1
    else:
        devices = parallel.parse_devices(cfg.parallel.devices)
    return parallel.build_layout(
        devices, mesh, num_models=cfg.train.seeds if num_models is None else num_models
    )


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


def _save_predictions(run, cfg, params: Any, dataset, confusion, events, step: int) -> None:
    """test_predictions.npz for reports (and the final TensorBoard images)."""
    from jaxmnist.report.predictions import save_test_predictions

    params = jax.device_put(params, parallel.default_device())
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
        r["epoch_seconds"]
        for r, n in zip(records, plan.epoch_steps, strict=False)
        if n == plan.steps_per_epoch
    ]
    return float(np.median(full[1:])) if len(full) > 1 else None
