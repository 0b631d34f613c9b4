"""A batch of trials: asked together, trained as a sweep, told together.

A batch is K trials asked from the study before any is told. Their configs are sweep
points (`sweep.Point`), grouped by program (`sweep.group_points`): trials that differ
only in traced values (learning rate, weight decay, momentum) train as one vmapped
population of trials × seeds through the run loop (`training.loop.train_population`),
exactly as a sweep's grid points do; a value that changes a shape starts another
program. After every epoch each trial reports its mean validation accuracy over its
seeds to the study, and a trial the pruner stops is told PRUNED at once; a program
whose trials are all pruned ends there (the survivors of a program keep it running:
its members are one array). A finished trial's objective is the mean over its seeds of
the last epoch's validation accuracy; its test accuracy is recorded beside it and
never told to the study.

K (`batch_size`) is as many trials as fit, with their seeds, in one memory chunk of
the widest program of the space (`training.memory`'s estimate from the compiled
programs), at most `--batch` and the trials left.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable

import jax
import numpy as np
import optuna
from optuna.trial import TrialState

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.errors import ConfigError
from jaxmnist.models import count_params
from jaxmnist.search.space import Param, trial_config
from jaxmnist.search.sweep import Point, SweepReporter, format_value, get_field, group_points
from jaxmnist.training import memory
from jaxmnist.training.hooks import Callback, EpochEnd
from jaxmnist.training.loop import train_population
from jaxmnist.training.parallel import layout_for
from jaxmnist.training.population import TRACED_FIELDS, Member, Population
from jaxmnist.training.step import init_state

# The objective's source: each epoch's record (training.loop.epoch_record) holds the
# held-out validation split's accuracy, per member when there are several.
METRIC = "val_accuracy"


def per_member(record: dict, name: str) -> np.ndarray:
    """`name` of every member from one epoch record: its `*_per_seed` list when the
    population has several members, else the record's single figure."""
    return np.asarray(record.get(f"{name}_per_seed", [record[name]]), np.float64)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _widest(base: config_lib.Config, params: list[Param], dataset) -> config_lib.Config:
    """The config of the space whose program needs the most memory, as far as one can
    tell without compiling each: each range at its top, each choice at the one with the
    most model parameters."""
    shape = dataset.train_images.shape[1:]
    classes = len(dataset.spec.class_names)
    cfg = base
    for p in params:
        if p.kind != "choice":
            cfg = trial_config(cfg, {p.key: p.high})
            continue

        def size(choice, p=p, cfg=cfg):
            c = trial_config(cfg, {p.key: choice})
            opt = optim.make_optimizer(c.optimizer, 1)
            state = jax.eval_shape(
                lambda k, c=c, opt=opt: init_state(k, c, opt, shape, classes), jax.random.key(0)
            )
            return count_params(state.params), count_params(state.opt_state)

        cfg = trial_config(cfg, {p.key: max(p.choices, key=size)})
    return cfg


