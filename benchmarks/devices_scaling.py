"""Scaling over devices: data-parallel and seed-parallel tpu101, 1, 2, 4 and 8 devices.

    JAXMNIST_DATA_DIR=../shared/datasets .venv/bin/python benchmarks/devices_scaling.py

Sets XLA_FLAGS=--xla_force_host_platform_device_count=8 when no device count is
given, so on a CPU the "devices" are fake: they share the same cores, and the
figures measure the cost of splitting, not a speed-up (on a GPU or TPU host the
same script measures real scaling). For each device count it trains the tpu101
preset for 3 epochs and takes the median of the epochs after the first:

    data-parallel   one model, each batch of 128 split over the devices
    seed-parallel   one model per device (`--seeds N`), no communication

and prints examples/s, efficiency against one device (examples/s per device over
one device's), and the all-reduce payload per step (the float32 gradient). It
then checks that a full 5-epoch tpu101 run on 4 devices reaches the single-device
test accuracy within 0.05 points. Writes benchmarks/results/devices_scaling.json.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import dataclasses
import json
import sys
from pathlib import Path

import jax

from jaxmnist import config as config_lib
from jaxmnist import runtime
from jaxmnist.bench.scaling import measure_scaling, scaling_lines
from jaxmnist.data import load_dataset
from jaxmnist.training import parallel
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members

OUT = Path(__file__).parent / "results" / "devices_scaling.json"


def main() -> int:
    dataset = load_dataset("mnist")
    counts = tuple(n for n in (1, 2, 4, 8) if n <= jax.device_count())
    scaling = measure_scaling(
        config_lib.get_preset("tpu101"),
        dataset,
        counts,
        lambda line: print(f"  {line}", file=sys.stderr, flush=True),
    )

    full = config_lib.get_preset("tpu101")
    full = dataclasses.replace(full, train=dataclasses.replace(full.train, eval_train=False))
    acc = {}
    for n in (1, 4):
        r = train_population(full, seed_members(full), dataset, layout=parallel.build_layout(n))
        acc[n] = float(r.test.accuracy[0])
    env = runtime.environment()
    print(f"\n{env['cpu_model']} ({env['cpu_count']} cores), {env['backend']}, jax {env['jax']}")
    print("\n".join(scaling_lines(scaling)))
    diff = abs(acc[4] - acc[1]) * 100
    print(
        f"tpu101, 5 epochs: test accuracy {acc[1]:.2%} on 1 device, {acc[4]:.2%} on 4 "
        f"(difference {diff:.2f} points; target <= 0.05)"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "scaling": scaling,
                "tpu101_test_accuracy": {"1": acc[1], "4": acc[4]},
                "accuracy_difference_points": diff,
                "environment": env,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
