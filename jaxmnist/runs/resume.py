"""Resuming a run directory: the config it may continue with, its newest checkpoint, and
its files rewound to that checkpoint.

`prepare(run_dir, overrides)` takes the config saved in the run directory and
the fields the command line set again. A field that changes what the run
computes (model, optimizer, batch size, seed, dataset, ...) is refused with one
line naming it; extending the run (`--epochs` or `--steps` larger than before,
under a constant schedule) is allowed, and so are fields that only change where
or how fast it runs (`RESUMABLE`). A run that stopped on a non-finite loss may
change `optimizer.lr`, with a warning: it restarts from the last good
checkpoint and is no longer the original run.

A `Resumer` is the run loop's `start`: it restores the newest intact checkpoint
onto the new run's mesh (any device count), and hands back the progress (epoch,
step, metrics) the loop continues from; the loop passes that progress to every
callback's `on_start` (`writer.RunWriter` rewinds the run's files to it).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.errors import ConfigError
from jaxmnist.runs import checkpoint, rundir
from jaxmnist.runs.reader import read_config
from jaxmnist.runs.rundir import DIVERGED_FILE
from jaxmnist.training.hooks import Progress
from jaxmnist.training.loop import TargetAccuracy
from jaxmnist.training.step import empty_metrics

# Fields a resumed run may change: where and how fast it runs, how long, what it reports.
RESUMABLE = {
    "train.epochs",
    "train.steps",
    "train.target_accuracy",
    "train.target_split",  # which split it watches; data.validation itself changes the maths
    "train.eval_batch_size",
    "train.eval_train_examples",  # each metrics.jsonl line says what its figures cover
    "train.progress_every",
    "parallel.devices",
    "parallel.mesh",
    "data.data_dir",
    "data.download",
    "compile_cache",
    "tensorboard",
    "memory_budget_mb",
}
AFTER_DIVERGENCE = {"optimizer.lr"}  # only for a run stopped by a non-finite loss


def _flat(cfg: config_lib.Config) -> dict:
    out = {}
    for section, value in cfg.to_dict().items():
        if isinstance(value, dict):
            out.update({f"{section}.{k}": v for k, v in value.items()})
        else:
            out[section] = value
    return out


def mark_diverged(run_dir, message: str) -> None:
    rundir.write_json(Path(run_dir) / DIVERGED_FILE, {"error": message})


def _check_extension(old: config_lib.Config, new: config_lib.Config) -> None:
    o, n = old.train, new.train
    if (o.steps is None) != (n.steps is None):
        raise ConfigError("--resume: a run planned in epochs cannot be continued in steps or back")
    longer = n.epochs > o.epochs if n.steps is None else n.steps > o.steps
    if not longer:
        field = "train.epochs" if n.steps is None else "train.steps"
        raise ConfigError(
            f"--resume: {field} may only grow (extend the run), got "
            f"{_get(new, field)} after {_get(old, field)}"
        )
    if old.optimizer.schedule != "constant":
        raise ConfigError(
            f"--resume: extending a run changes its {old.optimizer.schedule} schedule, which is "
            "planned over the whole run; start a new run instead"
        )


def _get(cfg, key: str):
    return _flat(cfg)[key]


def prepare(
    run_dir, overrides: dict, warn=None, *, preset: str | None = None
) -> tuple[config_lib.Config, bool]:
    """(config to continue with, whether the run is extended). ConfigError (exit 2) for a
    refused field; `reader.open_run`'s errors for a directory that holds no run to resume.

    `preset`: a preset named on the command line too. Its config, with `overrides` on
    top, must agree with the saved one outside `RESUMABLE`, as an override must: the run
    continues with its saved config (and `overrides`), so a preset that differs in what
    the run computes would otherwise be ignored without a word."""
    warn = warn or _warn
    path = Path(run_dir)
    old = read_config(path)
    new = config_lib.apply_overrides(old, overrides)
    config_lib.validate(new)
    before, after = _flat(old), _flat(new)
    changed = [k for k in after if after[k] != before.get(k)]
    diverged = (path / DIVERGED_FILE).is_file()
    for key in changed:
        if key in AFTER_DIVERGENCE and diverged:
            continue
        if key not in RESUMABLE:
            why = (
                " (allowed only after a non-finite loss stopped the run)"
                if key in AFTER_DIVERGENCE
                else ""
            )
            _refuse(key, before.get(key), after[key], why)
    if preset is not None:
        claimed = _flat(config_lib.apply_overrides(config_lib.get_preset(preset), overrides))
        for key in [*claimed, *(k for k in before if k not in claimed)]:
            # A key of `overrides` was checked above; RESUMABLE ones keep the run's values.
            skip = key in RESUMABLE or key in overrides
            if not skip and claimed.get(key) != before.get(key):
                why = f" (from --preset {preset}; without it, the saved config continues)"
                _refuse(key, before.get(key), claimed.get(key), why)
    extended = any(k in ("train.epochs", "train.steps") for k in changed)
    if extended:
        _check_extension(old, new)
    if any(k in AFTER_DIVERGENCE for k in changed):
        warn(
            f"continuing a diverged run with optimizer.lr={new.optimizer.lr:g} from its last good "
            "checkpoint: the result is no longer the original run's"
        )
    return new, extended


def _refuse(key: str, before, after, why: str) -> None:
    raise ConfigError(
        f"--resume: {key} would change the run ({before!r} -> {after!r}); "
        f"it cannot change when resuming{why}"
    )


def _warn(message: str) -> None:
    print(f"jaxmnist: warning: {message}", file=sys.stderr, flush=True)


class Resumer:
    """The run loop's `start` for a resumed run (see the module doc)."""

    def __init__(self, run_dir, cfg: config_lib.Config, warn=None):
        self.run_dir, self.cfg, self.warn = Path(run_dir), cfg, warn or _warn
        self.saved_lr = read_config(self.run_dir).optimizer.lr  # before it is rewritten

    def __call__(self, setup) -> tuple[Progress, list]:
        """(where the run continues, one state per chunk) for `setup` (`loop.Setup`)."""

        pop, plan = setup.population, setup.plan
        target = checkpoint.abstract_state(pop.state_shapes(), len(pop), pop.layout.by_member)
        accumulators = jax.eval_shape(lambda: empty_metrics(plan.steps_per_epoch))
        metrics_target = checkpoint.abstract_state(accumulators, len(pop), pop.layout.by_member)
        restored = checkpoint.restore_newest(self.run_dir, target, self.warn, metrics_target)
        if restored is None:  # died before its first checkpoint was complete: start over
            self.warn(f"{self.run_dir} has no complete checkpoint; starting from the beginning")
            restored = checkpoint.Restored(0, 0, None, {"records": [], "train_seconds": 0})
            states = setup.states
        else:
            states = checkpoint.split_members(restored.state, pop)
        epoch_step = restored.progress.get("epoch_step", 0)
        boundary = sum(plan.epoch_steps[: restored.epoch]) + epoch_step
        if (
            restored.step != boundary
            or restored.epoch + (epoch_step > 0) > len(plan.epoch_steps)
            or (epoch_step and epoch_step >= plan.epoch_steps[restored.epoch])
        ):
            raise ConfigError(
                f"--resume: the checkpoint at step {restored.step} does not fall where the new "
                f"plan has it (a partial last epoch cannot be extended)"
            )
        if self.cfg.optimizer.lr != self.saved_lr:
            states = [self._set_lr(s, size, pop) for s, size in zip(states, pop.chunks)]
        metrics = None
        if epoch_step:
            metrics = checkpoint.split_members(restored.metrics, pop)
        records = tuple(restored.progress["records"])
        progress = Progress(
            restored.epoch,
            restored.step,
            records,
            restored.progress["train_seconds"],
            epoch_step=epoch_step,
            metrics=metrics,
            epoch_seconds=restored.progress.get("epoch_seconds", 0.0),
        )
        return progress, states

    def _set_lr(self, state, size: int, pop):
        lr = np.full(size, self.cfg.optimizer.lr, np.float32)
        lr = pop.layout.put(lr, pop.layout.by_member)
        fn = jax.jit(
            lambda s, lr: s._replace(opt_state=optim.set_hyperparams(s.opt_state, lr=lr)),
            out_shardings=pop.layout.by_member,
        )
        return fn(state, lr)


