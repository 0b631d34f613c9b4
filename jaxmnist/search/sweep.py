"""Hyperparameter sweeps: a grid of configs in as few compiled programs as the shapes allow.

`parse_grid(["optimizer.lr=1e-3,3e-3", "optimizer.weight_decay=0,1e-4"], base)`
reads the swept axes (values separated by commas; for a tuple field such as
`model.hidden`, layer sizes inside one value are joined by `x`: `256x128`).
`expand_grid` makes their cartesian product, each point a full validated
`Config` trained with `train.seeds` seeds. Points whose configs differ only in
values that live in arrays — learning rate, weight decay, momentum, seed
(`population.TRACED_FIELDS`) — form one group and train as one vmapped
population of points × seeds models; a field that changes a shape or the
program (batch size, hidden sizes, optimizer, schedule, ...) starts another
group, and the groups run one after another through the one run loop
(`training.loop.train_population`). A point that diverges is recorded, not fatal.

Points are ranked by validation accuracy when the base config holds out a validation
split (`data.validation`; `jaxmnist sweep` holds out 10,000 by default), so that the
test set, reported beside it, is never used to choose; without one, by test accuracy,
and the table says so (`ranked_by` in sweep.json).

`run_sweep` returns the result as a JSON-ready dict; `write_outputs` writes
sweep.json, sweep.csv, the plot and the HTML page (`jaxmnist.report.sweep_report`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import runtime, stats
from jaxmnist.data import load_dataset
from jaxmnist.errors import ConfigError
from jaxmnist.runs.rundir import atomic_write, write_json
from jaxmnist.training.hooks import Callback, EpochEnd, RunStart
from jaxmnist.training.loop import plural, run_length, train_population
from jaxmnist.training.parallel import layout_for
from jaxmnist.training.population import TRACED_FIELDS, Member

FILES = {"json": "sweep.json", "csv": "sweep.csv", "png": "sweep.png", "html": "sweep.html"}
SPLIT_NAMES = {"val": "validation", "test": "test"}
# `jaxmnist sweep` holds out this many training examples as the validation split it ranks
# by, unless data.validation is given; a sixth of a smaller training set (MNIST's 60,000
# give exactly 10,000).
DEFAULT_VALIDATION = 10_000


def default_validation(num_train_examples: int) -> int:
    """The validation examples a sweep holds out by default from a training set this big."""
    return min(DEFAULT_VALIDATION, num_train_examples // 6)


def ranking_metric(cfg: config_lib.Config) -> str:
    """What a sweep of `cfg` ranks its points by: `val_accuracy` with a validation split
    (`data.validation`), else `test_accuracy`."""
    return "val_accuracy" if cfg.data.validation else "test_accuracy"


def metric_name(metric: str) -> str:
    """`val_accuracy` -> `validation accuracy`."""
    split, _, what = metric.partition("_")
    return f"{SPLIT_NAMES.get(split, split)} {what}"


def ranking_note(sweep: dict) -> str:
    """One line on what chose the ranking: the validation split, or (without one) the test
    set, which then biases the best point's figures upwards."""
    if sweep.get("ranked_by", "test_accuracy") == "val_accuracy":
        n = sweep.get("config", {}).get("data", {}).get("validation")
        held = f"{n:,} training examples held out, never trained on" if n else "held out"
        return (
            f"ranked by validation accuracy ({held}); the test set is reported beside it "
            "and was not used to choose"
        )
    return (
        "ranked by test accuracy: no validation split (data.validation=0), so the best "
        "point's test figures are biased upwards by choosing on them"
    )


class Axis(NamedTuple):
    key: str  # dotted config field, e.g. "optimizer.lr"
    values: tuple  # typed values, in the order given


