"""search.html: a search on one self-contained page, in the other reports' style.

Sections: summary (the best trial, its validation and test accuracy, the command that
trains it again, how the study ran), the optimisation history (every finished trial's
validation accuracy in the order Optuna numbered them, pruned trials at the last value
they reported, and the best so far), the parameter importances (Optuna's, PED-ANOVA),
a parallel-coordinates plot (each finished trial a line across its parameters, coloured
by validation accuracy), the trials table, the base configuration and the environment.
The figures are drawn here with matplotlib's `Figure` (no pyplot, as every report's),
from the study's numbers.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from jaxmnist import pages
from jaxmnist.report import plots
from jaxmnist.report.describe import DASH, flatten, pct, secs
from jaxmnist.runs import rundir
from jaxmnist.search.study import counts_text


def _v(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def history_figure(result: dict) -> Figure:
    done = [r for r in result["trials"] if r["state"] == "COMPLETE"]
    pruned = [r for r in result["trials"] if r["state"] == "PRUNED" and r["val_accuracy_by_epoch"]]
    with plots.style():
        fig = plots.new_figure(6.4, 3.4)
        ax = fig.add_subplot()
        order = sorted(done, key=lambda r: r["number"])
        ax.scatter(
            [r["number"] for r in order],
            [r["value"] for r in order],
            s=18,
            color=plots.TRAIN,
            label="finished",
            zorder=3,
        )
        if pruned:
            ax.scatter(
                [r["number"] for r in pruned],
                [r["val_accuracy_by_epoch"][-1] for r in pruned],
                s=18,
                marker="x",
                color="#999999",
                label="pruned (last report)",
            )
        if order:
            best = np.maximum.accumulate([r["value"] for r in order])
            ax.step(
                [r["number"] for r in order],
                best,
                where="post",
                color=plots.GOOD,
                label="best so far",
            )
        ax.set_xlabel("trial")
        ax.set_ylabel("validation accuracy")
        ax.set_title("Optimisation history")
        ax.legend(loc="best")
    return fig


def importance_figure(importances: dict[str, float]) -> Figure:
    names = list(importances)[::-1]
    with plots.style():
        fig = plots.new_figure(6.4, 0.5 + 0.35 * len(names))
        ax = fig.add_subplot()
        ax.barh(names, [importances[n] for n in names], color=plots.TRAIN)
        ax.set_xlabel("importance (PED-ANOVA, sums to 1)")
        ax.set_title("Parameter importances")
    return fig


def _position(values: list, log: bool) -> tuple[np.ndarray, list[str], list[float]]:
    """Values of one parameter on [0, 1]: (positions, tick labels, tick positions)."""
    if any(isinstance(v, str) for v in values):
        cats = sorted(set(values), key=str)
        where = {c: i / max(len(cats) - 1, 1) for i, c in enumerate(cats)}
        return np.array([where[v] for v in values]), cats, [where[c] for c in cats]
    x = np.log10(values) if log else np.asarray(values, float)
    lo, hi = float(x.min()), float(x.max())
    pos = (x - lo) / (hi - lo) if hi > lo else np.full(len(x), 0.5)
    ends = [min(values), max(values)]
    return pos, [_v(e) for e in ends], [0.0, 1.0] if hi > lo else [0.5, 0.5]


def parallel_figure(result: dict) -> Figure:
    done = [r for r in result["trials"] if r["state"] == "COMPLETE"]
    keys = [s.partition("=")[0] for s in result["params"]]
    logs = ["=log:" in s for s in result["params"]]
    values = np.array([r["value"] for r in done])
    with plots.style():
        # Wide enough for its title and the accuracy's labels with one parameter or two.
        fig = plots.new_figure(max(5.4, 1.6 + 1.6 * len(keys)), 3.6)
        ax = fig.add_subplot()
        lo, hi = values.min(), values.max()
        cmap = colormaps["viridis"]
        columns = [_position([r["values"][k] for r in done], log) for k, log in zip(keys, logs)]
        for i in np.argsort(values):
            shade = (values[i] - lo) / (hi - lo) if hi > lo else 1.0
            ax.plot(
                range(len(keys) + 1),
                [*(c[0][i] for c in columns), shade],
                color=cmap(shade),
                alpha=0.8,
                lw=1.2,
            )
        for j, (_, labels, ticks) in enumerate(columns):
            ax.axvline(j, color="#444444", lw=0.8)
            for label, y in zip(labels, ticks):
                ax.annotate(
                    label,
                    (j, y),
                    xytext=(3, 0),
                    textcoords="offset points",
                    fontsize=7.5,
                    va="center",
                )
        ax.axvline(len(keys), color="#444444", lw=0.8)
        ax.annotate(
            pct(lo), (len(keys), 0), xytext=(3, 0), textcoords="offset points", fontsize=7.5
        )
        ax.annotate(
            pct(hi), (len(keys), 1), xytext=(3, 0), textcoords="offset points", fontsize=7.5
        )
        ax.set_xticks(range(len(keys) + 1), [*keys, "validation accuracy"], fontsize=8)
        ax.set_yticks([])
        ax.grid(False)
        ax.set_title(
            "Parallel coordinates\n(finished trials; log-scaled ranges on a log axis)",
            fontsize=10,
        )
    return fig


def trials_table(result: dict) -> str:
    keys = [s.partition("=")[0] for s in result["params"]]
    header = [
        "Rank",
        "Trial",
        "State",
        *keys,
        "Validation accuracy",
        "≈ best",
        "Test accuracy",
        "Epochs",
        "Batch",
        "Retry of",
    ]
    rows = []
    for r in result["trials"]:
        std = r["val_accuracy_std"]
        val = pct(r["val_accuracy_mean"]) + (f" ± {100 * std:.2f}%" if std is not None else "")
        rows.append(
            [
                r.get("rank", DASH),
                r["number"],
                r["state"].lower(),
                *(_v(v) for v in r["values"].values()),
                val if r["val_accuracy_mean"] is not None else DASH,
                r.get("near_best", DASH),
                pct(r["test_accuracy_mean"]) if r["test_accuracy_mean"] is not None else DASH,
                r["epochs"] or DASH,
                r["batch"] or DASH,
                DASH if r["retry_of"] is None else r["retry_of"],
            ]
        )
    near = {i for i, r in enumerate(result["trials"]) if r.get("near_best") in ("best", "yes")}
    note = (
        "Ranked by validation accuracy (the objective: the mean over a trial's seeds at its "
        "last epoch); test accuracy is shown beside it and was never used to choose. "
        + (result["near_best_legend"] or "")
    )
    return pages.html_table(header, rows, highlight=near) + f'<p class="note">{pages.esc(note)}</p>'


def render_search_page(result: dict, pngs: dict[str, bytes]) -> str:
    best, c = result["best"], result["counts"]
    headline = pages.cards(
        [
            ("Best trial", best["number"] if best else DASH),
            ("Its validation accuracy", pct(best["val_accuracy_mean"]) if best else DASH),
            (
                "Its test accuracy",
                pct(best["test_accuracy_mean"])
                if best and best["test_accuracy_mean"] is not None
                else DASH,
            ),
            ("Trials", counts_text(c)),
            ("Wall time", secs(result["wall_seconds"])),
        ]
    )
    env = result["environment"]
    about = [
        [
            "Best values",
            ", ".join(f"{k}={_v(v)}" for k, v in best["values"].items()) if best else DASH,
        ],
        ["Train it again", best["command"] if best else DASH],
        ["Searched", "; ".join(result["params"])],
        ["Objective", f"{result['objective']} ({result['validation_examples']} held-out examples)"],
        ["Study", f"{result['study']} in {result['storage']}"],
        [
            "Sampler, pruner",
            f"{result['sampler']} (seed {result['sampler_seed']}), {result['pruner']}",
        ],
        ["Seeds per trial", result["seeds_per_trial"]],
        ["Backend", f"{env.get('backend')} ({env.get('device_kind')})"],
        ["Command", result.get("command") or "not recorded (not run from the command line)"],
        ["See it live", f"optuna-dashboard {result['storage']}"],
    ]
    figures = [pages.figure(pngs["history"], "Optimisation history")]
    if "importances" in pngs:
        figures.append(pages.figure(pngs["importances"], "Parameter importances"))
    if "parallel" in pngs:
        figures.append(pages.figure(pngs["parallel"], "Parallel coordinates"))
    sections = [
        ("Summary", headline + pages.html_table(["", ""], about, kv=True)),
        ("Figures", pages.figure_grid(figures)),
        ("Trials", trials_table(result)),
        (
            "Base configuration",
            pages.html_table(
                ["", ""],
                [[k, json.dumps(v)] for k, v in flatten(result["config"]).items()],
                kv=True,
            )
            + '<p class="note">Every trial is this configuration with its drawn values put in.</p>',
        ),
    ]
    subtitle = (
        f"best trial {best['number']}: {pct(best['val_accuracy_mean'])} validation accuracy"
        if best
        else "no trial finished"
    )
    return pages.render_page("jaxmnist search", sections, subtitle)


def write_search_page(result: dict, page: str | os.PathLike) -> Path:
    """Writes search.html (figures embedded); WriteError if it cannot be written."""
    pngs = {"history": plots.to_png(history_figure(result))}
    if result["importances"]:
        pngs["importances"] = plots.to_png(importance_figure(result["importances"]))
    if sum(r["state"] == "COMPLETE" for r in result["trials"]) >= 2 and math.isfinite(
        min((r["value"] for r in result["trials"] if r["state"] == "COMPLETE"), default=math.nan)
    ):
        pngs["parallel"] = plots.to_png(parallel_figure(result))
    rundir.atomic_write(page, render_search_page(result, pngs).encode("utf-8"))
    return Path(page)
