"""What a search leaves: search.json, search.csv, search.html, the table and the best trial's
`jaxmnist train` command.

`summarize(study, ...)` reads every trial back from the study's storage (whichever
worker ran it) into one JSON-ready dict: finished trials ranked by validation
accuracy (the objective), pruned and failed ones after them, the best trial with its
test accuracy beside it (reported, never chosen by) and the command that trains its
config again. "≈ best" marks the trials whose seeds cannot tell them from the best
(`stats.near_best`, Welch's test on the per-seed validation accuracies).
"""

from __future__ import annotations

import csv
import io
import math
import shlex
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from jaxmnist import config as config_lib
from jaxmnist import runtime, stats
from jaxmnist.report.describe import flatten
from jaxmnist.runs.rundir import atomic_write, write_json
from jaxmnist.search.space import Param, trial_config
from jaxmnist.search.study import OVER_BUDGET, StudyOptions, counts_text, safe_url
from jaxmnist.search.sweep import get_field

FILES = {"json": "search.json", "csv": "search.csv", "html": "search.html"}
_ORDER = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1, TrialState.RUNNING: 2}


def _override_text(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    return repr(value) if isinstance(value, float) else str(value)


def train_command(cfg: config_lib.Config, preset: str) -> str:
    """`jaxmnist train --preset P KEY=VALUE ...`: every field where `cfg` differs from
    the preset, floats written exactly, so the command trains `cfg` itself."""
    mine, theirs = flatten(cfg.to_dict()), flatten(config_lib.get_preset(preset).to_dict())
    if mine.get("model.name") != theirs.get("model.name"):
        theirs = {}  # another family: its every field is needed
    overrides = [
        f"{key}={_override_text(get_field(cfg, key))}"
        for key, value in mine.items()
        if theirs.get(key, object()) != value
    ]
    return shlex.join(["jaxmnist", "train", "--preset", preset, *sorted(overrides)])


def _trial_row(t: optuna.trial.FrozenTrial, params: list[Param]) -> dict:
    a = t.user_attrs
    val = a.get("val_accuracy_per_seed") or []
    test = a.get("test_accuracy_per_seed") or []
    spread = stats.spread(val) if val else None
    return {
        "number": t.number,
        "state": t.state.name,
        "values": {p.key: t.params.get(p.key) for p in params},
        "value": t.value,
        "val_accuracy_mean": float(sum(val) / len(val)) if val else None,
        "val_accuracy_std": spread.std if spread else None,
        "val_accuracy_per_seed": val,
        "test_accuracy_mean": a.get("test_accuracy_mean"),
        "test_accuracy_per_seed": test,
        "val_accuracy_by_epoch": [t.intermediate_values[e] for e in sorted(t.intermediate_values)],
        "epochs": a.get("epochs"),
        "seeds": a.get("seeds"),
        "diverged_seeds": a.get("diverged_seeds") or [],
        "batch": a.get("batch"),
        "worker": a.get("worker"),
        "program": a.get("program"),
        "retry_of": t.system_attrs.get("failed_trial"),
        "over_budget": bool(a.get(OVER_BUDGET)),
        "error": a.get("error"),
        "started": t.datetime_start.isoformat() if t.datetime_start else None,
        "finished": t.datetime_complete.isoformat() if t.datetime_complete else None,
        "duration_seconds": t.duration.total_seconds() if t.duration else None,
    }


def importances(study: optuna.Study) -> dict[str, float] | None:
    """Optuna's parameter importances (PED-ANOVA) over the finished trials; None when
    there are too few to say."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if len(complete) < 3 or len({t.value for t in complete}) < 2:
        return None
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except (ValueError, RuntimeError):  # e.g. a parameter with a single value drawn
        return None


def summarize(
    study: optuna.Study,
    params: list[Param],
    base: config_lib.Config,
    opts: StudyOptions,
    *,
    preset: str,
    wall_seconds: float,
) -> dict:
    """The whole study as a JSON-ready dict (see the module doc)."""
    trials = sorted(
        study.get_trials(deepcopy=False),
        key=lambda t: (_ORDER.get(t.state, 3), -(t.value if t.value is not None else -1), t.number),
    )
    rows = [_trial_row(t, params) for t in trials]
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    for rank, r in enumerate(complete, start=1):
        r["rank"] = rank
    marks = (
        stats.near_best([r["val_accuracy_per_seed"] for r in complete], best=0) if complete else []
    )
    for r, mark in zip(complete, marks):
        r["near_best"] = mark
    best = None
    if complete:
        b = study.best_trial
        cfg = trial_config(base, b.params)
        best = {
            **next(r for r in rows if r["number"] == b.number),
            "command": train_command(cfg, preset),
        }
    counts = {s.name: sum(r["state"] == s.name for r in rows) for s in TrialState}
    # A trial asked past the budget never ran: told FAIL to leave the budget, not a failure.
    counts["OVER_BUDGET"] = sum(r["over_budget"] for r in rows)
    counts["FAIL"] -= counts["OVER_BUDGET"]
    return {
        "study": opts.name,
        "storage": safe_url(opts.storage),
        "sampler": opts.sampler,
        "sampler_seed": opts.seed,
        "pruner": opts.pruner,
        "params": [p.spec for p in params],
        "trials_asked": opts.trials,
        "seeds_per_trial": base.train.seeds,
        "validation_examples": base.data.validation,
        "objective": "mean over seeds of the last epoch's validation accuracy",
        "counts": counts,
        "near_best_legend": stats.near_best_legend(marks, "trial") if marks else None,
        "best": best,
        "importances": importances(study),
        "trials": rows,
        "preset": preset,
        "config": base.to_dict(),
        "environment": runtime.environment(),
        "wall_seconds": wall_seconds,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _pct(x) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.2f}%"


def format_table(result: dict, limit: int = 15) -> str:
    """The best finished trials for a terminal, then the counts and the best's command."""
    keys = result["params"] and [s.partition("=")[0] for s in result["params"]]
    header = ["rank", "trial", *keys, "val accuracy (mean ± std)", "≈ best", "test accuracy"]
    rows = []
    for r in [r for r in result["trials"] if r["state"] == "COMPLETE"][:limit]:
        std = f" ± {100 * r['val_accuracy_std']:.2f}%" if r["val_accuracy_std"] is not None else ""
        rows.append(
            [
                str(r["rank"]),
                str(r["number"]),
                *(str(v) if not isinstance(v, float) else f"{v:.4g}" for v in r["values"].values()),
                _pct(r["val_accuracy_mean"]) + std,
                r["near_best"],
                _pct(r["test_accuracy_mean"]),
            ]
        )
    widths = [max(len(h), *(len(row[j]) for row in rows)) for j, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    if result["near_best_legend"]:
        lines.append(result["near_best_legend"])
    lines.append(
        f"{counts_text(result['counts'])} in study {result['study']!r}, "
        f"{result['wall_seconds']:.1f} s"
    )
    if result["best"]:
        b = result["best"]
        lines.append(
            f"best: trial {b['number']}, validation {_pct(b['val_accuracy_mean'])}, "
            f"test {_pct(b['test_accuracy_mean'])} (reported, not chosen by)"
        )
        lines.append(f"train it again: {b['command']}")
    return "\n".join(lines)


def to_csv(result: dict) -> str:
    """One row per trial: finished ones best first, then pruned, then the rest."""
    keys = [s.partition("=")[0] for s in result["params"]]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(
        [
            "rank",
            "trial",
            "state",
            *keys,
            "val_accuracy_mean",
            "val_accuracy_std",
            "test_accuracy_mean",
            "near_best",
            "epochs",
            "batch",
            "retry_of",
            "duration_seconds",
        ]
    )
    for r in result["trials"]:
        w.writerow(
            [
                "" if v is None else v
                for v in (
                    r.get("rank"),
                    r["number"],
                    r["state"],
                    *r["values"].values(),
                    r["val_accuracy_mean"],
                    r["val_accuracy_std"],
                    r["test_accuracy_mean"],
                    r.get("near_best"),
                    r["epochs"],
                    r["batch"],
                    r["retry_of"],
                    r["duration_seconds"],
                )
            ]
        )
    return out.getvalue()


def write_outputs(result: dict, out_dir: Path, command: str | None = None) -> dict[str, Path]:
    """search.json, search.csv and search.html in `out_dir`; returns their paths."""
    from jaxmnist.search.page import write_search_page  # start-up: matplotlib

    paths = {k: Path(out_dir) / name for k, name in FILES.items()}
    result = {**result, "command": command}
    write_json(paths["json"], result)
    atomic_write(paths["csv"], to_csv(result).encode())
    write_search_page(result, paths["html"])
    return paths
