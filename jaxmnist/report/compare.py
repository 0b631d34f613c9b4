"""One page comparing runs: curves overlaid, summaries side by side, differences highlighted.

`write_comparison(run_dirs, out)` reads each run's summary, metrics and confusion
matrix (not its predictions, so any finished run can be compared), and writes a
self-contained page: the headline numbers with the best run's value in bold, the
config fields that differ, training and test curves of every run on shared axes,
the full summaries side by side with every row that differs highlighted, and
per-class accuracy per run.

Whether a difference in test accuracy is larger than the seeds' noise is said in
words, on the page and in the terminal (`significance_lines`): Welch's t-test on
the runs' per-seed accuracies for every pair (each run against the best one
beyond `ALL_PAIRS_UP_TO` runs), Holm-corrected over the pairs (`jaxmnist.stats`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from jaxmnist import pages, stats
from jaxmnist.errors import ConfigError, WriteError
from jaxmnist.report import plots
from jaxmnist.report.describe import DASH, flatten, pct, summary_rows
from jaxmnist.report.rundata import RunData, load_run
from jaxmnist.runs import rundir

# Summary rows a comparison ranks, and which way is better.
HIGHER_IS_BETTER = {
    "Test accuracy": True,
    "Train accuracy": True,
    "Examples/s": True,
    "Test loss": False,
    "Ensemble test accuracy": True,
    "Ensemble test loss": False,
    "Validation accuracy": True,
    "Validation loss": False,
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
    "Ensemble test accuracy",
    "Validation accuracy",
    "Train accuracy",
    "Train loss",
    "Parameters",
    "Epochs and steps",
    "Compile time",
    "Training time",
    "Examples/s",
)


# Up to this many runs every pair is tested (15 pairs); beyond, each run against the best,
# so that the list stays readable and Holm's correction does not swallow every difference.
ALL_PAIRS_UP_TO = 6


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
    return pages.html_table(["", *labels], rows, highlight=differ, best=best, kv=True)


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
    return pages.html_table(["config field", *labels], rows, kv=True) + (
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


def seed_accuracies(run: RunData) -> list[float]:
    """The run's test accuracy per seed (one value for a one-seed run)."""
    s = run.summary
    return list(s.get("test_accuracy_per_seed") or [s["test_accuracy"]])


def significance(runs: list[RunData]) -> tuple[list[stats.Comparison], str]:
    """Welch's test of the runs' test accuracies, Holm-corrected, and a line saying which
    pairs were tested. Every pair has the higher mean first (a - b >= 0), ties in the
    order given."""
    samples = [seed_accuracies(r) for r in runs]
    means = [float(np.mean(s)) for s in samples]

    def ordered(i: int, j: int) -> tuple[int, int]:
        return (j, i) if means[j] > means[i] else (i, j)

    if len(runs) <= ALL_PAIRS_UP_TO:
        pairs = [ordered(i, j) for i in range(len(runs)) for j in range(i + 1, len(runs))]
        scope = "every pair"
    else:
        best = stats.best_index(samples)
        pairs = [ordered(best, j) for j in range(len(runs)) if j != best]
        scope = f"each run against the best (more than {ALL_PAIRS_UP_TO} runs)"
    found = stats.comparisons(samples, pairs)
    family = found[0].family
    how = "Welch's t-test on the seeds, two-sided, 5%"
    if family > 1:
        how += f", Holm-corrected over the {family} tested pairs"
    return found, f"Test accuracy, {scope} ({how}):"


def significance_lines(runs: list[RunData]) -> list[str]:
    """The terminal's text: each run's accuracy over its seeds, then one line per pair."""
    labels = run_labels(runs)
    width = max(map(len, labels))
    found, head = significance(runs)
    lines = [
        f"{label.ljust(width)}  {stats.format_spread(stats.spread(seed_accuracies(r)))}"
        for label, r in zip(labels, runs)
    ]
    lines += [head] + ["  " + stats.format_comparison(c, labels[c.a], labels[c.b]) for c in found]
    if any(c.test is not None for c in found) and found[0].family > 1:
        lines.append("  (each interval is for its pair alone; the verdicts use Holm's p)")
    return lines


