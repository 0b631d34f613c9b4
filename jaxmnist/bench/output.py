"""What `jaxmnist bench` writes: bench.json, a bar chart and a page.

`write_outputs(result, out_dir)` writes bench.json (every figure, the config and the
environment; non-finite numbers become null so that the file is strict JSON), bench.png
(examples/s by variant, by mode, by dtype and by batch size, with the min-max range of
the windows as error bars) and bench.html, a self-contained page built with the shared
template (`jaxmnist.pages`) that holds the terminal's tables too (`table.format_table`).
Tokens/s appears only as a projection, labelled as one, when the user gave tokens per
example.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from jaxmnist.bench.page import render_bench_page
from jaxmnist.bench.table import format_table
from jaxmnist.errors import WriteError
from jaxmnist.runs.rundir import atomic_write

JSON_NAME, PNG_NAME, HTML_NAME = "bench.json", "bench.png", "bench.html"


def _strict(value):
    """NaN and infinities become None, recursively, so that the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def to_json(result: dict) -> str:
    return json.dumps(_strict(result), indent=2, allow_nan=False) + "\n"


def bar_chart(result: dict) -> bytes:
    """PNG bytes: examples/s by variant, by mode (log scale), by dtype and by batch size
    (with MFU), one panel per comparison measured."""
    # start-up: matplotlib is slow to import, and only the chart needs it
    import numpy as np
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from jaxmnist.report.plots import new_figure, style, to_png

    variants = (result.get("variants") or {}).get("rows") or []
    panels = [
        (
            variants,
            "value",
            f"{(result.get('variants') or {}).get('key')} ({_first(variants, 'mode')})",
            False,
        ),
        (result["modes"], "mode", f"Modes (batch {_first(result['modes'], 'batch_size')})", True),
        (result["dtypes"], "dtype", f"Compute dtype ({_first(result['dtypes'], 'mode')})", False),
        (
            result["batch_sweep"],
            "batch_size",
            f"Batch size ({_first(result['batch_sweep'], 'mode')}; MFU on bars)",
            False,
        ),
    ]
    panels = [p for p in panels if p[0]]
    with style():
        fig = new_figure(4.2 * len(panels), 3.8)
        axes = np.atleast_1d(fig.subplots(1, len(panels)))
        for ax, (rows, key, title, log) in zip(axes, panels):
            eps = np.array([_eps(m) for m in rows])
            lo = eps - np.array([m["examples_per_second"]["min"] for m in rows])
            hi = np.array([m["examples_per_second"]["max"] for m in rows]) - eps
            x = np.arange(len(rows))
            ax.bar(x, eps, color="#1f5fbf", yerr=[lo, hi], capsize=3, ecolor="#5b6475")
            tilt = len(rows) >= 4
            ax.set_xticks(
                x,
                [str(m[key]) for m in rows],
                rotation=30 if tilt else 0,
                ha="right" if tilt else "center",
                fontsize=8,
            )
            for xi, m in zip(x, rows):
                label = f"{_eps(m):,.0f}" if key != "batch_size" else f"{m['mfu']:.2f}"
                ax.annotate(
                    label,
                    (xi, m["examples_per_second"]["max"]),
                    textcoords="offset points",
                    xytext=(0, 3),
                    ha="center",
                    fontsize=7,
                )
            if log:
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            ax.margins(y=0.12)
            ax.set(title=title, ylabel="examples/s (median, min-max)")
            ax.grid(axis="x", visible=False)
    return to_png(fig)


def _first(rows: list[dict], key: str):
    return rows[0][key] if rows else ""


def write_outputs(result: dict, out_dir) -> dict[str, Path]:
    """Writes bench.json, bench.png and bench.html into `out_dir`; returns their paths."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError.from_os_error(e, out) from None
    paths = {"json": out / JSON_NAME, "png": out / PNG_NAME, "html": out / HTML_NAME}
    atomic_write(paths["json"], to_json(result).encode())
    png = bar_chart(result)
    atomic_write(paths["png"], png)
    atomic_write(paths["html"], render_bench_page(result, png, format_table(result)).encode())
    return paths


def _eps(m: dict) -> float:
    return m["examples_per_second"]["median"]
