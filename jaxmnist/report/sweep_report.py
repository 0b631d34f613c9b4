"""sweep.html: a sweep's results on one self-contained page, in the run report's style.

Sections: summary (the best point and how the sweep ran), results (every point,
best first, mean ± std with the 95% confidence interval of the mean, range and
per-seed accuracies, and "≈ best": whether a point is not significantly worse than
the best by Welch's test on the seeds, Holm-corrected), the plot
(`spread_plots.sweep_figure`, also saved as sweep.png), the programs (which points
shared one compiled program, with compile and training time), the base configuration,
and the environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from jaxmnist import pages, stats
from jaxmnist.report import plots, spread_plots
from jaxmnist.report.describe import DASH, flatten, pct, secs
from jaxmnist.runs import rundir

NOTE = (
    "Mean ± sample standard deviation over the seeds of each point; the 95% confidence interval "
    "of the mean uses Student's t with n − 1 degrees of freedom."
)


def _value(v) -> str:
    return (
        "x".join(map(str, v))
        if isinstance(v, list)
        else f"{v:g}"
        if isinstance(v, float)
        else str(v)
    )


def _spread(x: dict, metric: str = "test_accuracy") -> str:
    std = x[f"{metric}_std"]
    return pct(x[f"{metric}_mean"]) + (f" ± {100 * std:.2f}%" if std is not None else "")


def ranked_by(sweep: dict) -> str:
    """What the sweep ranked its points by: `val_accuracy` or (older sweeps, or none held
    out) `test_accuracy`."""
    return sweep.get("ranked_by", "test_accuracy")


def ranking_text(sweep: dict) -> str:
    """One sentence on which split chose the ranking."""
    if ranked_by(sweep) == "val_accuracy":
        n = sweep.get("config", {}).get("data", {}).get("validation") or 0
        return (
            f"Ranked by validation accuracy ({n:,} training examples held out, never trained "
            "on); the test accuracy is reported beside it and was not used to choose."
        )
    return (
        "Ranked by test accuracy: there was no validation split (data.validation=0), so the "
        "best point's test figures are biased upwards by choosing on them."
    )


def results_table(sweep: dict, metric: str | None = None) -> str:
    """Every point, best first; "≈ best" marks the points whose `metric` (the one the
    results are ranked by: by default the sweep's `ranked_by`) is not significantly worse
    than the best's. Ranked by validation accuracy, the test accuracy is shown beside."""
    metric = metric or ranked_by(sweep)
    target = sweep["target_accuracy"] is not None
    marks = stats.near_best([x[f"{metric}_per_seed"] for x in sweep["results"]])
    tested = any(m in ("yes", "no", stats.CANT_TELL) for m in marks)
    beside = metric != "test_accuracy"
    name = "Validation accuracy" if metric == "val_accuracy" else "Test accuracy"
    header = ["Rank", *sweep["axes"], name, "95% CI", "Min", "Max", "Per seed"]
    header += ["≈ best"] * tested + ["Test accuracy"] * beside
    header += ["Epochs to target", "Time to target"] * target
    rows = []
    for x, mark in zip(sweep["results"], marks):
        ci = x[f"{metric}_ci95"]
        per_seed = ", ".join(f"{100 * a:.2f}" for a in x[f"{metric}_per_seed"])
        if x["diverged_seeds"]:
            per_seed += f" (diverged: seeds {', '.join(map(str, x['diverged_seeds']))})"
        row = [
            x["rank"],
            *(_value(v) for v in x["values"].values()),
            _spread(x, metric),
            f"{100 * ci[0]:.2f}–{100 * ci[1]:.2f}%" if ci else DASH,
            pct(x[f"{metric}_min"]),
            pct(x[f"{metric}_max"]),
            per_seed,
        ]
        row += [mark] * tested + [_spread(x)] * beside
        if target:
            row += [x["epochs_to_target"] or "not reached", secs(x["time_to_target_seconds"])]
        rows.append(row)
    note = f"{ranking_text(sweep)} {NOTE} {stats.near_best_legend(marks)}."
    near = {i for i, m in enumerate(marks) if m in ("best", "yes")}
    if tested:
        note += (
            " Highlighted: the best point and those the seeds' noise cannot tell from it; add "
            "seeds before trusting the ranking among them."
        )
    return pages.html_table(header, rows, highlight=near) + f'<p class="note">{pages.esc(note)}</p>'


def _chunks_text(chunks: list[int]) -> str:
    """[24] -> "1 of 24 models"; [16, 8] -> "2: 16 + 8 models" (models trained at once)."""
    if len(chunks) == 1:
        return f"1 of {chunks[0]} model{'s' * (chunks[0] != 1)}"
    return f"{len(chunks)}: {' + '.join(map(str, chunks))} models"


def programs_table(sweep: dict) -> str:
    header = [
        "Program",
        "Fixed values",
        "Points",
        "Models",
        "Memory chunks",
        "Epochs",
        "Compile",
        "Training",
        "Evaluation",
    ]
    rows = [
        [
            g["group"] + 1,
            ", ".join(f"{k}={v}" for k, v in g["fixed"].items()) or "(all points)",
            len(g["points"]),
            g["models"],
            _chunks_text(g["chunks"]),
            g["epochs"],
            secs(g["compile_seconds"]),
            secs(g["train_seconds"]),
            secs(g["eval_seconds"]),
        ]
        for g in sweep["groups"]
    ]
    note = (
        "Points that differ only in learning rate, weight decay, momentum or seed share one "
        "compiled program (those values are arrays in it); a value that changes a shape or the "
        "program starts another, and programs run one after another. Memory chunks: how many "
        "times the program ran per epoch, and how many models each time, so that they fit in "
        "memory."
    )
    return pages.html_table(header, rows) + f'<p class="note">{pages.esc(note)}</p>'


def render_sweep_page(sweep: dict, png: bytes) -> str:
    best = sweep["results"][0]
    n = sweep["seeds_per_point"]
    headline = pages.cards(
        [
            (
                "Best point",
                ", ".join(f"{k.rsplit('.', 1)[-1]}={_value(v)}" for k, v in best["values"].items()),
            ),
            *(
                [("Its validation accuracy", _spread(best, "val_accuracy"))]
                if ranked_by(sweep) == "val_accuracy"
                else []
            ),
            ("Its test accuracy", _spread(best)),
            ("Points", f"{sweep['num_points']} × {n} seed{'s' * (n != 1)}"),
            ("Programs", sweep["num_programs"]),
            ("Wall time", secs(sweep["wall_seconds"])),
        ]
    )
    env = sweep["environment"]
    about = [
        [
            "Swept",
            "; ".join(
                f"{k} ∈ {{{', '.join(_value(v) for v in vs)}}}" for k, vs in sweep["axes"].items()
            ),
        ],
        ["Seeds per point", f"{n} (seeds {sweep['first_seed']}…{sweep['first_seed'] + n - 1})"],
        ["Target accuracy", pct(sweep["target_accuracy"]) if sweep["target_accuracy"] else DASH],
        [
            "Backend and device",
            (
                f"{env.get('backend')}: {', '.join(env.get('devices') or [])} "
                f"({env.get('device_kind')})"
            ),
        ],
        ["Host", f"{env.get('cpu_model', DASH)}, {env.get('cpu_count', DASH)} CPUs"],
        [
            "Versions",
            ", ".join(
                f"{k} {env[k]}" for k in ("jaxmnist", "jax", "jaxlib", "optax") if env.get(k)
            ),
        ],
        ["Command", sweep.get("command") or "not recorded (not run from the command line)"],
    ]
    caption = {
        1: "Mean test accuracy against the swept value; bars: 95% CI of the mean; dots: seeds.",
        2: "Mean test accuracy of every pair of values, ± the standard deviation over seeds.",
    }
    sections = [
        ("Summary", headline + pages.html_table(["", ""], about, kv=True)),
        ("Results", results_table(sweep)),
        (
            "Plot",
            pages.figure(
                png,
                "Test accuracy across the sweep",
                caption.get(len(sweep["axes"]), "Every point's mean with its 95% CI, best first."),
            ),
        ),
        ("Programs", programs_table(sweep)),
        (
            "Base configuration",
            pages.html_table(
                ["", ""], [[k, json.dumps(v)] for k, v in flatten(sweep["config"]).items()], kv=True
            )
            + '<p class="note">Every point is this configuration with its swept values put in.</p>',
        ),
    ]
    subtitle = f"best {best['label']}: {_spread(best)} test accuracy over {n} seed{'s' * (n != 1)}"
    return pages.render_page("jaxmnist sweep", sections, subtitle)


def write_sweep_page(sweep: dict, page: str | os.PathLike, png_path: str | os.PathLike) -> Path:
    """Writes the plot to `png_path` and the page to `page`; WriteError if either cannot be
    written."""
    png = plots.to_png(spread_plots.sweep_figure(sweep))
    rundir.atomic_write(png_path, png)
    rundir.atomic_write(page, render_sweep_page(sweep, png).encode("utf-8"))
    return Path(page)