def _significance_table(runs: list[RunData], labels: list[str]) -> str:
    found, head = significance(runs)
    holm = found[0].family > 1
    header = ["Comparison", "Difference", "95% CI", "p", *["Holm-adjusted p"] * holm, "Verdict"]
    rows = []
    for c in found:
        t = c.test
        numbers = [DASH] * (3 + holm)
        if t is not None:
            numbers = [
                f"{100 * t.difference:+.2f} pp".replace("-", "−"),
                DASH
                if t.no_spread
                else f"{100 * t.ci95[0]:+.2f}, {100 * t.ci95[1]:+.2f} pp".replace("-", "−"),
                stats.format_p(t.p),
                *[stats.format_p(c.p_holm)] * holm,
            ]
        rows.append(
            [f"{labels[c.a]} − {labels[c.b]}", *numbers, stats.verdict(c, labels[c.a], labels[c.b])]
        )
    note = (
        f"{head[:-1]}. Each run's test accuracy over its seeds is one sample; the difference is "
        "of the means, in percentage points, with the higher mean first."
    )
    if holm:
        note += (
            " Each interval is for its pair alone; the verdicts use the Holm-adjusted p, which "
            'keeps the chance of any false "significant" among the pairs at 5%.'
        )
    highlight = {i for i, c in enumerate(found) if c.significant}
    return pages.html_table(header, rows, highlight=highlight) + (
        f'<p class="note">{pages.esc(note)} Highlighted: significant differences.</p>'
    )


def _extra_rows(
    runs: list[RunData], prefix: str, title: str, note
) -> list[tuple[str, list[str], list[float | None]]]:
    """`{title} accuracy` and `{title} loss` rows from the summaries' `{prefix}_accuracy`
    and `{prefix}_loss`, the accuracy followed by `note(summary)`; a dash where absent."""
    summaries = [r.summary for r in runs]
    accuracy = [s.get(f"{prefix}_accuracy") for s in summaries]
    loss = [s.get(f"{prefix}_loss") for s in summaries]
    texts = [DASH if a is None else f"{pct(a)} ({note(s)})" for a, s in zip(accuracy, summaries)]
    return [
        (f"{title} accuracy", texts, accuracy),
        (f"{title} loss", [DASH if x is None else f"{x:.4f}" for x in loss], loss),
    ]


def _ensemble_rows(runs: list[RunData]) -> list[tuple[str, list[str], list[float | None]]]:
    """The ensembles' test accuracy and loss, a dash for a run of one model."""
    return _extra_rows(
        runs, "ensemble_test", "Ensemble test", lambda s: f"ensemble of {s.get('ensemble_members')}"
    )


def _val_rows(runs: list[RunData]) -> list[tuple[str, list[str], list[float | None]]]:
    """The validation split's accuracy and loss (data.validation), a dash for a run without."""
    return _extra_rows(
        runs, "val", "Validation", lambda s: f"{s.get('num_val_examples', 0):,} held out"
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
    if any("ensemble_test_accuracy" in r.summary for r in runs):  # runs of several seeds
        after = row_labels.index("Test loss") + 1
        full[after:after] = _ensemble_rows(runs)
    if any("val_accuracy" in r.summary for r in runs):  # runs that held out a validation split
        after = row_labels.index("Test loss") + 1
        full[after:after] = _val_rows(runs)
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
        "val_accuracy": "Validation accuracy of every run after each epoch, overlaid",
    }
    legend = pages.html_table(
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
        ("Significance", _significance_table(runs, labels)),
        ("Config differences", _config_diff(runs, labels)),
        (
            "Curves",
            pages.figure_grid(
                pages.figure(plots.to_png(fig), alts[name]) for name, fig in curves.items()
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
    return pages.render_page("jaxmnist run comparison", sections, subtitle)


def load_runs(run_dirs: list[str | os.PathLike]) -> list[RunData]:
    """The runs to compare; ConfigError for fewer than two or for runs on different
    datasets (whose test sets differ), JaxmnistError for a bad one."""
    if len(run_dirs) < 2:
        raise ConfigError("compare needs at least two run directories")
    runs = [load_run(d, predictions=False) for d in run_dirs]
    datasets = {str(d): r.summary.get("dataset") for d, r in zip(run_dirs, runs, strict=True)}
    if len(set(datasets.values())) > 1:
        which = ", ".join(f"{d} on {name}" for d, name in datasets.items())
        raise ConfigError(
            f"runs on different datasets have different test sets, so their accuracies "
            f"cannot be compared: {which}; compare runs of one dataset"
        )
    return runs


def write_comparison(
    run_dirs: list[str | os.PathLike] | list[RunData], out: str | os.PathLike
) -> Path:
    """Writes the comparison page of `run_dirs` (or runs already loaded) to `out`; returns
    its path.

    Raises ConfigError for fewer than two runs, JaxmnistError for a bad run directory,
    WriteError if the page cannot be written.
    """
    runs = run_dirs if all(isinstance(r, RunData) for r in run_dirs) else load_runs(run_dirs)
    if len(runs) < 2:
        raise ConfigError("compare needs at least two run directories")
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