def batch_size(base: config_lib.Config, params: list[Param], dataset, cap: int) -> tuple[int, dict]:
    """(K, what to tell the user): trials per batch (see the module doc)."""
    cfg = _widest(base, params, dataset)
    seeds = cfg.train.seeds
    try:
        config_lib.validate(cfg)
    except ConfigError:  # the corners of the space may not be a valid config together
        cfg = base
    # The validation examples leave the training set before an epoch is planned.
    plan = config_lib.plan_steps(cfg.train, len(dataset.train_labels) - cfg.data.validation)
    layout = layout_for(cfg.parallel, num_models=seeds, batch_size=cfg.train.batch_size)
    members = [Member.of(cfg, cfg.train.seed + s) for s in range(seeds)]
    pop = Population(
        cfg,
        optim.make_optimizer(cfg.optimizer, plan.total_steps),
        members,
        (seeds,),
        dataset.train_images.shape[1:],
        len(dataset.spec.class_names),
        len(plan.epoch_steps),
        layout,
    )
    budget, source = memory.device_budget(cfg)
    # as each trial's run decides it (`memory.chunks_for`)
    memory.choose_staging(cfg, pop, plan.steps_per_epoch, dataset, budget)
    est = memory.estimate_for(cfg, pop, plan.steps_per_epoch, dataset, (seeds,))
    if budget is None:
        return cap, {"batch": cap, "memory_budget_source": source}
    per_model = max(est.resident_per_model + est.transient_per_model, 1)
    fit = max(0, (budget - est.shared_bytes - est.transient_fixed) // per_model)
    fit *= layout.members
    k = max(1, min(cap, fit // seeds))
    return k, {
        "batch": k,
        "models_that_fit": int(fit),
        "memory_budget_mb": round(budget / memory.MB),
        "memory_budget_source": source,
    }


class Pruning(Callback):
    """Reports each trial's mean validation accuracy after every epoch; tells a trial
    the pruner stops PRUNED. The pruner is asked only after an epoch that is neither the
    first (one epoch's figures are too early to compare) nor the last (a trial that has
    trained every epoch is complete, whatever its rank). `pruned` holds the trials
    (indices) told so far."""

    def __init__(self, study: optuna.Study, trials: list, point_of: np.ndarray, stats: dict):
        self.study, self.trials, self.point_of, self.stats = study, trials, point_of, stats
        self.pruned: set[int] = set()
        self.last_epoch = 0  # the run's, known at `on_start`

    def on_start(self, start) -> None:
        self.last_epoch = start.info["epochs"]

    def on_epoch_end(self, end: EpochEnd) -> None:
        may_prune = 1 < end.epoch < self.last_epoch
        val = per_member(end.record, METRIC)
        test = per_member(end.record, "test_accuracy")
        for p, trial in enumerate(self.trials):
            if p in self.pruned:
                continue
            idx = self.point_of == p
            self.stats[p]["val_accuracy_by_epoch"].append(float(val[idx].mean()))
            trial.report(float(val[idx].mean()), end.epoch)
            if may_prune and trial.should_prune():
                self.pruned.add(p)
                self.stats[p].update(
                    epochs=end.epoch,
                    val_accuracy_per_seed=val[idx].tolist(),
                    test_accuracy_per_seed=test[idx].tolist(),
                )
                _record(trial, self.stats[p])
                self.study.tell(trial, state=TrialState.PRUNED)

    def all_pruned(self, end: EpochEnd, train_seconds: float) -> bool:
        """A stop rule: this program's trials are all pruned."""
        return len(self.pruned) == len(self.trials)


class _Reporter(SweepReporter):
    """The sweep's start and compile lines; per epoch, the best validation accuracy."""

    def __init__(self, log, title, point_of, num_points, pruning: Pruning):
        super().__init__(log, title, point_of, num_points)
        self.pruning = pruning

    def on_epoch_end(self, end: EpochEnd) -> None:
        val = per_member(end.record, METRIC)
        live = [p for p in range(self.num_points) if p not in self.pruning.pruned]
        best = max((val[self.point_of == p].mean() for p in live), default=math.nan)
        pruned = len(self.pruning.pruned)
        self.log(
            f"  epoch {end.record['epoch']}: best trial's mean validation accuracy "
            f"{best:.2%}"
            + (f", {pruned} pruned" if pruned else "")
            + f" ({end.record['epoch_seconds']:.2f} s)"
        )


def _record(trial: optuna.Trial, stats: dict) -> None:
    """What the study keeps of a trial besides its value (its user attributes)."""
    test = stats.get("test_accuracy_per_seed") or []
    stats["test_accuracy_mean"] = float(np.mean(test)) if test else None
    for key, value in stats.items():
        trial.set_user_attr(key, value)


def run_batch(
    study: optuna.Study,
    trials: list[optuna.Trial],
    values: list[dict],
    base: config_lib.Config,
    params: list[Param],
    dataset,
    *,
    batch: int,
    log: Callable[[str], None],
) -> list[dict]:
    """Trains `trials` (asked, admitted, with the `values` drawn for each by `suggest`)
    and tells the study their outcome; returns their stats (the user attributes
    recorded with each)."""
    seeds = base.train.seeds
    points, stats = [], []
    for i, drawn in enumerate(values):
        cfg = trial_config(base, drawn)
        points.append(Point(i, drawn, cfg))
        stats.append(
            {
                "batch": batch,
                "worker": worker_name(),
                "seeds": [cfg.train.seed + s for s in range(seeds)],
                "val_accuracy_by_epoch": [],
                "diverged_seeds": [],
            }
        )
    valid = []
    for point, trial in zip(points, trials):
        try:
            config_lib.validate(point.cfg)
            valid.append(point)
        except ConfigError as e:  # a combination the config refuses: not trainable
            log(f"  trial {trial.number} ({point.label}): {e}")
            trial.set_user_attr("error", str(e))
            study.tell(trial, state=TrialState.FAIL)
    groups = group_points(valid)
    for g, group in enumerate(groups):
        cfg = group[0].cfg
        members = [Member.of(p.cfg, p.cfg.train.seed + s) for p in group for s in range(seeds)]
        point_of = np.repeat(np.arange(len(group)), seeds)
        group_trials = [trials[p.index] for p in group]
        group_stats = [stats[p.index] for p in group]
        fixed = {
            p.key: format_value(get_field(cfg, p.key)) for p in params if p.key not in TRACED_FIELDS
        }
        label = ", ".join(f"{k}={v}" for k, v in fixed.items())
        title = f"batch {batch}, program {g + 1}/{len(groups)}" + (f" ({label})" if label else "")
        for s in group_stats:
            s.update(program=label or "all", models_in_program=len(members))
        pruning = Pruning(study, group_trials, point_of, group_stats)
        reporter = _Reporter(log, title, point_of, len(group), pruning)
        layout = layout_for(cfg.parallel, num_models=len(members), batch_size=cfg.train.batch_size)
        r = train_population(
            cfg,
            members,
            dataset,
            (reporter, pruning),
            points=point_of,
            layout=layout,
            stop_on_nonfinite=False,
            stop_rules=(pruning.all_pruned,),
        )
        last = r.records[-1]
        val, test = per_member(last, METRIC), np.asarray(r.test.accuracy, np.float64)
        for p, (trial, s) in enumerate(zip(group_trials, group_stats)):
            idx = np.flatnonzero(point_of == p)
            if p in pruning.pruned:  # told already, with what it had when pruned
                continue
            s.update(
                compile_seconds=r.compile_seconds,
                train_seconds=r.train_seconds,
                diverged_seeds=[members[i].seed for i in idx if i in r.diverged],
                epochs=len(r.records),
                val_accuracy_per_seed=val[idx].tolist(),
                test_accuracy_per_seed=test[idx].tolist(),
            )
            _record(trial, s)
            objective = float(val[idx].mean())
            if math.isfinite(objective):
                study.tell(trial, objective)
            else:
                study.tell(trial, state=TrialState.FAIL)
    return stats
