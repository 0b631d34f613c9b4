"""The first convolution layer's filters, read from params.npz and drawn as a grid.

A convolutional first layer is the one whose weights can be looked at directly: each
output channel is a k×k kernel applied to the image's pixels, and after training they
show edge, stroke and blob detectors (or noise, if the layer learnt little). The figure
is one tile per output channel, row by row, on a diverging colour map centred on 0 (blue
negative, red positive, white 0) with one scale for all tiles, so that their
magnitudes compare. Only families whose registry entry names such kernels
(`Model.first_kernel`, the CNN's) have the figure.

The weights are the params.npz array (`rundir.save_params`) that `first_kernel` names,
`['conv'][0]['w']` for the CNN: float32 (k, k, C_in, C_out), or (seeds, k, k, C_in,
C_out) for a run of several seeds, of which the first seed's are shown. The MNIST family
is grayscale (C_in = 1); with more input channels a tile shows their mean.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from jaxmnist.errors import CorruptRunError, NotARunError
from jaxmnist.report.describe import model_facts
from jaxmnist.report.plots import new_figure, style

COLUMNS = 8  # tiles per row
CMAP = "RdBu_r"
CELL_INCHES = 0.55  # one tile and its gap on the page


def first_layer_filters(run_dir: str | Path, config: dict) -> np.ndarray | None:
    """float32 (C_out, k, k): the first conv layer's kernels (first seed), or None when
    the run's family has none (or is not registered here) or the run saved no parameters.
    The parameters are read by `runs.reader.open_run` (its errors, one line, when they
    are corrupt).

    config: the run's config.json as a dict.
    """
    key = model_facts(config.get("model", {}))["first_kernel"]
    if key is None:
        return None
    # start-up: JAX, only for a family with such kernels (the report needs none)
    import jax

    from jaxmnist.runs.reader import open_run

    try:
        run = open_run(run_dir)
    except NotARunError:  # no parameters saved: a report without the figure
        return None
    params = {
        jax.tree_util.keystr(k): v
        for k, v in jax.tree_util.tree_leaves_with_path(run.member_params(0))
    }
    w = np.asarray(params[key], np.float32)
    if w.ndim != 4 or w.shape[0] != w.shape[1] or not np.isfinite(w).all():
        raise CorruptRunError(
            f"{run_dir}: corrupt parameters ({key} has shape {w.shape} or is not finite; "
            "expected finite (k, k, C_in, C_out))"
        )
    return np.moveaxis(w.mean(axis=2), -1, 0)


def montage(filters: np.ndarray, columns: int = COLUMNS) -> np.ndarray:
    """float (rows·(k+1) − 1, cols·(k+1) − 1): tile i of filters (C, k, k) at row i // cols,
    column i % cols, with one-pixel NaN gaps (drawn white) between tiles and after the last."""
    c, k, _ = filters.shape
    cols = max(1, min(columns, c))
    rows = math.ceil(c / cols)
    out = np.full((rows * (k + 1) - 1, cols * (k + 1) - 1), np.nan, np.float32)
    for i, tile in enumerate(filters):
        r, q = divmod(i, cols)
        out[r * (k + 1) : r * (k + 1) + k, q * (k + 1) : q * (k + 1) + k] = tile
    return out


def filter_grid(filters: np.ndarray, title: str) -> Figure:
    """The tiles of `montage(filters)` on one colour scale, symmetric about 0, with its bar."""
    import matplotlib

    grid = montage(filters)
    limit = float(np.nanmax(np.abs(grid))) or 1.0
    cmap = matplotlib.colormaps[CMAP].with_extremes(bad="white")
    cols = grid.shape[1] / (filters.shape[1] + 1)
    rows = grid.shape[0] / (filters.shape[1] + 1)
    with style():
        fig = new_figure(max(3.2, cols * CELL_INCHES + 1.0), max(1.6, rows * CELL_INCHES + 0.7))
        ax = fig.subplots()
        image = ax.imshow(grid, cmap=cmap, vmin=-limit, vmax=limit, interpolation="nearest")
        ax.set_axis_off()
        ax.set_title(title)
        fig.colorbar(image, ax=ax, shrink=0.9, label="weight")
    return fig
