"""The search space: `--param` strings, their Optuna distributions, a trial's config.

A parameter is a config field and how to draw it:

    optimizer.lr=log:1e-4:1e-1            log-uniform between the two ends
    optimizer.momentum=uniform:0.8:0.99   uniform between them
    train.batch_size=uniform:32:256:32    an int field: integers, here in steps of 32
    model.hidden=choice:128x64,256x128    one of the values, as `--grid` writes them

The field's type says whether a range draws floats or integers. Every end and every
choice is typed and checked against the base config (`config.validate`) before the
study opens, so a bad value is one line, not a failed trial. Optuna stores each
parameter under its dotted name (what `optuna-dashboard` shows); a choice is stored as
the text written on the command line (`128x64`), which Optuna's storage can hold.
"""

from __future__ import annotations

import dataclasses
import math

import optuna

from jaxmnist import config as config_lib
from jaxmnist.errors import ConfigError
from jaxmnist.search.sweep import format_value, get_field

KINDS = ("log", "uniform", "choice")
# Fields a trial may not draw: each has its own flag, or it would make trials unequal.
OWN_FLAG = {
    "train.seed": "a trial's seeds are --seed ... --seed + --seeds - 1",
    "train.seeds": "give the seeds of every trial with --seeds N",
    "train.epochs": "every trial trains --epochs epochs (pruning ends the poor ones early)",
    "train.steps": "every trial trains --epochs epochs (pruning ends the poor ones early)",
    "train.target_accuracy": "a search ranks by validation accuracy, never by the test set",
    "data.validation": "give the held-out examples with --validation N",
    "data.dataset": "a search compares trials on one dataset (--dataset)",
    "train.target_split": "a search ranks by validation accuracy, never by the test set",
}
# Fields that do not change what a trial learns: drawn, they would give trials that differ
# in nothing a search measures.
NO_EFFECT = {
    "data.data_dir": "where the data is read from",
    "data.download": "whether missing data may be downloaded",
    "train.eval_batch_size": "the evaluation's batch (every example counts either way)",
    "train.eval_train": "whether the training set is evaluated too",
    "train.eval_train_examples": "how much of the training set is evaluated",
    "train.progress_every": "how often progress is shown",
    "compile_cache": "whether compiled programs are cached",
    "tensorboard": "whether TensorBoard files are written",
    "memory_budget_mb": "how members are cut into chunks",
    "parallel.devices": "the devices a trial runs on (every batch of trials shares one mesh)",
    "parallel.mesh": "the devices a trial runs on (every batch of trials shares one mesh)",
}


@dataclasses.dataclass(frozen=True)
class Param:
    key: str  # dotted config field
    kind: str  # log, uniform or choice
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    choices: tuple[str, ...] = ()  # choice: the values as written (format_value)
    integer: bool = False  # a range over an int field

    @property
    def spec(self) -> str:
        """The parameter as written on the command line (canonical)."""
        if self.kind == "choice":
            return f"{self.key}=choice:{','.join(self.choices)}"
        ends = [format_value(self.low), format_value(self.high)]
        return f"{self.key}={self.kind}:{':'.join(ends)}" + (
            f":{format_value(self.step)}" if self.step is not None else ""
        )

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.kind == "choice":
            return optuna.distributions.CategoricalDistribution(self.choices)
        if self.integer:
            return optuna.distributions.IntDistribution(
                self.low, self.high, log=self.kind == "log", step=self.step or 1
            )
        return optuna.distributions.FloatDistribution(
            self.low, self.high, log=self.kind == "log", step=self.step
        )

    def grid_values(self) -> list | None:
        """Every value of a finite parameter (a choice, an int range); None: a continuum."""
        if self.kind == "choice":
            return list(self.choices)
        if self.integer:
            return list(range(self.low, self.high + 1, self.step or 1))
        return None


def _typed(base, key: str, text: str, spec: str):
    """`text` as the field's type, the base config with it validated; ConfigError names
    the --param."""
    try:
        cfg = config_lib.apply_overrides(base, {key: text})
        config_lib.validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"--param {spec!r}: {e}") from None
    return get_field(cfg, key)


def check_rankable(cfg: config_lib.Config) -> None:
    """A search ranks, prunes and stops its trials on the validation split alone: one
    line for a config that would have none, or would let the test set stop its trials."""
    if not cfg.data.validation:
        raise ConfigError(
            "a search ranks its trials on a validation split: --validation must be at least 1 "
            "(data.validation too)"
        )
    t = cfg.train
    if t.target_accuracy is not None and t.target_split == "test":
        raise ConfigError(
            "a search never lets the test set decide: a target accuracy on it would stop "
            "trials on test accuracy; give --target-split val (the validation split)"
        )


