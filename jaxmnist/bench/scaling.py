"""Scaling over devices: `jaxmnist bench --devices 1,2,4,8`.

For each device count the bench trains the config for a few epochs through the
real run loop (`jaxmnist.training.loop.train_population`) in two layouts and takes the median
examples/s of the epochs after the first:

    data-parallel   one model, each global batch split over the `data` axis;
                    one gradient all-reduce per step (the float32 gradient)
    seed-parallel   one model per device on the `members` axis, no communication

Efficiency is examples/s per device over one device's. On a CPU the devices are
fake (`--xla_force_host_platform_device_count`): they share the same cores, so
the figures are the cost of splitting and the output says so; on a GPU or TPU
host the same command measures real scaling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from jaxmnist.errors import ConfigError
from jaxmnist.training import parallel
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members

EPOCHS = 3  # the first warms up; the median of the others is reported


def _steady_examples_per_second(cfg, dataset, layout) -> tuple[float, int]:
    r = train_population(cfg, seed_members(cfg), dataset, layout=layout)
    return float(np.median([rec["examples_per_second"] for rec in r.records[1:]])), r.info[
        "num_params"
    ]


def check_devices(device_counts: tuple[int, ...]) -> None:
    """ConfigError (one line) when a count exceeds the devices there are."""
    available = jax.device_count()
    if device_counts and max(device_counts) > available:
        raise ConfigError(
            f"--devices {','.join(map(str, device_counts))}: only {available} device(s) exist "
            "(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N fakes more)"
        )


def measure_scaling(
    cfg, dataset, device_counts: tuple[int, ...], log: Callable[[str], None] | None = None
) -> dict:
    """Rows of examples/s and efficiency per device count (see the module doc)."""
    log = log or (lambda line: None)
    check_devices(device_counts)
    cfg = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, epochs=EPOCHS, steps=None, eval_train=False)
    )
    rows = []
    for n in device_counts:
        log(f"scaling: {n} device(s), data-parallel then seed-parallel, {EPOCHS} epochs each")
        parallel.check_layout(
            parallel.build_layout(n), num_models=1, batch_size=cfg.train.batch_size
        )
        data_eps, num_params = _steady_examples_per_second(cfg, dataset, parallel.build_layout(n))
        seeds = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seeds=n))
        seed_eps, _ = _steady_examples_per_second(
            seeds, dataset, parallel.build_layout(n, num_models=n)
        )
        rows.append(
            {
                "devices": n,
                "data_parallel_examples_per_second": data_eps,
                "seed_parallel_examples_per_second": seed_eps,
                "allreduce_bytes_per_step": 4 * num_params if n > 1 else 0,
            }
        )
    base = rows[0]
    for row in rows:
        for kind in ("data_parallel", "seed_parallel"):
            per_device = row[f"{kind}_examples_per_second"] / row["devices"]
            row[f"{kind}_efficiency"] = (
                per_device / base[f"{kind}_examples_per_second"] * base["devices"]
            )
    fake = jax.default_backend() == "cpu"
    return {
        "epochs": EPOCHS,
        "rows": rows,
        "fake_devices": fake,
        "note": (
            "fake CPU devices share the same cores: these figures are the cost of splitting, "
            "not a speed-up"
            if fake
            else "real devices"
        ),
    }


def scaling_lines(scaling: dict) -> list[str]:
    """The terminal table."""
    title = (
        f"Devices: median examples/s of epochs 2-{scaling['epochs']}; efficiency = speed-up "
        "over the first row / devices"
    )
    header = (
        f"{'devices':>7}  {'data-parallel ex/s':>18}  {'eff.':>5}  {'seed-parallel ex/s':>18}  "
        f"{'eff.':>5}  {'all-reduce/step':>15}"
    )
    lines = ["", title, header]
    for r in scaling["rows"]:
        lines.append(
            f"{r['devices']:>7}  {r['data_parallel_examples_per_second']:>18,.0f}  "
            f"{r['data_parallel_efficiency']:>5.2f}  "
            f"{r['seed_parallel_examples_per_second']:>18,.0f}  "
            f"{r['seed_parallel_efficiency']:>5.2f}  "
            f"{r['allreduce_bytes_per_step'] / 1e6:>12.2f} MB"
        )
    lines.append(f"({scaling['note']})")
    return lines
