"""Where a benchmark script writes its figures, and what it writes beside them.

Every result keeps the load average before and after (other processes on a shared
machine inflate every figure) and `runtime.environment()` (versions, backend, devices,
CPU), so that a number can be traced to what produced it. A `--smoke` run writes to a
scratch folder unless told otherwise, so that it never replaces a committed result.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from jaxmnist import runtime
from jaxmnist.errors import WriteError
from jaxmnist.runs.rundir import atomic_write

RESULTS = Path(__file__).resolve().parent.parent / "results"
SMOKE_HELP = "a few steps on tiny data: checks that the script runs (its figures mean nothing)"


def default_out(name: str, smoke: bool = False) -> Path:
    """benchmarks/results/NAME, or with `smoke` the same name in a scratch folder."""
    return (Path(tempfile.gettempdir()) / "jaxmnist-benchmarks-smoke" if smoke else RESULTS) / name


def save_benchmark(path: Path, figures: dict, load_before: tuple) -> str:
    """Writes a benchmark's `figures` to `path` as JSON (atomically: never a half-written
    file) with what every result keeps beside them (the load average before and after,
    `environment()`); returns the line that says where it ran and where the figures
    went. Where `path` cannot be written, prints the JSON and exits with one line."""
    out = {
        **figures,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "environment": runtime.environment(),
    }
    text = json.dumps(out, indent=2) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text.encode())
    except (OSError, WriteError) as e:
        # Minutes of measuring are not lost to an unwritable folder (a checkout mounted
        # read-only on an accelerator's machine): the figures go to stdout instead.
        print(text, end="")
        sys.exit(f"could not write {path} ({e}); the figures are printed above")
    env, after = out["environment"], out["load_average"]["after"]
    return (
        f"{env['backend']} / {env['cpu_model']} ({env['cpu_count']} cores), jax {env['jax']}; "
        f"load {load_before[0]:.1f} -> {after[0]:.1f}; written to {path}"
    )