def get_field(cfg: config_lib.Config, key: str):
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def format_value(value) -> str:
    """A grid value as written on the command line: 0.003, 256x128, true."""
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_grid(specs: list[str], base: config_lib.Config, given=()) -> list[Axis]:
    """Typed axes from `section.field=v1,v2,...` strings; ConfigError (one line) if malformed.

    `given`: the fields the command line set besides the grid. The duration follows
    train's rule (`config.apply_overrides`): steps win over epochs, so a grid over
    `train.epochs` with `train.steps` given (or swept) would train every point alike and
    is refused; without it, the grid's epochs replace a preset's steps (`run_sweep`)."""
    if not specs:
        raise ConfigError("a sweep needs at least one --grid section.field=v1,v2,...")
    axes, known = [], config_lib.field_names(base)
    for spec in specs:
        key, sep, text = (part.strip() for part in spec.partition("="))
        if not sep or not key or not text:
            raise ConfigError(f"--grid {spec!r} is not of the form section.field=v1,v2,...")
        if key not in known:
            raise ConfigError(
                f"unknown config field {key!r} in --grid; known fields: {', '.join(known)}"
            )
        if key == "train.seeds":
            raise ConfigError(
                "--grid train.seeds: give the number of seeds of every point with --seeds N"
            )
        if key == "data.validation":
            raise ConfigError(
                "--grid data.validation: points are ranked on one validation split; give it "
                "once with data.validation=N"
            )
        if any(a.key == key for a in axes):
            raise ConfigError(f"--grid {key} given twice; list all its values in one --grid")
        steps_given = "train.steps" in given or any(
            s.partition("=")[0].strip() == "train.steps" for s in specs
        )
        if key == "train.epochs" and steps_given:
            raise ConfigError(
                "--grid train.epochs: train.steps is given too (--steps, or a grid over it), "
                "and steps win over epochs, so every point would train the same steps; drop "
                "one of them"
            )
        raw = [v.strip() for v in text.split(",")]
        if "" in raw:
            raise ConfigError(f"--grid {spec!r}: an empty value (values are separated by commas)")
        if isinstance(get_field(base, key), tuple):
            raw = [v.replace("x", ",") for v in raw]  # model.hidden=256x128,512
        values = tuple(get_field(config_lib.apply_overrides(base, {key: v}), key) for v in raw)
        if len(set(values)) < len(values):
            raise ConfigError(f"--grid {key}: a value is repeated ({text})")
        axes.append(Axis(key, values))
    return axes


@dataclasses.dataclass(frozen=True)
class Point:
    index: int
    values: dict  # axis key -> value
    cfg: config_lib.Config

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={format_value(v)}" for k, v in self.values.items())


def expand_grid(base: config_lib.Config, axes: list[Axis]) -> list[Point]:
    """The cartesian product of `axes` over `base`, every point validated."""
    points = []
    for i, combo in enumerate(itertools.product(*(a.values for a in axes))):
        values = dict(zip((a.key for a in axes), combo))
        cfg = config_lib.apply_overrides(base, values)
        point = Point(i, values, cfg)
        try:
            config_lib.validate(cfg)
        except ConfigError as e:
            raise ConfigError(f"grid point {point.label}: {e}") from None
        points.append(point)
    return points


def program_key(cfg: config_lib.Config) -> config_lib.Config:
    """`cfg` with the traced fields blanked: equal keys can share one compiled program."""
    return config_lib.apply_overrides(
        cfg, {k: 0 if k == "train.seed" else 1.0 for k in TRACED_FIELDS}
    )


def group_points(points: list[Point]) -> list[list[Point]]:
    """Points that can share a program, in order of first appearance."""
    groups: dict = {}
    for p in points:
        groups.setdefault(program_key(p.cfg), []).append(p)
    return list(groups.values())


