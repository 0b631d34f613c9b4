"""Staged batches (gathered by the host as it draws each plan, on a TPU) against the
steps' own gather, side by side on one machine: whole `jaxmnist train` runs of each
preset with every cache off, the population's choice
(`memory.stages_batches`) forced off for `inline`; each run's compile (all its programs,
and each program's), steady epoch and test accuracy, from its summary.json.

    JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/staged_batches.py \
        --runs "--preset tpu101" "--preset record train.epochs=3"

Writes a dated record under benchmarks/results/staged_batches/ (`--out` to choose).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib.results import default_out, save_benchmark

CHILD = """
import sys
from jaxmnist.training import memory
if sys.argv[1] == "inline":
    memory.stages_batches = lambda *a, **k: False
from jaxmnist.cli import main
main(["train", *sys.argv[2:]])
"""


def one_run(mode: str, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as work:
        run = Path(work) / "run"
        flags = ["--quiet", "--no-report", "--no-checkpoint", "--no-compile-cache"]
        argv = [sys.executable, "-c", CHILD, mode, *args, *flags, "--run-dir", str(run)]
        subprocess.run(argv, check=True, timeout=600)
        s = json.loads((run / "summary.json").read_text())
        env = json.loads((run / "environment.json").read_text())
        epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "staged": env.get("staged_batches"),
        "compile_seconds": s["compile_seconds"],
        "compile_programs": s["compile_programs"],
        "steady_epoch_seconds": s["steady_epoch_seconds"],
        "epoch_seconds": [e["epoch_seconds"] for e in epochs],
        "test_accuracy": s["test_accuracy"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", default=["--preset tpu101"])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    load = os.getloadavg()
    pairs = {
        run: {mode: one_run(mode, run.split()) for mode in ("staged", "inline")}
        for run in args.runs
    }
    out = args.out or default_out("staged_batches.json")
    print(save_benchmark(out, {"pairs": pairs}, load))


if __name__ == "__main__":
    main()
