"""How a grayscale first layer is convolved on a TPU, side by side on one machine: whole
`jaxmnist train` runs with every cache off, the first layer's formulation forced to each
arm (`auto`: what `conv.resolve` picks; `banded`, `patches`, `xla`), every other layer as
`auto` has it; each run's compile (all its programs, and each program's), steady epoch,
test accuracy and the first layer's formulation as environment.json records it. The arms
matter on a TPU; elsewhere they only show the formulations' cost on that backend.

    JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/first_conv.py \\
        --runs "--preset speedrun --seeds 8 --epochs 3 train.target_accuracy=null"

Writes a dated record under benchmarks/results/first_conv/ (`--out` to choose).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchlib.launch import patched_train, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

ARMS = ("auto", "banded", "patches", "xla")
# Prepended to the child's launcher: its first argument names the first layer's formulation.
PATCH = """\
import sys
from jaxmnist.models import conv
arm, resolve = sys.argv.pop(1), conv.resolve
def first_layer_as_arm(impl, backend=None, dtype="float32", in_channels=None, **shape):
    if arm != "auto" and impl == "auto" and in_channels == 1:
        return arm
    return resolve(impl, backend, dtype, in_channels, **shape)
conv.resolve = first_layer_as_arm
"""


def one_run(arm: str, args: list[str], smoke: bool) -> dict:
    figures, environment = patched_train(PATCH, arm, args, smoke)
    first = environment.get("conv_impl_first_layer", environment.get("conv_impl"))
    return {"first_layer": first, **figures}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", default=["--preset speedrun"], help="each run's arguments")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {ARMS}")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/first_conv/")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    require_data_dir(args.smoke)
    smoke_run = "--preset speedrun train.epochs=2 train.batch_size=2 train.target_accuracy=null"
    runs = [smoke_run] if args.smoke else args.runs
    load = os.getloadavg()
    results = {run: {arm: one_run(arm, run.split(), args.smoke) for arm in arms} for run in runs}
    out = args.out or default_out("first_conv.json", args.smoke)
    print(save_benchmark(out, {"arms": results}, load))


if __name__ == "__main__":
    main()
