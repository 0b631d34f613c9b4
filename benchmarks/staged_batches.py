"""Staged batches (gathered by the host as it draws each plan, on a TPU) against the
steps' own gather, side by side on one machine: whole `jaxmnist train` runs with every
cache off, the population's choice (`memory.stages_batches`) forced off for `inline`;
each run's compile (all its programs, and each program's), steady epoch and test
accuracy, from its run directory. On a CPU both runs gather in the steps (a CPU never
stages), so the pair only shows the spread there.

    JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/staged_batches.py \
        --runs "--preset tpu101" "--preset record train.epochs=3"

Writes a dated record under benchmarks/results/staged_batches/ (`--out` to choose).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchlib.launch import patched_train, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

# Prepended to the child's launcher: its first argument says whether staging is forced off.
PATCH = """\
import sys
from jaxmnist.training import memory
if sys.argv.pop(1) == "inline":
    memory.stages_batches = lambda *args, **kwargs: False
"""


def one_run(mode: str, args: list[str], smoke: bool) -> dict:
    figures, environment = patched_train(PATCH, mode, args, smoke)
    return {"staged": environment.get("staged_batches"), **figures}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", default=["--preset tpu101"], help="each run's arguments")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/staged_batches/")
    args = p.parse_args(argv)
    require_data_dir(args.smoke)
    runs = ["--preset tpu101 train.epochs=2 train.batch_size=2"] if args.smoke else args.runs
    load = os.getloadavg()
    pairs = {
        run: {mode: one_run(mode, run.split(), args.smoke) for mode in ("staged", "inline")}
        for run in runs
    }
    out = args.out or default_out("staged_batches.json", args.smoke)
    print(save_benchmark(out, {"pairs": pairs}, load))


if __name__ == "__main__":
    main()