class SweepReporter(Callback):
    """Progress of one group as short lines through `log`."""

    def __init__(
        self,
        log: Callable[[str], None],
        title: str,
        point_of: np.ndarray,
        num_points: int,
        metric: str = "test_accuracy",
    ):
        self.log, self.title, self.point_of, self.num_points = log, title, point_of, num_points
        self.metric = metric  # what the sweep ranks by

    def on_start(self, start: RunStart) -> None:
        info = start.info
        chunks = info.get("chunks", [1])
        split = f", in {len(chunks)} chunks of {max(chunks)}" if len(chunks) > 1 else ""
        self.log(
            f"{self.title}: {plural(info.get('models', 1), 'model')} in one program{split}; "
            f"{run_length(info)}"
        )

    def on_compiled(self, seconds: float) -> None:
        self.log(f"  compiled in {seconds:.2f} s")

    def on_epoch_end(self, end: EpochEnd) -> None:
        r = end.record
        acc = _per_member(r, self.metric)
        best = max(acc[self.point_of == p].mean() for p in range(self.num_points))
        self.log(
            f"  epoch {r['epoch']}: best point mean {metric_name(self.metric)} {best:.2%} "
            f"({r['epoch_seconds']:.2f} s)"
        )


def _finite(x):
    return None if x is None or not math.isfinite(x) else x


def _per_member(record: dict, key: str) -> np.ndarray:
    """(members,): one metrics.jsonl record's `key` (e.g. `val_accuracy`) of each member."""
    return np.asarray(record.get(f"{key}_per_seed", [record[key]]), np.float64)


def _point_result(
    point: Point, group: int, seeds: list[int], test, idx, records, reached, diverged, compile_s
) -> dict:
    acc, loss = test.accuracy[idx], test.loss[idx]
    spread = stats.spread(acc)
    history = [float(np.mean(_per_member(r, "test_accuracy")[idx])) for r in records]
    val = {}
    if "val_accuracy" in records[-1]:  # the validation split after the last epoch
        val_acc = _per_member(records[-1], "val_accuracy")[idx]
        val_loss = _per_member(records[-1], "val_loss")[idx]
        val = {
            **stats.spread(val_acc).to_json("val_accuracy"),
            "val_accuracy_per_seed": val_acc.tolist(),
            "val_loss_mean": _finite(float(val_loss.mean())),
            "val_loss_per_seed": [_finite(x) for x in val_loss.tolist()],
            "val_accuracy_by_epoch": [
                float(np.mean(_per_member(r, "val_accuracy")[idx])) for r in records
            ],
        }
    return {
        "point": point.index,
        "values": {k: list(v) if isinstance(v, tuple) else v for k, v in point.values.items()},
        "label": point.label,
        "group": group,
        "seeds": seeds,
        **spread.to_json("test_accuracy"),
        "test_accuracy_per_seed": acc.tolist(),
        "test_loss_mean": _finite(float(loss.mean())),
        "test_loss_per_seed": [_finite(x) for x in loss.tolist()],
        "diverged_seeds": [seeds[i] for i in diverged],
        "test_accuracy_by_epoch": history,
        **val,
        "epochs_to_target": reached and reached["epoch"],
        "time_to_target_seconds": reached and reached["train_seconds"],
        "time_to_target_with_compile_seconds": reached and reached["train_seconds"] + compile_s,
    }


