"""The run loop's vocabulary: the hooks it calls and the records it hands them.

Everything that watches a run (the terminal, the run directory, TensorBoard,
checkpoints, a sweep's table, a test or a caller's own code) is a `Callback`.
The loop calls every hook of every callback in the order the callbacks were
given:

    on_start(RunStart)        set up; what a resume restored is in `progress`
    on_compiled(seconds)      every program compiled
    on_estimate(epoch_s, step_s)   a long epoch's duration, once its first steps are timed
    on_epoch_start(epoch, num_steps, first_step)
    on_steps(StepsEnd)        a call ended inside an epoch
    on_epoch_end(EpochEnd)    an epoch ended and was evaluated
    on_finish(RunEnd)         the run ended and was summarised (not after a stop)

This module sits below the loop, the run directory and checkpoints, so that each
of them can depend on it and none on another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # annotations only: `jaxmnist train --help` imports this without numpy
    import numpy as np


class Evaluation(NamedTuple):
    """One evaluation set, every member: arrays with a leading member axis (N,)."""

    loss: np.ndarray  # float64 (N,): mean cross-entropy over the real examples
    accuracy: np.ndarray  # float64 (N,)
    confusion: np.ndarray  # int64 (N, C, C)
    count: int


class Progress(NamedTuple):
    """Where a run stands: enough to start the loop again there, mid-epoch too."""

    epoch: int = 0  # epochs done
    step: int = 0
    records: tuple = ()  # metrics.jsonl lines of the epochs done
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    epoch_step: int = 0  # steps done in epoch `epoch + 1`
    metrics: list | None = None  # its accumulators (per chunk), when epoch_step > 0
    epoch_seconds: float = 0.0  # its training time so far


class RunStart(NamedTuple):
    """What `on_start` is handed: the run as set up, before anything compiles."""

    cfg: Any  # config.Config
    info: dict  # facts for environment.json and the terminal (dataset, devices, plan, ...)
    progress: Progress  # Progress() for a new run; where a resumed run continues
    dataset: Any = None  # data.Dataset, when the run was given one (the loop always is)

    @property
    def resumed(self) -> bool:
        return self.progress.step > 0 or bool(self.progress.records)


class StepsEnd(NamedTuple):
    """Where the loop stands after a call that did not end its epoch."""

    epoch: int  # the epoch under way (1-based)
    step: int  # optimizer steps taken so far
    epoch_step: int  # of them, in this epoch
    states: list  # one TrainState per chunk (donated to the next call: copy to keep)
    metrics: list  # one step.EpochMetrics per chunk: this epoch's accumulators so far
    population: Any  # population.Population
    train_seconds: float  # training time so far, this epoch's part included
    epoch_seconds: float  # this epoch's part
    stopping: bool = False  # a stop was asked for (in any process): the run ends here


class EpochEnd(NamedTuple):
    """What an epoch did, handed to every callback."""

    epoch: int
    step: int  # optimizer steps taken so far
    record: dict  # the metrics.jsonl line: means over the members, plus per-member lists
    step_losses: np.ndarray  # float32 (steps,): this epoch's losses, mean over the members
    losses: np.ndarray  # float32 (members, steps)
    test: Evaluation
    states: list  # one TrainState per chunk, on the devices (stacked along members)
    population: Any  # population.Population
    stopping: bool = False  # a stop was asked for (in any process): the run ends here


class RunResult(NamedTuple):
    """What the loop did. Evaluations hold one row per member."""

    population: Any  # population.Population
    states: list  # one TrainState per chunk, stacked along the member axis
    plan: Any  # config.StepPlan
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
    # The ensemble of every member after the last epoch run (training.evaluate.EvalResult),
    # on the test set; None for one model, a sweep's points, or none run.
    ensemble: Any = None
    # Its log-probabilities on the test set, float32 (batches, batch, C) on the device,
    # padded as the set was for evaluation; None where `ensemble` is.
    ensemble_log_probs: Any = None


class RunEnd(NamedTuple):
    """What `on_finish` is handed: the finished run, summarised."""

    summary: dict  # summary.json
    result: RunResult
    params: Any  # every member's parameters on the host, member axis first
    # float32 (N, C) on the test set: the ensemble's where the run has one, else the first
    # member's; `predicted_by` says whose, in words
    test_probabilities: np.ndarray | None
    dataset: Any  # data.Dataset
    predicted_by: str = ""


class Callback:
    """Hooks of the run loop (see the module doc); subclasses override what they need."""

    def on_start(self, start: RunStart) -> None: ...
    def on_compiled(self, seconds: float) -> None: ...
    def on_estimate(self, epoch_seconds: float, seconds_per_step: float) -> None: ...
    def on_epoch_start(self, epoch: int, num_steps: int, first_step: int) -> None: ...
    def on_steps(self, end: StepsEnd) -> None: ...
    def on_epoch_end(self, end: EpochEnd) -> None: ...
    def on_finish(self, end: RunEnd) -> None: ...


class Callbacks(Callback):
    """Many callbacks as one: each hook calls every callback's, in order (None is skipped)."""

    def __init__(self, callbacks=()):
        if isinstance(callbacks, Callback):
            callbacks = [callbacks]
        self.items = [c for c in callbacks if c is not None]

    def _each(self, hook: str, *args) -> None:
        for c in self.items:
            getattr(c, hook)(*args)

    def on_start(self, start: RunStart) -> None:
        self._each("on_start", start)

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

    def on_finish(self, end: RunEnd) -> None:
        self._each("on_finish", end)
