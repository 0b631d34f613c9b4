"""Figures of accuracy with its spread: seeds of one run, points of a sweep.

A run of several seeds is drawn as every seed's test-accuracy curve with their
mean, beside each seed's final accuracy with the mean and its 95% confidence
interval. A sweep is drawn by how many axes it has: one axis, mean accuracy
against the value with 95% intervals as error bars (a log axis when the values
are positive numbers spanning a decade or more, as learning rates do); two
axes, a heat map of mean accuracy annotated with mean ± std; more, every point
as a dot with its interval, best first. Same style and canvas as `plots`.
"""

from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

from jaxmnist.report.plots import TEST, TRAIN, epoch_ticks, new_figure, style

PCT = FuncFormatter(lambda v, _: f"{v:.2f}%")
SEEDS_NAMED = 32  # seeds the final-accuracy panel names one by one; past it, a spread of them


def seed_accuracy(records: list[dict], seeds: list[int], final: list[float], ci95) -> Figure:
    """Left: each seed's test accuracy per epoch (thin) and the mean (thick).
    Right: each seed's final test accuracy, the mean, and its 95% CI."""
    epochs = [r["epoch"] for r in records]
    per_seed = np.array([r["test_accuracy_per_seed"] for r in records]) * 100  # (epochs, seeds)
    final = 100 * np.asarray(final)
    with style():
        fig = new_figure(9.6, 3.8)
        left, right = fig.subplots(1, 2, width_ratios=[1.5, 1])
        for s in range(per_seed.shape[1]):
            left.plot(epochs, per_seed[:, s], color=TEST, alpha=0.3, lw=0.9)
        left.plot(
            epochs,
            per_seed.mean(1),
            "o-",
            color=TEST,
            lw=2,
            ms=4,
            label=f"mean of {len(seeds)} seeds",
        )
        left.set(title="Test accuracy of every seed", xlabel="epoch")
        left.xaxis.set_major_locator(epoch_ticks())
        left.yaxis.set_major_formatter(PercentFormatter(decimals=1))
        # Legends below the axes: inside, they can hide a curve or a seed's point.
        left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16))
        x = np.arange(len(final))
        right.scatter(x, final, color=TEST, s=22, zorder=3, label="one seed")
        mean = final.mean()
        right.axhline(mean, color="black", lw=1.2, label=f"mean {mean:.2f}%")
        if ci95 is not None:
            right.axhspan(
                100 * ci95[0], 100 * ci95[1], color=TRAIN, alpha=0.18, label="95% CI of the mean"
            )
        # Every seed named up to SEEDS_NAMED; beyond, evenly spaced ones (thousands of
        # labels ran together into a band).
        ticks = x if len(x) <= SEEDS_NAMED else np.linspace(0, len(x) - 1, 8)
        ticks = np.unique(np.round(ticks).astype(int))
        right.set_xticks(
            ticks, [str(seeds[i]) for i in ticks], fontsize=8 if len(ticks) <= 16 else 6
        )
        right.set(title="Final test accuracy by seed", xlabel="seed")
        right.yaxis.set_major_formatter(PCT)
        right.grid(axis="x", visible=False)
        right.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3)
    return fig