def run_sweep(
    base: config_lib.Config,
    axes: list[Axis],
    *,
    dataset=None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Trains every grid point with `base.train.seeds` seeds; returns the sweep as a dict.

    `dataset` (a `jaxmnist.data.Dataset`) is used for every point, for tests;
    otherwise each point's `data` section says what to load.
    """
    wall_start = time.perf_counter()
    log = log or (lambda line: None)
    metric = ranking_metric(base)
    if any(a.key == "train.epochs" for a in axes):
        # The grid's epochs replace a preset's steps, as train's --epochs does; sweep.json's
        # config then says what every point ran: epochs, not the preset's steps.
        base = config_lib.apply_overrides(base, {"train.epochs": base.train.epochs})
    if base.compile_cache:
        runtime.enable_compilation_cache()
    points = expand_grid(base, axes)
    groups = group_points(points)
    seeds_per_point = base.train.seeds
    datasets: dict = {}
    results, group_info = [], []
    for g, group in enumerate(groups):
        cfg = group[0].cfg
        d = cfg.data
        if dataset is None and (d.dataset, d.data_dir) not in datasets:
            datasets[d.dataset, d.data_dir] = load_dataset(
                d.dataset, d.data_dir, download=d.download
            )
        data = dataset if dataset is not None else datasets[d.dataset, d.data_dir]
        members = [
            Member.of(p.cfg, p.cfg.train.seed + s) for p in group for s in range(seeds_per_point)
        ]
        point_of = np.repeat(np.arange(len(group)), seeds_per_point)
        fixed = {
            a.key: format_value(get_field(cfg, a.key)) for a in axes if a.key not in TRACED_FIELDS
        }
        title = f"program {g + 1}/{len(groups)}" + (
            f" ({', '.join(f'{k}={v}' for k, v in fixed.items())})" if fixed else ""
        )
        reporter = SweepReporter(log, title, point_of, len(group), metric)
        layout = layout_for(cfg.parallel, num_models=len(members), batch_size=cfg.train.batch_size)
        r = train_population(
            cfg, members, data, reporter, points=point_of, stop_on_nonfinite=False, layout=layout
        )
        for p, point in enumerate(group):
            idx = np.flatnonzero(point_of == p)
            seeds = [members[i].seed for i in idx]
            diverged = [j for j, i in enumerate(idx) if i in r.diverged]
            results.append(
                _point_result(
                    point,
                    g,
                    seeds,
                    r.test,
                    idx,
                    r.records,
                    r.reached[p],
                    diverged,
                    r.compile_seconds,
                )
            )
        group_info.append(
            {
                "group": g,
                "fixed": fixed,
                "points": [p.index for p in group],
                "models": len(members),
                "chunks": list(r.population.chunks),
                "epochs": len(r.records),
                "steps": r.steps,
                "compile_seconds": r.compile_seconds,
                "train_seconds": r.train_seconds,
                "eval_seconds": r.eval_seconds,
            }
        )
    rank_points(results, metric)
    return {
        "axes": {a.key: [list(v) if isinstance(v, tuple) else v for v in a.values] for a in axes},
        "seeds_per_point": seeds_per_point,
        "first_seed": base.train.seed,
        "target_accuracy": base.train.target_accuracy,
        "target_split": base.train.target_split,
        "ranked_by": metric,
        "num_points": len(points),
        "num_programs": len(groups),
        "results": results,
        "groups": group_info,
        "config": base.to_dict(),
        "environment": runtime.environment(),
        "wall_seconds": time.perf_counter() - wall_start,
    }


def rank_points(results: list[dict], metric: str) -> None:
    """Sorts point results (as `run_sweep` makes them) best first by the mean of `metric`
    (`val_accuracy` or `test_accuracy`; not finite: last), ties by point, and numbers them
    (`rank`), in place."""
    results.sort(
        key=lambda x: (
            -x[f"{metric}_mean"] if math.isfinite(x[f"{metric}_mean"]) else math.inf,
            x["point"],
        )
    )
    for rank, x in enumerate(results, start=1):
        x["rank"] = rank


def to_csv(sweep: dict) -> str:
    """One row per point, best first: the axes' values, then the accuracy figures."""
    keys = list(sweep["axes"])
    target = sweep["target_accuracy"] is not None
    val = sweep.get("ranked_by") == "val_accuracy"
    val_keys = ["val_accuracy_mean", "val_accuracy_std", "val_accuracy_ci95_low"]
    val_keys += ["val_accuracy_ci95_high", "val_accuracy_min", "val_accuracy_max", "val_loss_mean"]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(
        [
            "rank",
            *keys,
            "group",
            "seeds",
            *val_keys * val,
            "test_accuracy_mean",
            "test_accuracy_std",
            "test_accuracy_ci95_low",
            "test_accuracy_ci95_high",
            "test_accuracy_min",
            "test_accuracy_max",
            "test_loss_mean",
            "diverged_seeds",
            *(["epochs_to_target", "time_to_target_seconds"] * target),
        ]
    )
    for x in sweep["results"]:
        ci = x["test_accuracy_ci95"] or [None, None]
        val_row = []
        if val:
            val_row = [x[k] for k in val_keys[:2]] + (x["val_accuracy_ci95"] or [None, None])
            val_row += [x[k] for k in val_keys[-3:]]
        row = [
            x["rank"],
            *(format_value(tuple(v) if isinstance(v, list) else v) for v in x["values"].values()),
            x["group"],
            len(x["seeds"]),
            *val_row,
            x["test_accuracy_mean"],
            x["test_accuracy_std"],
            *ci,
            x["test_accuracy_min"],
            x["test_accuracy_max"],
            x["test_loss_mean"],
            len(x["diverged_seeds"]),
        ]
        if target:
            row += [x["epochs_to_target"], x["time_to_target_seconds"]]
        w.writerow(["" if v is None else v for v in row])
    return out.getvalue()


def mean_and_std(x: dict, metric: str) -> str:
    """A point's `metric` as `97.12% ± 0.08%` (the std with several seeds)."""
    std = x[f"{metric}_std"]
    return f"{100 * x[f'{metric}_mean']:.2f}%" + (f" ± {100 * std:.2f}%" if std is not None else "")


def format_table(sweep: dict, metric: str | None = None) -> str:
    """The results for a terminal, best first; "≈ best" marks the points whose `metric`
    (the one the results are ranked by: by default sweep's `ranked_by`) is not
    significantly worse than the best's. Ranked by validation accuracy, the test
    accuracy is shown beside it; a last line says which split chose."""
    metric = metric or sweep.get("ranked_by", "test_accuracy")
    keys = list(sweep["axes"])
    target = sweep["target_accuracy"] is not None
    marks = stats.near_best([x[f"{metric}_per_seed"] for x in sweep["results"]])
    tested = any(m in ("yes", "no", stats.CANT_TELL) for m in marks)
    beside = metric != "test_accuracy"
    header = ["rank", *keys, f"{metric_name(metric)} (mean ± std)", "95% CI", "min", "max"]
    header += ["≈ best"] * tested + ["test accuracy (mean ± std)"] * beside
    header += ["epochs to target"] * target
    rows = []
    for x, mark in zip(sweep["results"], marks):
        ci = x[f"{metric}_ci95"]
        row = [
            str(x["rank"]),
            *(format_value(tuple(v) if isinstance(v, list) else v) for v in x["values"].values()),
            mean_and_std(x, metric) + (" (diverged)" * bool(x["diverged_seeds"])),
            f"{100 * ci[0]:.2f}–{100 * ci[1]:.2f}%" if ci else "—",
            f"{100 * x[f'{metric}_min']:.2f}%",
            f"{100 * x[f'{metric}_max']:.2f}%",
        ]
        row += [mark] * tested + [mean_and_std(x, "test_accuracy")] * beside
        if target:
            row.append(str(x["epochs_to_target"]) if x["epochs_to_target"] else "not reached")
        rows.append(row)
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(stats.near_best_legend(marks))
    lines.append(ranking_note({**sweep, "ranked_by": metric}))
    n = sweep["seeds_per_point"]
    lines.append(
        f"{sweep['num_points']} points x {n} seed{'s' * (n != 1)} in {sweep['num_programs']} "
        f"program{'s' * (sweep['num_programs'] != 1)}, {sweep['wall_seconds']:.1f} s"
    )
    return "\n".join(lines)


def write_outputs(sweep: dict, out_dir: Path, command: str | None = None) -> dict[str, Path]:
    """sweep.json, sweep.csv, sweep.png and sweep.html in `out_dir`; returns their paths."""
    from jaxmnist.report.sweep_report import write_sweep_page  # start-up: matplotlib

    paths = {k: Path(out_dir) / name for k, name in FILES.items()}
    sweep = {**sweep, "command": command}
    write_json(paths["json"], sweep)
    atomic_write(paths["csv"], to_csv(sweep).encode())
    write_sweep_page(sweep, paths["html"], paths["png"])
    return paths
