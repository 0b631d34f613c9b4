"""Image-grid figures: one example per class, a grid of predictions, the most confident mistakes.

These are the figures the tutorials draw in a notebook to "look at your data"
and at what the model does with it. Images are uint8 (N, H, W), or (N, H, W, 3) in
colour, shown with their true pixel values (0 black, 255 white) and no smoothing;
images of other channel counts show each pixel's mean over its channels. Titles carry the class
names; a prediction's title is green when right and red when wrong, and says how
sure the model was, so a confident mistake stands out from a coin toss.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from jaxmnist.report.plots import BAD, GOOD, new_figure, style, to_png
from jaxmnist.runs.predictions import class_examples as first_of_each_class
from jaxmnist.use import preprocess

CELL_INCHES = 1.5  # width of one image and its gap on the page


def _montage(
    images: np.ndarray,
    titles: list[str],
    colors: list[str],
    cols: int,
    title_lines: int,
    fontsize: float,
    title: str | None,
) -> Figure:
    """All images in one picture with white gaps, each titled above.

    One `imshow` and a text per image instead of an axes per image: drawing 25
    axes costs several times more than the figure's content.
    """
    images = preprocess.as_model_input(images)  # the pixels exactly as the model gets them
    if images.ndim == 4 and images.shape[-1] != 3:  # not RGB: one gray level per pixel
        images = np.round(images.mean(axis=-1)).astype(np.uint8)
    n, h, w = images.shape[:3]
    cols = max(1, min(cols, n))
    rows = max(1, math.ceil(n / cols))
    gap = max(2, w // 7)
    scale = CELL_INCHES / (w + gap)  # inches per image pixel
    text_h = math.ceil(title_lines * fontsize * 1.3 / 72 / scale) + 1
    cell_h, cell_w = h + text_h + gap, w + gap
    canvas = np.full((rows * cell_h, cols * cell_w, *images.shape[3:]), 255, np.uint8)
    for k, image in enumerate(images):
        r, c = divmod(k, cols)
        y, x = r * cell_h + text_h, c * cell_w + gap // 2
        canvas[y : y + h, x : x + w] = image
    head = 0.4 if title else 0.0
    width, height = canvas.shape[1] * scale, canvas.shape[0] * scale
    with style():
        fig = new_figure(width, height + head, layout=None)
        ax = fig.add_axes((0, 0, 1, height / (height + head)))
        ax.set_axis_off()
        gray = {"cmap": "gray", "vmin": 0, "vmax": 255} if canvas.ndim == 2 else {}
        ax.imshow(canvas, interpolation="nearest", aspect="equal", **gray)
        for k, (text, color) in enumerate(zip(titles, colors)):
            r, c = divmod(k, cols)
            ax.text(
                c * cell_w + gap / 2 + w / 2,
                r * cell_h + text_h - 1,
                text,
                ha="center",
                va="bottom",
                fontsize=fontsize,
                color=color,
                linespacing=1.15,
            )
        if title:
            fig.suptitle(title, fontweight="bold", y=1 - 0.08 / (height + head), va="top")
    return fig


def class_examples(
    images: np.ndarray,
    labels: np.ndarray,
    class_names: list[str],
    title: str | None = None,
    cols: int = 5,
) -> Figure:
    """One image per class, each titled with its class name (a 2x5 grid for 10 classes).

    images: uint8 (K, H, W) or (K, H, W, C), one per class, in class order; labels: int (K,).
    """
    titles = [class_names[int(label)] for label in labels]
    return _montage(images, titles, ["black"] * len(titles), cols, 1, 9.5, title)


def prediction_grid(
    images: np.ndarray,
    labels: np.ndarray,
    probs: np.ndarray,
    class_names: list[str],
    title: str | None = None,
    cols: int = 5,
) -> Figure:
    """Images with the predicted class and its probability, and the true class.

    images: uint8 (K, H, W) or (K, H, W, C); labels: int (K,); probs: float (K, C). Green title:
    right; red: wrong.
    """
    predicted = probs.argmax(-1)
    titles = [
        f"pred: {class_names[p]} {100 * pr[p]:.0f}%\ntrue: {class_names[y]}"
        for y, p, pr in zip(labels, predicted, probs)
    ]
    colors = [GOOD if p == y else BAD for y, p in zip(labels, predicted)]
    return _montage(images, titles, colors, cols, 2, 8.5, title)


def confident_mistakes(
    images: np.ndarray,
    labels: np.ndarray,
    probs: np.ndarray,
    class_names: list[str],
    title: str | None = None,
    cols: int = 5,
) -> Figure:
    """Wrongly classified images, most confident first: the predicted class and its
    probability, and the true class with the probability the model gave it."""
    predicted = probs.argmax(-1)
    titles = [
        f"pred: {class_names[p]} {100 * pr[p]:.1f}%\ntrue: {class_names[y]} {100 * pr[y]:.1f}%"
        for y, p, pr in zip(labels, predicted, probs)
    ]
    return _montage(images, titles, [BAD] * len(titles), cols, 2, 8, title)


def dataset_examples_png(dataset, split: str = "train") -> bytes:
    """PNG of the first `split` image of each class of a `jaxmnist.data.Dataset`."""
    images = dataset.train_images if split == "train" else dataset.test_images
    labels = dataset.train_labels if split == "train" else dataset.test_labels
    idx = first_of_each_class(np.asarray(labels), len(dataset.spec.class_names))
    title = (
        f"{dataset.spec.display_name}: one {split}ing image per class"
        if split == "train"
        else f"{dataset.spec.display_name}: one test image per class"
    )
    return to_png(class_examples(images[idx], labels[idx], list(dataset.spec.class_names), title))