def saved_command(path: str | os.PathLike) -> list[str]:
    """command.txt's arguments (the command the run was last started with); [] if none."""
    try:
        return shlex.split((Path(path) / rundir.COMMAND_FILE).read_text())
    except (OSError, ValueError):
        return []


def nothing_to_resume(path: str | os.PathLike, cfg: config_lib.Config, extended: bool):
    """Why resuming the run at `path` with `cfg` has nothing to do, in words; None when
    it has: the run is unfinished (no summary.json), `cfg` plans a longer run
    (`extended`), or a run its target accuracy stopped early is resumed with a higher
    target or none. A target still reached is said so, and nothing is rewritten."""
    path = Path(path)
    try:
        summary = json.loads((path / rundir.SUMMARY_FILE).read_text())
        lines = (path / rundir.METRICS_FILE).read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError):  # unfinished, or unreadable: the resume itself says
        return None
    target = cfg.train.target_accuracy
    rule = TargetAccuracy(target, np.zeros(cfg.train.seeds, int), cfg.train.target_split)
    if rule.replay(records):  # the rule the run loop applies to a resumed run
        split = "validation" if cfg.train.target_split == "val" else "test"
        return (
            f"the run reached its target {split} accuracy of {target:.2%} at epoch "
            f"{rule.reached[0]['epoch']}; nothing to resume (a higher target, or "
            "train.target_accuracy=none, trains further)"
        )
    stopped_early = summary.get("epochs", 0) < summary.get("epochs_planned", 0)
    if not extended and not (summary.get("target_reached") and stopped_early):
        return "the run already finished; nothing to resume (--epochs N extends it)"
    return None
