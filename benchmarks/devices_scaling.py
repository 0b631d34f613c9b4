"""Scaling over devices: data-parallel and seed-parallel tpu101, 1, 2, 4 and 8 devices.

    JAXMNIST_DATA_DIR=../shared/datasets .venv/bin/python benchmarks/devices_scaling.py [--smoke]

Sets XLA_FLAGS=--xla_force_host_platform_device_count=8 when no device count is
given, so on a CPU the "devices" are fake: they share the same cores, and the
figures measure the cost of splitting, not a speed-up (on a GPU or TPU host the
same script measures real scaling). For each device count it trains the tpu101
preset for 3 epochs and takes the median of the epochs after the first:

    data-parallel   one model, each batch of 128 split over the devices
    seed-parallel   one model per device (`--seeds N`), no communication

and prints examples/s, efficiency against one device (examples/s per device over
one device's), and the all-reduce payload per step (the float32 gradient). It
then checks that a full 5-epoch tpu101 run on 4 devices (or as many as there are)
reaches the single-device test accuracy within 0.05 points. Writes JSON (`--out`,
default benchmarks/results/devices_scaling/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import jax

from jaxmnist import config as config_lib
from jaxmnist import runtime
from jaxmnist.bench.measure import synthetic_dataset
from jaxmnist.bench.scaling import measure_scaling, scaling_lines
from jaxmnist.data import load_dataset
from jaxmnist.training import parallel
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members

from benchlib.results import SMOKE_HELP, default_out, provenance


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/devices_scaling/")
    args = p.parse_args(argv)
    out = args.out or default_out("devices_scaling.json", args.smoke)
    if args.smoke:
        dataset, counts = synthetic_dataset("mnist", train_size=512, test_size=64), (1, 2)
    else:
        dataset, counts = load_dataset("mnist"), (1, 2, 4, 8)
    counts = tuple(n for n in counts if n <= jax.device_count())
    scaling = measure_scaling(
        config_lib.get_preset("tpu101"),
        dataset,
        counts,
        lambda line: print(f"  {line}", file=sys.stderr, flush=True),
    )

    full = config_lib.get_preset("tpu101")
    full = dataclasses.replace(full, train=dataclasses.replace(full.train, eval_train=False))
    wide = min(max(counts), 4)
    acc = {}
    for n in sorted({1, wide}):
        r = train_population(full, seed_members(full), dataset, layout=parallel.build_layout(n))
        acc[n] = float(r.test.accuracy[0])
    env = runtime.environment()
    print(f"\n{env['cpu_model']} ({env['cpu_count']} cores), {env['backend']}, jax {env['jax']}")
    print("\n".join(scaling_lines(scaling)))
    diff = abs(acc[wide] - acc[1]) * 100
    print(
        f"tpu101, 5 epochs: test accuracy {acc[1]:.2%} on 1 device, {acc[wide]:.2%} on {wide} "
        f"(difference {diff:.2f} points; target <= 0.05)"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "scaling": scaling,
                "tpu101_test_accuracy": {"1": acc[1], str(wide): acc[wide]},
                "accuracy_difference_points": diff,
                "environment": env,
                "provenance": provenance(),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    # Before JAX starts its backend (in main), and only when run as a script: a test
    # that imports this module keeps its own devices.
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    sys.exit(main())
