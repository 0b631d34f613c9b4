"""Metric figures: training curves, the confusion matrix, per-class accuracy, run overlays.

Figures are built as `matplotlib.figure.Figure` objects drawn by the Agg canvas,
never through pyplot, so plotting has no global state, needs no display, and
does not switch the backend of a notebook that imports jaxmnist. Every figure is
drawn under matplotlib's default style plus a few fixed settings, so the same
run gives the same PNG whatever the user's matplotlibrc says. `to_png` and
`to_rgb` turn a figure into bytes for a page or an array for TensorBoard.
The image grids (examples, predictions, mistakes) are in `image_grids`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math

import matplotlib
import matplotlib.style
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

DPI = 110
GOOD, BAD = "#17803d", "#c62828"  # right / wrong, as in the page's CSS
TRAIN, TEST = "#1f77b4", "#d62728"
VAL = "#ff7f0e"  # the validation split (data.validation)
STYLE = {
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "savefig.dpi": DPI,
    "figure.dpi": DPI,
    "svg.hashsalt": "jaxmnist",
}
# Fixed margins, inches: the figure's edge, a tick with its pad, an axis label with
# its pad, a title with its pad (the sizes of STYLE), and those of the two curve
# figures (tick labels up to "99.95%" on the left; title, epoch ticks and label on top).
EDGE, TICK, LABEL, TITLE = 0.08, 7 / 72, 15.5 / 72, 18.6 / 72
CURVE_MARGINS = (0.8, 0.5, 0.12, 0.66)


def epoch_ticks() -> MaxNLocator:
    """Whole epochs only, even for a run of one (MaxNLocator's default falls back to
    fractions, 0.945 ... 1.050, when fewer than two whole numbers fit)."""
    return MaxNLocator(integer=True, min_n_ticks=1)


@contextlib.contextmanager
def style():
    """matplotlib's defaults plus ours, ignoring the user's matplotlibrc."""
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        yield


@functools.cache
def _glyphs() -> frozenset[int]:
    """Code points the figures' font can draw."""
    from matplotlib import font_manager

    with style():
        path = font_manager.findfont(font_manager.FontProperties())
    return frozenset(font_manager.get_font(path).get_charmap())


def drawable(text: str) -> str:
    """`text` with characters our font lacks (an emoji in a run directory's name) shown
    as "?", so that drawing it does not make matplotlib warn about missing glyphs."""
    glyphs = _glyphs()
    return "".join(c if ord(c) in glyphs or c.isspace() else "?" for c in text)


def new_figure(
    width: float,
    height: float,
    layout: str | None = "constrained",
    margins: tuple[float, float, float, float] | None = None,
) -> Figure:
    """A figure of `width` × `height` inches on the Agg canvas.

    margins: (left, bottom, right, top) inches around the subplots, a fixed layout
    instead of `layout`; the report's own figures use it, as the constrained layout
    lays every text out again at each draw, which costs more than drawing them.
    """
    fig = Figure(figsize=(width, height), layout=None if margins else layout)
    if margins:
        left, bottom, right, top = margins
        fig.subplots_adjust(
            left=left / width, bottom=bottom / height, right=1 - right / width, top=1 - top / height
        )
    elif layout == "constrained":
        fig.get_layout_engine().set(h_pad=0.08, w_pad=0.08)
    FigureCanvasAgg(fig)
    return fig


def text_inches(texts, fontsize: float | str, rotation: float = 0.0) -> tuple[float, float]:
    """(width, height) in inches of the box holding the widest and the tallest of
    `texts` in the figures' font at `fontsize` points, rotated by `rotation` degrees;
    call it under `style()`. For margins that fit labels the data chose (class names)."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    renderer, prop = RendererAgg(1, 1, 72), FontProperties(size=fontsize)
    sizes = [renderer.get_text_width_height_descent(t, prop, ismath=False) for t in texts]
    w = max((s[0] for s in sizes), default=0.0) / 72
    h = max((s[1] for s in sizes), default=0.0) / 72
    a = math.radians(rotation)
    return (
        w * abs(math.cos(a)) + h * abs(math.sin(a)),
        w * abs(math.sin(a)) + h * abs(math.cos(a)),
    )


def to_png(fig: Figure) -> bytes:
    """PNG bytes of `fig` (no timestamps or version in the metadata: reproducible)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, facecolor="white")
    return buf.getvalue()


