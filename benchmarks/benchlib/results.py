"""Where a benchmark script writes its figures, and what it writes beside them.

Results are records, appended and never rewritten: a benchmark's default output is a new
file in its own folder, `benchmarks/results/<benchmark>/<date>_<commit>_<machine>.json`
(`default_out`), so the newest record of each benchmark is its latest figure and the
older ones are its history. Every result keeps its provenance (`provenance`: the git
commit measured and whether the checkout differed from it, the date, the exact command,
the machine: CPU model and instruction-set flags, or the accelerator), the load average
before and after (other processes on a shared machine inflate every figure) and
`runtime.environment()` (versions, backend, devices), so that a number can be traced to
what produced it. A `--smoke` run writes to a scratch folder unless told otherwise, so
that it never adds a record.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from jaxmnist import runtime
from jaxmnist.errors import WriteError
from jaxmnist.runs.rundir import atomic_write

CHECKOUT = Path(__file__).resolve().parents[2]  # the repository whose commit is measured
RESULTS = CHECKOUT / "benchmarks" / "results"
SMOKE_HELP = "a few steps on tiny data: checks that the script runs (its figures mean nothing)"


# The instruction-set extensions that change what XLA and oneDNN generate for a CPU.
CPU_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=CHECKOUT, capture_output=True, text=True, check=False
        )
    except OSError:  # no git on this machine
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu() -> dict:
    """The host CPU's model and its instruction-set flags of `CPU_FLAGS`, from
    /proc/cpuinfo (empty where there is none)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu_model": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags]}


def _slug(text: str) -> str:
    words = re.sub(r"\(r\)|\(tm\)|\bcpu\b|\bprocessor\b|@.*", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-")[:40] or "unknown"


def provenance(accelerator: str | None = None) -> dict:
    """What a result was measured with: the commit (None outside a git checkout) and
    whether the checkout differed from it, the date (UTC), the exact command, the
    machine (CPU model and flags, the core count, the accelerator's kind if any)."""
    commit = _git("rev-parse", "HEAD") or None
    return {
        "commit": commit,
        "dirty": bool(commit) and bool(_git("status", "--porcelain", "--untracked-files=no")),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": {**_cpu(), "cpu_count": os.cpu_count(), "accelerator": accelerator},
    }


def record_name(prov: dict) -> str:
    """`<date>_<commit>_<machine>.json` for a result of provenance `prov`."""
    commit = prov["commit"][:7] if prov["commit"] else "nocommit"
    commit += "-dirty" if prov["dirty"] else ""
    machine = prov["machine"]["accelerator"] or prov["machine"]["cpu_model"]
    return f"{prov['date'][:10]}_{commit}_{_slug(machine)}.json"


def default_out(name: str, smoke: bool = False) -> Path:
    """A new record of benchmark NAME (`x.json` or `x`; `tpu/x.json` for one measured on
    a TPU): `benchmarks/results/x/<date>_<commit>_<machine>.json`, named from this
    process's provenance, numbered on if that file exists (records are never replaced).
    With `smoke`, the same under a scratch folder."""
    root = Path(tempfile.gettempdir()) / "jaxmnist-benchmarks-smoke" if smoke else RESULTS
    folder = root / name.removesuffix(".json")
    path = folder / record_name(provenance())
    n = 2
    while path.exists():
        path = path.with_name(f"{path.stem.split('~')[0]}~{n}.json")
        n += 1
    return path


def save_benchmark(path: Path, figures: dict, load_before: tuple) -> str:
    """Writes a benchmark's `figures` to `path` as JSON (atomically: never a half-written
    file) with what every result keeps beside them (`provenance()`, the load average
    before and after, `environment()`); returns the line that says where it ran and
    where the figures went. Where `path` cannot be written, prints the JSON and exits
    with one line."""
    env = runtime.environment()
    accelerator = env["device_kind"] if env["backend"] != "cpu" else None
    out = {
        **figures,
        "provenance": provenance(accelerator),
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "environment": env,
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