def _label(v) -> str:
    if isinstance(v, (list, tuple)):
        return "x".join(map(str, v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def _is_log_axis(values) -> bool:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return len(nums) == len(values) > 1 and min(nums) > 0 and max(nums) / min(nums) >= 10


# What a sweep ranks by (its `ranked_by`), in words.
METRIC_NAMES = {"test_accuracy": "test accuracy", "val_accuracy": "validation accuracy"}


def _interval(x: dict, metric: str) -> tuple[float, float]:
    """(below, above) the mean in percentage points: the 95% CI, or 0 for one seed."""
    if x[f"{metric}_ci95"] is None:
        return 0.0, 0.0
    lo, hi = x[f"{metric}_ci95"]
    return 100 * (x[f"{metric}_mean"] - lo), 100 * (hi - x[f"{metric}_mean"])


def sweep_one_axis(
    key: str, values: list, results: list[dict], metric: str = "test_accuracy"
) -> Figure:
    """Mean `metric` against the one swept value, 95% CI as error bars."""
    by_value = {_label(x["values"][key]): x for x in results}
    rows = [by_value[_label(v)] for v in values]
    means = np.array([100 * x[f"{metric}_mean"] for x in rows])
    err = np.array([_interval(x, metric) for x in rows]).T
    log = _is_log_axis(values)
    pos = np.asarray(values, float) if log else np.arange(len(values))
    with style():
        fig = new_figure(5.8, 3.9)
        ax = fig.subplots()
        ax.errorbar(
            pos,
            means,
            yerr=err,
            fmt="o-",
            color=TEST,
            ms=5,
            lw=1.5,
            capsize=4,
            label="mean, 95% CI",
        )
        for x, v in zip(rows, pos):
            ax.scatter(
                [v] * len(x[f"{metric}_per_seed"]),
                100 * np.asarray(x[f"{metric}_per_seed"]),
                color=TRAIN,
                s=9,
                alpha=0.45,
                zorder=2,
            )
        best = int(np.nanargmax(means))
        ax.scatter(
            [pos[best]],
            [means[best]],
            s=90,
            facecolors="none",
            edgecolors="black",
            zorder=4,
            label=f"best: {_label(values[best])}",
        )
        if log:
            ax.set_xscale("log")
            ax.set_xticks(pos, [_label(v) for v in values])
            ax.minorticks_off()
        else:
            ax.set_xticks(pos, [_label(v) for v in values])
        ax.set(title=f"{METRIC_NAMES[metric].capitalize()} across the sweep", xlabel=key)
        ax.yaxis.set_major_formatter(PCT)
        ax.legend(fontsize=8, loc="best")
    return fig


def sweep_heatmap(
    key_x: str, xs: list, key_y: str, ys: list, results: list[dict], metric: str = "test_accuracy"
) -> Figure:
    """Mean `metric` over two swept values, each cell annotated mean ± std."""
    cell = {(_label(x["values"][key_y]), _label(x["values"][key_x])): x for x in results}
    mean = np.full((len(ys), len(xs)), np.nan)
    text = [["" for _ in xs] for _ in ys]
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            r = cell[_label(y), _label(x)]
            mean[i, j] = 100 * r[f"{metric}_mean"]
            std = r[f"{metric}_std"]
            text[i][j] = f"{mean[i, j]:.2f}%" + (f"\n± {100 * std:.2f}" if std is not None else "")
    cmap = matplotlib.colormaps["viridis"]
    finite = mean[np.isfinite(mean)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (0, 100)
    norm = matplotlib.colors.Normalize(lo, hi if hi > lo else lo + 1e-9)
    with style():
        fig = new_figure(max(4.8, 1.25 * len(xs) + 2.6), max(3.4, 0.75 * len(ys) + 1.8))
        ax = fig.subplots()
        im = ax.imshow(mean, cmap=cmap, norm=norm, aspect="auto")
        best = np.unravel_index(np.nanargmax(mean), mean.shape) if finite.size else None
        for i in range(len(ys)):
            for j in range(len(xs)):
                rgba = cmap(norm(mean[i, j])) if np.isfinite(mean[i, j]) else (1, 1, 1, 1)
                dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.55
                ax.text(
                    j,
                    i,
                    text[i][j],
                    ha="center",
                    va="center",
                    fontsize=8,
                    fontweight="bold" if (i, j) == best else "normal",
                    color="white" if dark else "black",
                )
        ax.set_xticks(range(len(xs)), [_label(x) for x in xs])
        ax.set_yticks(range(len(ys)), [_label(y) for y in ys])
        ax.set(xlabel=key_x, ylabel=key_y, title=f"Mean {METRIC_NAMES[metric]} (bold: best)")
        ax.grid(False)
        ax.spines[:].set_visible(False)
        bar = fig.colorbar(im, ax=ax, shrink=0.85, pad=0.02, format=PCT)
        bar.set_label(f"mean {METRIC_NAMES[metric]}")
    return fig


def sweep_points(results: list[dict], metric: str = "test_accuracy") -> Figure:
    """Every point as its mean with a 95% CI bar, best at the top (three or more axes)."""
    shown = results[:40]
    means = np.array([100 * x[f"{metric}_mean"] for x in shown])
    err = np.array([_interval(x, metric) for x in shown]).T
    with style():
        fig = new_figure(7.2, 0.28 * len(shown) + 1.5)
        ax = fig.subplots()
        y = np.arange(len(shown))
        ax.errorbar(means, y, xerr=err, fmt="o", color=TEST, ms=4, capsize=3)
        ax.set_yticks(y, [x["label"] for x in shown], fontsize=7)
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(PCT)
        more = f" (best {len(shown)} of {len(results)})" if len(results) > len(shown) else ""
        name = METRIC_NAMES[metric]
        ax.set(title=f"Mean {name} with 95% CI{more}", xlabel=name)
        ax.grid(axis="y", visible=False)
    return fig


def sweep_figure(sweep: dict) -> Figure:
    """The plot a sweep gets, by its number of axes, of the metric it ranks by."""
    axes = list(sweep["axes"].items())
    metric = sweep.get("ranked_by", "test_accuracy")
    if len(axes) == 1:
        return sweep_one_axis(axes[0][0], axes[0][1], sweep["results"], metric)
    if len(axes) == 2:
        (kx, xs), (ky, ys) = axes if len(axes[0][1]) >= len(axes[1][1]) else axes[::-1]
        return sweep_heatmap(kx, xs, ky, ys, sweep["results"], metric)
    return sweep_points(sweep["results"], metric)