def to_rgb(fig: Figure) -> np.ndarray:
    """uint8 (H, W, 3) pixels of `fig`, e.g. for a TensorBoard image."""
    fig.set_facecolor("white")
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _smooth(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Centred moving average: (positions, means), positions as float indices."""
    window = max(1, min(window, len(values)))
    kernel = np.ones(window) / window
    means = np.convolve(values, kernel, mode="valid")
    return np.arange(len(means)) + (window - 1) / 2, means


def _loss_trend(steps, losses) -> tuple[np.ndarray, np.ndarray]:
    """The per-step training loss as a moving average over ~1/40 of the run, on the step axis."""
    pos, mean = _smooth(np.asarray(losses, float), max(1, len(losses) // 40))
    return np.interp(pos, np.arange(len(steps)), steps), mean


def _log_y(ax) -> None:
    """Log scale with plain tick labels (0.3, not 3x10^-1); minor ticks at 2, 3 and
    5 times a power of ten are labelled too when the axis spans few decades."""

    def minor(v, _):
        lo, hi = ax.get_ylim()
        mantissa = round(v / 10 ** math.floor(math.log10(v)), 6)
        return f"{v:g}" if hi / max(lo, 1e-30) < 40 and mantissa in (2, 3, 5) else ""

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def _epoch_axis(ax, records: list[dict]) -> None:
    """A second x axis on top, in epochs, matching the step axis below.

    Every epoch but the last has the same number of steps, so epoch = step /
    steps per epoch exactly, and a partial last epoch shows as the fraction it ran.
    """
    ends = np.array([0] + [r["step"] for r in records])
    per_epoch = max(int(np.diff(ends).max()), 1)
    sec = ax.secondary_xaxis("top", functions=(lambda s: s / per_epoch, lambda e: e * per_epoch))
    sec.set_xlabel("epoch")
    sec.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(len(records), 10)))


def loss_curves(records: list[dict], steps: np.ndarray, losses: np.ndarray) -> Figure:
    """Training and test loss against step (bottom axis) and epoch (top axis), log scale.

    records: metrics.jsonl rows (step, test_loss, ...); steps, losses: the
    per-step training loss (step_loss.csv), drawn faint with a moving average.
    """
    ends = np.array([r["step"] for r in records])
    with style():
        fig = new_figure(5.4, 3.9, margins=CURVE_MARGINS)
        ax = fig.subplots()
        if len(losses):
            ax.plot(steps, losses, color=TRAIN, alpha=0.18, lw=0.8, label="train, each step")
            ax.plot(
                *_loss_trend(steps, losses),
                color=TRAIN,
                lw=1.4,
                label="train, moving average",
            )
        ax.plot(
            ends, [r["test_loss"] for r in records], "o-", color=TEST, ms=4, lw=1.6, label="test"
        )
        if all("val_loss" in r for r in records):  # a validation split held out
            val = [r["val_loss"] for r in records]
            ax.plot(ends, val, "^-", color=VAL, ms=4, lw=1.4, label="validation")
        _log_y(ax)
        ax.set(title="Loss (cross-entropy)", xlabel="step")
        ax.legend(fontsize=8)
        ax.set_xlim(0, max(ends[-1], 1) * 1.02)
        _epoch_axis(ax, records)
    return fig


def accuracy_curves(records: list[dict], train_label: str = "train") -> Figure:
    """Training and test accuracy after each epoch, against step and epoch (and the
    ensemble's test accuracy, dashed, for a run of several seeds; with a validation split,
    its accuracy and the ensemble's there)."""
    ends = np.array([r["step"] for r in records])
    train_acc = [100 * r["train_accuracy"] for r in records]
    test_acc = [100 * r["test_accuracy"] for r in records]
    with style():
        fig = new_figure(5.4, 3.9, margins=CURVE_MARGINS)
        ax = fig.subplots()
        ax.plot(ends, train_acc, "o-", color=TRAIN, ms=4, lw=1.6, label=train_label)
        ax.plot(ends, test_acc, "o-", color=TEST, ms=4, lw=1.6, label="test")
        if all("val_accuracy" in r for r in records):  # a validation split held out
            val = [100 * r["val_accuracy"] for r in records]
            ax.plot(ends, val, "^-", color=VAL, ms=4, lw=1.4, label="validation")
        if all("ensemble_test_accuracy" in r for r in records):  # several seeds' ensemble
            ensemble = [100 * r["ensemble_test_accuracy"] for r in records]
            ax.plot(ends, ensemble, "s--", color=TEST, ms=4, lw=1.2, label="test, ensemble")
        if all("ensemble_val_accuracy" in r for r in records):  # and on the validation split
            ensemble = [100 * r["ensemble_val_accuracy"] for r in records]
            ax.plot(ends, ensemble, "^--", color=VAL, ms=4, lw=1.2, label="validation, ensemble")
        # Decimals from the axis's own range: a run within a tenth of a percent needs two,
        # or its ticks would repeat one label.
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=None))
        ax.set(title="Accuracy", xlabel="step")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_xlim(0, max(ends[-1], 1) * 1.02)
        _epoch_axis(ax, records)
    return fig


