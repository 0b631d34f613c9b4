"""One page comparing runs: curves overlaid, summaries side by side, differences highlighted.

`write_comparison(run_dirs, out)` reads each run's summary, metrics and confusion
matrix (not its predictions, so any finished run can be compared), and writes a
self-contained page: the headline numbers with the best run's value in bold, the
config fields that differ, training and test curves of every run on shared axes,
the full summaries side by side with every row that differs highlighted, and
per-class accuracy per run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from jaxmnist.errors import ConfigError, WriteError
from jaxmnist.report import html, plots
from jaxmnist.report.describe import DASH, flatten, pct, summary_rows
from jaxmnist.report.rundata import RunData, load_run
from jaxmnist.runs import rundir

# Summary rows a comparison ranks, and which way is better.
HIGHER_IS_BETTER = {
    "Test accuracy": True,
    "Train accuracy": True,
    "Examples/s": True,
    "Test loss": False,
    "Train loss": False,
    "Compile time": False,
    "Training time": False,
    "Steady epoch time": False,
    "Evaluation time": False,
    "Wall time": False,
}
HEADLINE = (
    "Test accuracy",
    "Test loss",
    "Train accuracy",
    "Train loss",
    "Parameters",
    "Epochs and steps",
    "Compile time",
    "Training time",
    "Examples/s",
)


def run_labels(runs: list[RunData]) -> list[str]:
    """Short unique labels: the directory names, or fuller paths where names repeat."""
    names = [r.name for r in runs]
    if len(set(names)) == len(names):
        return names
    return [str(r.path) for r in runs]


def _side_by_side(
    labels: list[str],
    table: list[tuple[str, list[str], list[float | None]]],
    rank: dict[str, bool],
    mark_differences: bool = True,
) -> str:
    """Rows of (label, texts per run, numbers per run): differing rows highlighted
    (with `mark_differences`), the best number in a ranked row in bold."""
    rows, differ, best = [], set(), set()
    for i, (label, texts, numbers) in enumerate(table):
        rows.append([label, *texts])
        if len(set(texts)) > 1:
            if mark_differences:
                differ.add(i)
            valid = [(x, j) for j, x in enumerate(numbers) if x is not None and np.isfinite(x)]
            if label in rank and len(valid) > 1:
                target = (max if rank[label] else min)(x for x, _ in valid)
                best |= {(i, j + 1) for x, j in valid if x == target}
    return html.html_table(["", *labels], rows, highlight=differ, best=best, kv=True)


def _config_value(flat: dict, key: str) -> str:
    """A config value as config.json and the run report write it (`null`, `true`,
    `[256, 128]`); a dash where the run has no such field."""
    if key not in flat:
        return DASH
    value = flat[key]
    return value if isinstance(value, str) else json.dumps(value)


def _config_diff(runs: list[RunData], labels: list[str]) -> str:
    flat = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat))
    rows = [
        [k, *(_config_value(f, k) for f in flat)]
        for k in keys
        if len({repr(f.get(k, DASH)) for f in flat}) > 1
    ]
    if not rows:
        return "<p>The runs have identical configs.</p>"
    return html.html_table(["config field", *labels], rows, kv=True) + (
        '<p class="note">Only the fields that differ; everything else is the same in every run.</p>'
    )


def _class_accuracy(runs: list[RunData], labels: list[str]) -> str:
    names = runs[0].class_names
    if any(r.class_names != names for r in runs):
        return "<p>The runs have different classes; per-class accuracy is not comparable.</p>"
    accs = [np.diag(r.confusion) / np.maximum(r.confusion.sum(1), 1) for r in runs]
    table = [
        (name, [pct(a[i]) for a in accs], [float(a[i]) for a in accs])
        for i, name in enumerate(names)
    ]
    return _side_by_side(labels, table, {name: True for name in names}, mark_differences=False) + (
        '<p class="note">Bold: the best run for each class.</p>'
    )


def render_comparison(runs: list[RunData]) -> str:
    """The comparison page for `runs` (at least two)."""
    labels = run_labels(runs)
    per_run = [summary_rows(r) for r in runs]
    row_labels = [label for label, _, _ in per_run[0]]
    full = [
        (label, [rows[i][1] for rows in per_run], [rows[i][2] for rows in per_run])
        for i, label in enumerate(row_labels)
    ]
    headline = [row for row in full if row[0] in HEADLINE]
    curves = plots.compare_curves(
        [
            (plots.drawable(label), r.records, r.steps, r.step_losses)
            for label, r in zip(labels, runs)
        ]
    )
    alts = {
        "train_loss": "Training loss of every run against step, overlaid",
        "test_loss": "Test loss of every run after each epoch, overlaid",
        "test_accuracy": "Test accuracy of every run after each epoch, overlaid",
    }
    legend = html.html_table(
        ["Run", "Directory", "Command"],
        [[label, str(r.path.resolve()), r.command or DASH] for label, r in zip(labels, runs)],
    )
    sections = [
        ("Runs", legend),
        (
            "Headline",
            _side_by_side(labels, headline, HIGHER_IS_BETTER)
            + '<p class="note">Highlighted: rows where the runs differ; bold: the best value.</p>',
        ),
        ("Config differences", _config_diff(runs, labels)),
        (
            "Curves",
            html.figure_grid(
                html.figure(plots.to_png(fig), alts[name]) for name, fig in curves.items()
            )
            + '<p class="note">Training loss is a moving average of each step\'s batch loss.</p>',
        ),
        ("Full summaries", _side_by_side(labels, full, HIGHER_IS_BETTER)),
        ("Per-class accuracy", _class_accuracy(runs, labels)),
    ]
    best = max(range(len(runs)), key=lambda i: runs[i].summary.get("test_accuracy", 0))
    subtitle = (
        f"{len(runs)} runs · best test accuracy {pct(runs[best].summary.get('test_accuracy'))} "
        f"({labels[best]})"
    )
    return html.render_page("jaxmnist run comparison", sections, subtitle)


def write_comparison(run_dirs: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Writes the comparison page of `run_dirs` to `out`; returns its path.

    Raises ConfigError for fewer than two runs, JaxmnistError for a bad run directory,
    WriteError if the page cannot be written.
    """
    if len(run_dirs) < 2:
        raise ConfigError("compare needs at least two run directories")
    runs = [load_run(d, predictions=False) for d in run_dirs]
    path = Path(out)
    if path.is_dir():
        raise ConfigError(
            f"{path}: is a directory; give a file name such as {path / 'comparison.html'}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError.from_os_error(e, path) from None
    rundir.atomic_write(path, render_comparison(runs).encode("utf-8"))
    return path
