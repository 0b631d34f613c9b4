"""The run loop: set up, compile, run epochs from any starting epoch, call back.

`train_population(cfg, members, dataset, callbacks)` trains a population
(`population`: one model or many, on the mesh of a `parallel.Layout`) in three
stages:

    setup      plan the steps, estimate memory and cut the members into chunks,
               initialise the states, place the data on the mesh
    compile    every distinct program ahead of time, so compile time is measured
               on its own and training never compiles
    epochs     run each epoch in calls of about half a second (`pacing`: a short
               epoch is one call), so that a stop, a checkpoint or progress can
               come between them; evaluate exactly, hand an `EpochEnd` to every
               callback, then ask the stop rules whether to go on. Before each
               phase (an epoch's steps, each evaluation) the host heap's free
               pages go back to the kernel (`hostmem.hand_back`), and between an
               epoch's calls whenever the heap has grown (`hostmem.GrowthCheck`)

The loop writes nothing itself: the terminal, the run directory, TensorBoard and
checkpoints are callbacks (`hooks`). It can start at a later epoch with the state
and the accumulators of an earlier run (`hooks.Progress`), even in the middle of
an epoch, which is what resuming needs; the callbacks learn where it starts from
`on_start`. The config arrives validated and the mesh built: nothing here checks
them again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import hostmem, optim
from jaxmnist.errors import TrainingError
from jaxmnist.models import count_params, get_model
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training import memory, pacing, parallel, validation
from jaxmnist.training.hooks import (
    Callbacks,
    EpochEnd,
    Evaluation,
    Progress,
    RunResult,
    RunStart,
    StepsEnd,
)
from jaxmnist.training.population import EpochTotals, Population
from jaxmnist.training.step import TrainData, init_state

__all__ = ["Setup", "place_train_data", "setup_run", "train_population"]


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
    """Stop rule: stop after the first epoch at which every point's mean accuracy on
    `split` ("test", or "val": the validation split) has reached `target`. `points[i]` is
    the point member i belongs to."""

    def __init__(self, target: float | None, points: np.ndarray, split: str = "test"):
        self.target, self.points, self.split = target, points, split
        self.reached: list = [None] * (int(points.max()) + 1)

    def __call__(self, end: EpochEnd, train_seconds: float) -> bool:
        if self.split == "test":
            return self.update(end.epoch, end.test.accuracy, train_seconds)
        return self.update(end.epoch, self.accuracy(end.record), train_seconds)

    def accuracy(self, record: dict) -> np.ndarray:
        """(members,): each member's accuracy on the split watched, from a metrics record."""
        key = f"{self.split}_accuracy"
        return np.asarray(record.get(f"{key}_per_seed", [record[key]]))

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
            done = self.update(r["epoch"], self.accuracy(r), seconds)
        return done


class Setup(NamedTuple):
    """A run set up and ready to compile: nothing has been compiled yet."""

    cfg: config_lib.Config
    plan: config_lib.StepPlan
    population: Population
    states: list
    train_data: TrainData
    eval_sets: dict  # name -> evaluate.PlacedBlocks, every block of one shape
    info: dict