def parse_param(spec: str, base: config_lib.Config) -> Param:
    """One `KEY=KIND:...` string (see the module doc); ConfigError (one line) if malformed."""
    key, sep, text = (part.strip() for part in spec.partition("="))
    kind, colon, rest = text.partition(":")
    if not sep or not key or not colon or kind not in KINDS or not rest.strip():
        raise ConfigError(
            f"--param {spec!r} is not KEY=log:LOW:HIGH, KEY=uniform:LOW:HIGH[:STEP] or "
            "KEY=choice:A,B,..."
        )
    known = config_lib.field_names(base)
    if key not in known:
        raise ConfigError(
            f"unknown config field {key!r} in --param; known fields: {', '.join(known)}"
        )
    if key in OWN_FLAG:
        raise ConfigError(f"--param {key}: {OWN_FLAG[key]}")
    if key in NO_EFFECT:
        raise ConfigError(
            f"--param {key} changes only {NO_EFFECT[key]}, not what a trial learns: every "
            "trial would be the same; set it with KEY=VALUE instead"
        )
    current = get_field(base, key)
    if kind == "choice":
        raw = [v.strip() for v in rest.split(",")]
        if "" in raw:
            raise ConfigError(
                f"--param {spec!r}: an empty choice (choices are separated by commas)"
            )
        if isinstance(current, tuple):  # model.hidden=choice:256x128,512
            bad = [v for v in raw if "" in v.split("x")]
            if bad:
                raise ConfigError(
                    f"--param {spec!r}: {bad[0]!r} has an empty size; write sizes joined by "
                    "x, e.g. 256x128"
                )
            raw = [v.replace("x", ",") for v in raw]
        values = [format_value(_typed(base, key, v, spec)) for v in raw]
        if len(set(values)) < len(values):
            raise ConfigError(f"--param {key}: a choice is repeated ({rest})")
        if len(values) == 1:
            raise ConfigError(
                f"--param {spec!r}: one choice searches nothing; give two or more, or set "
                f"{key}={values[0]} instead"
            )
        return Param(key, kind, choices=tuple(values))
    if isinstance(current, bool) or not isinstance(current, (int, float)):
        raise ConfigError(
            f"--param {spec!r}: {key} is not a number; give its values with choice:A,B,..."
        )
    parts = [p.strip() for p in rest.split(":")]
    if len(parts) not in (2, 3):
        raise ConfigError(f"--param {spec!r}: a range is {kind}:LOW:HIGH[:STEP]")
    low, high, *step = (_typed(base, key, p, spec) for p in parts)
    if not low < high:
        raise ConfigError(f"--param {spec!r}: LOW must be below HIGH")
    if kind == "log" and (low <= 0 or step):
        raise ConfigError(f"--param {spec!r}: a log range needs LOW > 0 and takes no STEP")
    step = step[0] if step else None
    if step is not None and not 0 < step <= high - low:
        raise ConfigError(f"--param {spec!r}: STEP must be above 0 and at most HIGH - LOW")
    if not all(map(math.isfinite, (low, high))):
        raise ConfigError(f"--param {spec!r}: the ends must be finite numbers")
    return Param(key, kind, low, high, step, integer=isinstance(current, int))


def parse_params(specs: list[str], base: config_lib.Config) -> list[Param]:
    """The typed parameters of `--param` strings; ConfigError (one line) if malformed."""
    if not specs:
        raise ConfigError(
            "a search needs at least one --param, e.g. --param optimizer.lr=log:1e-4:1e-1"
        )
    params = [parse_param(s, base) for s in specs]
    keys = [p.key for p in params]
    for key in keys:
        if keys.count(key) > 1:
            raise ConfigError(f"--param {key} given twice; give it once")
    return params


def grid_space(params: list[Param]) -> dict[str, list]:
    """Optuna's GridSampler space; ConfigError when a parameter is a continuum."""
    space = {}
    for p in params:
        values = p.grid_values()
        if values is None:
            raise ConfigError(
                f"--sampler grid: {p.spec} is a continuous range with no grid; give its "
                f"values as {p.key}=choice:A,B,..."
            )
        space[p.key] = values
    return space


def suggest(trial: optuna.Trial, params: list[Param]) -> dict[str, object]:
    """The trial's values, drawn by the study's sampler (param key -> value as Optuna
    stores it: a number, or a choice's text)."""
    values = {}
    for p in params:
        if p.kind == "choice":
            values[p.key] = trial.suggest_categorical(p.key, p.choices)
        elif p.integer:
            log = p.kind == "log"
            values[p.key] = trial.suggest_int(p.key, p.low, p.high, step=p.step or 1, log=log)
        else:
            log = p.kind == "log"
            values[p.key] = trial.suggest_float(p.key, p.low, p.high, step=p.step, log=log)
    return values


def trial_config(base: config_lib.Config, values: dict[str, object]) -> config_lib.Config:
    """`base` with a trial's values put in (a choice's text parsed as the field's type)."""
    typed = {}
    for key, value in values.items():
        if isinstance(value, str) and isinstance(get_field(base, key), tuple):
            value = value.replace("x", ",")  # model.hidden's "256x128"
        typed[key] = value
    return config_lib.apply_overrides(base, typed)