def _text_color(rgba) -> str:
    r, g, b = rgba[:3]
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"


def confusion_matrix(matrix: np.ndarray, class_names: list[str]) -> Figure:
    """Row-normalised confusion matrix, in percent of each true class.

    The diagonal (accuracy of each class) is shaded green and always annotated;
    off-diagonal cells are shaded red on their own scale, so that the few
    percent of errors show their structure, and annotated from 0.5 %.
    """
    m = np.asarray(matrix, np.float64)
    n = len(class_names)
    pct = 100 * m / np.maximum(m.sum(1, keepdims=True), 1)
    diag = np.eye(n, dtype=bool)
    off_max = max(pct[~diag].max(initial=0.0), 1e-9)
    reds, greens = matplotlib.colormaps["Reds"], matplotlib.colormaps["Greens"]
    off_norm = Normalize(0, off_max)
    rgba = np.where(diag[..., None], greens(0.35 + 0.55 * pct / 100), reds(off_norm(pct) * 0.85))
    rgba[~diag & (m == 0)] = (1, 1, 1, 1)
    size = max(4.5, 0.45 * n + 2.3)
    rotate = max(len(c) for c in class_names) > 2
    with style():
        fs = matplotlib.rcParams["xtick.labelsize"]
        left = EDGE + LABEL + TICK + text_inches(class_names, fs)[0]
        bottom = EDGE + LABEL + TICK + text_inches(class_names, fs, 40 if rotate else 0)[1]
        right = 0.14 + 0.23 + 0.62  # gap, colour bar, its ticks and label
        side = min(size - bottom - EDGE - TITLE, size + 1.0 - left - right)
        left += (size + 1.0 - left - right - side) / 2  # the square centred in what is left
        fig = new_figure(size + 1.0, size, layout=None)
        w, h = fig.get_size_inches()
        ax = fig.add_axes((left / w, bottom / h, side / w, side / h))
        cax = fig.add_axes(
            ((left + side + 0.14) / w, (bottom + 0.125 * side) / h, 0.23 / w, 0.75 * side / h)
        )
        ax.imshow(rgba, interpolation="nearest")
        fs = 8 if n <= 10 else 6
        for i in range(n):
            for j in range(n):
                if i == j or pct[i, j] >= 0.5:
                    text = f"{pct[i, j]:.1f}" if pct[i, j] < 99.95 else "100"
                    ax.text(
                        j,
                        i,
                        text,
                        ha="center",
                        va="center",
                        fontsize=fs,
                        fontweight="bold" if i == j else "normal",
                        color=_text_color(rgba[i, j]),
                    )
        if rotate:
            ax.set_xticks(range(n), class_names, rotation=40, ha="right", rotation_mode="anchor")
        else:
            ax.set_xticks(range(n), class_names)
        ax.set_yticks(range(n), class_names)
        ax.set(xlabel="predicted class", ylabel="true class")
        ax.set_title("Confusion matrix, % of each true class")
        ax.grid(False)
        ax.spines[:].set_visible(False)
        ax.set_xticks(np.arange(n + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(n + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", lw=1.2)
        ax.tick_params(which="minor", length=0)
        bar = fig.colorbar(matplotlib.cm.ScalarMappable(off_norm, reds), cax=cax)
        bar.set_label("errors, % of true class (off-diagonal)")
    return fig


def per_class_accuracy(matrix: np.ndarray, class_names: list[str]) -> Figure:
    """Horizontal bars of each class's test accuracy, with the overall accuracy as a line.

    The axis starts below the lowest bar (it says where) so that differences of a
    percent are visible; each bar is labelled with its value.
    """
    m = np.asarray(matrix, np.float64)
    support = m.sum(1)
    acc = 100 * np.diag(m) / np.maximum(support, 1)
    overall = 100 * np.trace(m) / max(m.sum(), 1)
    lo = max(0.0, math.floor((acc.min() - 4) / 10) * 10)
    n = len(class_names)
    with style():
        names, _ = text_inches(class_names, matplotlib.rcParams["ytick.labelsize"])
        fig = new_figure(6.4, 0.32 * n + 1.4, margins=(EDGE + TICK + names, 0.5, EDGE, 0.27))
        ax = fig.subplots()
        y = np.arange(n)
        colors = [BAD if a < overall else TRAIN for a in acc]
        ax.barh(y, acc - lo, left=lo, color=colors, height=0.7)
        for yi, a in zip(y, acc):
            ax.text(
                min(a, 100) + (100 - lo) * 0.01,
                yi,
                f"{a:.1f}%",
                va="center",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.85},
            )
        ax.axvline(overall, color="black", ls="--", lw=1)
        ax.set_yticks(y, class_names)
        ax.invert_yaxis()
        ax.set_xlim(lo, 100 + (100 - lo) * 0.12)
        ax.xaxis.set_major_formatter(PercentFormatter(decimals=0))
        ax.set_xlabel("test accuracy" + (f" (axis starts at {lo:.0f}%)" if lo > 0 else ""))
        ax.set_title(f"Accuracy per class (dashed: overall {overall:.2f}%; red: below it)")
        ax.grid(axis="y", visible=False)
    return fig


def compare_curves(runs: list[tuple[str, list[dict], np.ndarray, np.ndarray]]) -> dict[str, Figure]:
    """Runs overlaid, one figure each for the smoothed training loss against step,
    and test loss and test accuracy against epoch, and validation accuracy when a run
    held out a split. runs: (label, metrics records, steps, per-step losses). Returns
    {"train_loss", "test_loss", "test_accuracy"[, "val_accuracy"]}."""
    colors = matplotlib.colormaps["tab10"]
    height = 3.6 + 0.22 * math.ceil(len(runs) / 2)  # room for the legend below
    figs = {}
    kinds = [
        ("train_loss", "Training loss (moving average)", "step"),
        ("test_loss", "Test loss", "epoch"),
        ("test_accuracy", "Test accuracy", "epoch"),
    ]
    if any("val_accuracy" in r for _, records, _, _ in runs for r in records):
        kinds.append(("val_accuracy", "Validation accuracy", "epoch"))
    with style():
        for name, title, xlabel in kinds:
            fig = new_figure(5.4, height)
            ax = fig.subplots()
            for k, (label, records, steps, losses) in enumerate(runs):
                c = colors(k % 10)
                epochs = [r["epoch"] for r in records]
                if name == "train_loss" and len(losses):
                    ax.plot(
                        *_loss_trend(steps, losses),
                        color=c,
                        lw=1.4,
                        label=label,
                    )
                elif name == "test_loss":
                    ax.plot(
                        epochs,
                        [r["test_loss"] for r in records],
                        "o-",
                        color=c,
                        ms=4,
                        lw=1.5,
                        label=label,
                    )
                elif name.endswith("accuracy") and all(name in r for r in records):
                    ax.plot(
                        epochs,
                        [100 * r[name] for r in records],
                        "o-",
                        color=c,
                        ms=4,
                        lw=1.5,
                        label=label,
                    )
            ax.set(title=title, xlabel=xlabel)
            if name == "train_loss":
                _log_y(ax)
            else:
                ax.xaxis.set_major_locator(epoch_ticks())
            if name.endswith("accuracy"):
                ax.yaxis.set_major_formatter(PercentFormatter(decimals=None))
            fig.legend(
                *ax.get_legend_handles_labels(),
                loc="outside lower center",
                ncols=min(len(runs), 2),
                fontsize=8,
            )
            figs[name] = fig
    return figs