def setup_run(
    cfg, members, dataset, layout: parallel.Layout | None = None, ensemble: bool = False
) -> Setup:
    """Plans, checks memory, initialises the states and places the data (see the module doc).
    `cfg` is validated and `layout` checked for this population by the caller. `ensemble`:
    evaluate the ensemble of every member too (`Population`)."""
    # The validation examples leave the training set here, before anything counts it.
    split = validation.split_training_set(
        dataset.train_images, dataset.train_labels, cfg.data.validation
    )
    spec, n_train = dataset.spec, len(split.labels)
    layout = layout or parallel.build_layout(1)
    plan = config_lib.plan_steps(cfg.train, n_train)
    input_shape, num_classes = dataset.train_images.shape[1:], len(spec.class_names)
    optimizer = optim.make_optimizer(cfg.optimizer, plan.total_steps)
    shapes = jax.eval_shape(  # from a raw key's shape: no key is made on the device
        lambda raw: init_state(
            jax.random.wrap_key_data(raw), cfg, optimizer, input_shape, num_classes
        ),
        jax.ShapeDtypeStruct((2,), np.uint32),
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
    info.update(get_model(cfg.model.name).run_facts(cfg.model, input_shape))  # conv_impl
    pop = Population(
        cfg, optimizer, members, (len(members),), input_shape, num_classes,
        len(plan.epoch_steps), layout, ensemble=ensemble,
    )  # fmt: skip
    # Estimated from the compiled programs before any data or state is allocated: chunks
    # that fit, or one clear line. The programs compiled for it are the run's own.
    chunks, about = memory.chunks_for(cfg, pop, plan.steps_per_epoch, dataset)
    info["staged_batches"] = pop.staged  # gathered where the plans are drawn (`population`)
    info["augmented_ahead"] = pop.augment_ahead  # in a program of their own (`population`)
    if len(members) > 1:
        info.update(models=len(members), seeds=sorted({m.seed for m in members}), **about)
    if chunks != pop.chunks:
        pop = pop.in_chunks(chunks)
    states = pop.init_states()
    train_data = place_train_data(split.images, split.labels, layout)
    pop.hold_plan_data(split.images, split.labels, train_data)
    sets = {"test": (dataset.test_images, dataset.test_labels, None)}
    if split.val_indices is not None:
        sets["val"] = (dataset.train_images, dataset.train_labels, split.val_indices)
    if cfg.train.eval_train:  # all of it, or a fixed subset (train.eval_train_examples)
        subset = evaluate_lib.train_eval_indices(cfg.train, split.labels)
        sets["train"] = (split.images, split.labels, subset)
    info.update(evaluate_lib.train_eval_facts(cfg.train, n_train))
    info.update(validation.validation_facts(cfg.data.validation))
    counts = {name: len(y if i is None else i) for name, (_, y, i) in sets.items()}
    shape = evaluate_lib.block_shape(counts.values(), cfg.train.eval_batch_size, layout.data)
    eval_sets = {
        name: evaluate_lib.place_eval_blocks(x, y, shape, layout, subset)
        for name, (x, y, subset) in sets.items()
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
    ensemble: bool | None = None,
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
    of each of `every_steps` (e.g. where a checkpoint is due). `ensemble`: also evaluate
    the ensemble of every member on the test set after each epoch (all its chunks
    together; `ensemble_test_*` in the records), and on the validation split when there
    is one (`ensemble_val_*`); by default when there are several members and no `points`
    (seeds of one config, not the points of a sweep).
    """
    calls = Callbacks(callbacks)
    if ensemble is None:
        ensemble = len(members) > 1 and points is None
    run = setup_run(cfg, members, dataset, layout, ensemble)
    if callable(start):
        start = start(run)
    progress, states = (Progress(), run.states) if start is None else start
    calls.on_start(RunStart(cfg, run.info, progress, dataset))
    compile_seconds = _compile(run)
    calls.on_compiled(compile_seconds)
    points = np.zeros(len(members), int) if points is None else np.asarray(points)
    target = TargetAccuracy(cfg.train.target_accuracy, points, cfg.train.target_split)
    every = (*every_steps, cfg.train.progress_every)
    loop = _Loop(run, calls, target, stop_on_nonfinite, interrupt or (lambda: False), every)
    return loop.run(states, progress, (target, *stop_rules), compile_seconds)


def _compile(run: Setup) -> float:
    """Compiles every distinct program ahead of time; returns the seconds compiling took,
    the memory estimate's compiles (in `setup_run`, reused here) included. A chunk's
    programs compile at once (`population.compile_all`): the seconds are the wall
    clock's, and `run.info["compile_programs"]` gets each program's own."""
    run.population.compile(run.plan.steps_per_epoch, run.train_data, run.eval_sets)
    start = time.perf_counter()
    parallel.agree(0.0, False)  # several processes: its collective compiles here too
    # Each program's compile, for the terminal and summary.json (`compile_programs`).
    run.info["compile_programs"] = dict(run.population.compile_times)
    return run.population.compile_seconds + time.perf_counter() - start


class _Loop:
    """The epochs of one run (see the module doc)."""

    def __init__(self, run: Setup, calls, target, stop_on_nonfinite, interrupt, every):
        self.setup, self.calls, self.target = run, calls, target
        self.stop_on_nonfinite, self.interrupt = stop_on_nonfinite, interrupt
        self.pacer = pacing.Pacer(every)
        self.estimated = False
        self.growth = hostmem.GrowthCheck(_working_bytes(run.population.steps_fns.values()))
        self.eval_working = eval_working_bytes(run.population)
        self.eval_growth = {n: hostmem.GrowthCheck(b) for n, b in self.eval_working.items()}
        self.eval_block = 0  # the working memory of the evaluations since the last hand-back

    def run_steps(self, states, metrics, plans, done: int, num_steps: int, step: int):
        """One call, from step `done` of the epoch; returns (states, metrics, steps run,
        seconds, stopping)."""
        pop = self.setup.population
        stop = self.pacer.next_stop(done, num_steps, step)
        t0 = time.perf_counter()
        self.growth.before_call()
        states, metrics = pop.train_steps(states, metrics, plans, self.setup.train_data, done, stop)
        leaves = jax.tree.leaves(metrics)
        self.growth.watch(lambda: all(x.is_ready() for x in leaves))
        jax.block_until_ready(metrics)
        self.growth.after_call()  # timed too: its wait is part of the run
        seconds = time.perf_counter() - t0
        # Every process paces by the slowest clock and stops when any is asked to.
        paced, stopping = parallel.agree(seconds, self.interrupt())
        self.pacer.record(stop - done, paced)
        # The run's first steps still warm up: the estimate waits for a steady call.
        if not self.estimated and self.pacer.settled():
            self.estimated = True
            total = self.pacer.epoch_seconds(self.setup.plan.steps_per_epoch)
            self.calls.on_estimate(total, self.pacer.seconds_per_step)
        return states, metrics, stop - done, seconds, stopping

    def epoch_steps(self, epoch: int, states, metrics, done: int, step: int, clock: list):
        """Runs epoch `epoch` from its step `done` in calls until it ends or a stop is agreed;
        returns (states, metrics, steps done in the epoch, stopping). `clock` holds
        [train seconds, this epoch's seconds], advanced by each call."""
        pop, num_steps = self.setup.population, self.setup.plan.epoch_steps[epoch - 1]
        hostmem.hand_back()  # the evaluations' working memory, before the steps' own
        self.growth.reset()
        t0 = time.perf_counter()
        # Waited for here: the epoch's time, but not its first call's, which the pacer
        # takes as the speed of a step (a population's shuffles can take seconds).
        plans = pop.plan_epoch(epoch - 1, (done, num_steps), self.setup.train_data)
        plans = jax.block_until_ready(plans)
        waited = time.perf_counter() - t0
        clock[0] += waited
        clock[1] += waited
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
                totals = pop.host_metrics(states, metrics, done)
                self.check_finite(totals.losses, epoch, step, [])
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
        test, together, stopping = None, None, False
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
            totals = pop.host_metrics(states, metrics, num_steps)
            self.check_finite(totals.losses, epoch, step - num_steps, diverged)
            t0 = time.perf_counter()
            test, together = self.evaluate(states, "test")
            val = together_val = None
            if "val" in run.eval_sets:  # the validation split (data.validation)
                val, together_val = self.evaluate(states, "val", follows=True)
            t1 = time.perf_counter()
            train_eval = None
            if cfg.train.eval_train:
                train_eval, _ = self.evaluate(states, "train", follows=True)
            t2 = time.perf_counter()
            eval_seconds += t2 - t0
            record = epoch_record(
                epoch=epoch,
                step=step,
                examples=num_steps * cfg.train.batch_size,
                totals=totals,
                test=test,
                val=val,
                train_eval=train_eval,
                ensemble=together,
                ensemble_val=together_val,
                seconds=clock[1],
                eval_seconds=(t1 - t0, t2 - t1),
            )
            records.append(record)
            losses = totals.losses
            end = EpochEnd(epoch, step, record, losses.mean(0), losses, test, states, pop, stopping)
            calls.on_epoch_end(end)
            if sum(bool(rule(end, clock[0])) for rule in stop_rules) or stopping:
                break
        if test is None and not stopping:  # resumed at its last checkpoint, or past its target
            test, together = self.evaluate(states, "test")
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
            together,
            pop.ensemble_log_probs.get("test") if together is not None else None,
        )

    def evaluate(
        self, states, name: str, follows: bool = False
    ) -> tuple[Evaluation, evaluate_lib.EvalResult | None]:
        """Every member on eval set `name`, and the ensemble of them where the population
        evaluates it (`Population.evaluate`). Each evaluation is a program of its own size:
        the heap's free pages go back first (`hostmem.hand_back`), so that a block the
        last program freed, and a small request then cut, is not held twice; except when
        it `follows` other evaluations whose programs needed at least its working memory
        (the sets share a batch size): it reuses their block, which, handed back, would
        only be faulted in again; should it take fresh pages instead, the growth check
        hands that block back while it runs."""
        need, growth = self.eval_working[name], self.eval_growth[name]
        reuse = follows and need <= self.eval_block
        if not reuse:
            hostmem.hand_back()
            self.eval_block = need
        growth.reset(from_now=reuse)
        data = self.setup.eval_sets[name]
        return self.setup.population.evaluate(states, name, data, growth.watch)

    def check_finite(self, losses, epoch: int, first_step: int, diverged: list) -> None:
        members = self.setup.population.members
        for i in _check_finite(losses, epoch, first_step, members, self.stop_on_nonfinite):
            if i not in diverged:
                diverged.append(i)


def eval_working_bytes(pop) -> dict[str, int]:
    """Eval set name -> the largest working memory of its compiled evaluations (one per
    chunk size) in population `pop`."""
    programs = pop.eval_fns.items()
    names = {name for _, name in pop.eval_fns}
    return {name: _working_bytes(f for (_, n), f in programs if n == name) for name in names}


def _working_bytes(programs) -> int:
    """The largest working memory (temporaries) of compiled `programs`, where the backend
    reports it (0 where not)."""
    sizes = [getattr(p.memory_analysis(), "temp_size_in_bytes", 0) for p in programs]
    return max(sizes, default=0)


def plural(n: int, noun: str) -> str:
    """`1 epoch`, `2 epochs`, `1,000 steps`."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def run_length(info: dict) -> str:
    """A run's length for a start line, from `setup_run`'s info: `3 epochs x 234 steps`,
    or what a step count cut it to: `80 steps`, `300 steps in 2 epochs of up to 234`."""
    epochs, per_epoch = info["epochs"], info["steps_per_epoch"]
    total = info.get("total_steps", epochs * per_epoch)
    if total == epochs * per_epoch:
        return f"{plural(epochs, 'epoch')} x {plural(per_epoch, 'step')}"
    if epochs == 1:
        return plural(total, "step")
    return f"{plural(total, 'step')} in {epochs:,} epochs of up to {per_epoch:,}"


def devices_text(info: dict) -> str:
    """The devices a run uses, from `setup_run`'s info: `cpu:0`, or for several
    `4 devices (cpu:0-3), mesh members 1 x data 4` (ids in a row shown as a range)."""
    devices = info.get("devices") or [info["device"]]
    if len(devices) == 1:
        return devices[0]
    names = [d.rpartition(":") for d in devices]
    prefixes = {head for head, _, _ in names}
    ids = [tail for _, _, tail in names]
    in_a_row = all(i.isdigit() for i in ids) and [int(i) for i in ids] == list(
        range(int(ids[0]), int(ids[0]) + len(ids))
    )
    if len(prefixes) == 1 and in_a_row:
        which = f"{devices[0]}-{ids[-1]}"
    else:
        which = f"{devices[0]}, …, {devices[-1]}"
    mesh = info.get("mesh") or {}
    shape = " x ".join(f"{name} {size}" for name, size in mesh.items())
    return f"{len(devices)} devices ({which})" + (f", mesh {shape}" if shape else "")


def epoch_record(
    *,
    epoch: int,
    step: int,
    examples: int,
    totals: EpochTotals,
    test: Evaluation,
    train_eval: Evaluation | None,
    seconds: float,
    val: Evaluation | None = None,
    eval_seconds: tuple[float, float] = (0.0, 0.0),
    ensemble: evaluate_lib.EvalResult | None = None,
    ensemble_val: evaluate_lib.EvalResult | None = None,
) -> dict:
    """One metrics.jsonl line; `examples`: training examples per member this epoch.

    `train_loss` is the mean loss of the epoch's batches, as trained; with the training
    set evaluated (`eval_train`), `train_accuracy` and `train_set_loss` are its figures
    after the epoch, as `jaxmnist eval` measures them, over `train_eval_examples` examples
    (a subset of them: `train.eval_train_examples`). `eval_seconds` (the test set's
    evaluation, then the training set's) are recorded as `eval_seconds` (both) and
    `train_eval_seconds`, beside `epoch_seconds` (training alone).

    Figures are means over the members, so one member's line is exactly a single
    run's; several members add per-member lists (`*_per_seed`) and the spread of
    test accuracy, and with `ensemble` (the ensemble of every member on the test set)
    `ensemble_test_accuracy` and `ensemble_test_loss` (the cross-entropy of the mean
    probabilities). With `val` (the validation split, `data.validation`), `val_loss` and
    `val_accuracy` follow the test figures, with their spread and per-member lists too;
    with `ensemble_val` (the ensemble on that split), `ensemble_val_accuracy` and
    `ensemble_val_loss`.
    examples_per_second counts every member's examples.
    """
    losses, learning_rates = totals.losses, totals.learning_rates
    train_loss = losses.mean(axis=1)
    batch_accuracy = totals.correct / examples
    train_accuracy = train_eval.accuracy if train_eval is not None else batch_accuracy
    record = {
        "epoch": epoch,
        "step": step,
        "train_loss": float(train_loss.mean()),
        "train_accuracy": float(train_accuracy.mean()),
        "train_batch_accuracy": float(batch_accuracy.mean()),
        "test_loss": float(test.loss.mean()),
        "test_accuracy": float(test.accuracy.mean()),
        **({} if val is None else {"val_loss": float(val.loss.mean())}),
        **({} if val is None else {"val_accuracy": float(val.accuracy.mean())}),
        "learning_rate": None if learning_rates is None else float(learning_rates.mean()),
        "epoch_seconds": seconds,
        "examples_per_second": len(losses) * examples / seconds,
    }
    if train_eval is not None:
        # Named apart from `train_loss`, the batches' mean as trained (augmented, dropout
        # on): this is the figure `jaxmnist eval` reports for the training set.
        record["train_set_loss"] = float(np.mean(train_eval.loss))
        record["train_eval_examples"] = train_eval.count
    record["eval_seconds"] = sum(eval_seconds)
    if train_eval is not None:
        record["train_eval_seconds"] = eval_seconds[1]
    if len(losses) > 1:
        record.update(
            test_accuracy_std=float(test.accuracy.std(ddof=1)),
            test_accuracy_per_seed=test.accuracy.tolist(),
            test_loss_per_seed=test.loss.tolist(),
            train_accuracy_per_seed=np.asarray(train_accuracy, np.float64).tolist(),
            train_loss_per_seed=train_loss.astype(np.float64).tolist(),
        )
        if val is not None:
            record.update(
                val_accuracy_std=float(val.accuracy.std(ddof=1)),
                val_accuracy_per_seed=val.accuracy.tolist(),
                val_loss_per_seed=val.loss.tolist(),
            )
    if ensemble is not None:
        record.update(ensemble_test_accuracy=ensemble.accuracy, ensemble_test_loss=ensemble.loss)
    if ensemble_val is not None:
        record.update(
            ensemble_val_accuracy=ensemble_val.accuracy, ensemble_val_loss=ensemble_val.loss
        )
    return record
