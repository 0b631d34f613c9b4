"""What batch normalisation costs the CNN's training step on this machine.

Two measurements, each side by side with its windows interleaved (A B C A B C ...):

1. One batch-norm layer, forward and backward, on the reference CNN's first block
   output at batch 512 (512 x 28 x 28 x 16 float32): the conv bias alone (what the layer
   replaces), the formula differentiated by JAX, and the CNN's written-out gradient
   (`cnn._normalise`).
2. The `speedrun` preset's whole training step (at its batch size, real MNIST when
   JAXMNIST_DATA_DIR has it, else random images of the same shape) with
   `model.batch_norm` false and true: ms per step and the ratio.

Whether batch norm earns its keep is accuracy per second: (2) is the second's part; the
docs/results.md gives the accuracy part from training runs.

Usage: python benchmarks/batch_norm_cost.py [--windows 10] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/batch_norm_cost/).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.bench.measure import synthetic_dataset
from jaxmnist.data import load_dataset
from jaxmnist.errors import DataError
from jaxmnist.models import cnn
from jaxmnist.timing import Timed, time_interleaved
from jaxmnist.training.step import (
    TrainData,
    empty_metrics,
    init_state,
    make_epoch_plan,
    make_train_steps,
)

from benchlib.results import SMOKE_HELP, default_out, save_benchmark

STEPS_PER_WINDOW = 8


def layer_costs(windows: int, batch: int = 512) -> dict:
    """Median ms of one layer's forward and backward pass, by variant."""
    x = jax.random.normal(jax.random.key(0), (batch, 28, 28, 16))
    weights = jax.random.normal(jax.random.key(1), x.shape)
    scale, shift = jnp.ones(16), jnp.zeros(16)

    def formula(x, scale, shift):
        mean = x.mean(axis=(0, 1, 2))
        var = jnp.square(x - mean).mean(axis=(0, 1, 2))
        return (x - mean) * (jax.lax.rsqrt(var + cnn.BN_EPSILON) * scale) + shift

    variants = {
        "bias only": lambda x, scale, shift: x + shift,
        "batch norm, JAX's gradient": formula,
        "batch norm, written-out gradient": lambda *a: cnn._normalise(*a)[0],
    }
    timed = []
    for name, f in variants.items():
        grad = jax.jit(
            jax.grad(lambda x, s, b, f=f: jnp.sum(jax.nn.relu(f(x, s, b)) * weights), (0, 1, 2))
        )
        timed.append(Timed(lambda grad=grad: grad(x, scale, shift), name))
    results = time_interleaved(timed, windows=windows, warmup=1)
    return {m.label: statistics.median(s) * 1e3 for m, (s, _) in zip(timed, results)}


def step_costs(windows: int, smoke: bool = False) -> dict:
    """ms per `speedrun` training step without and with batch norm (`smoke`: a few
    steps at batch 16 on random images)."""
    base = config_lib.get_preset("speedrun")
    steps_per_window = STEPS_PER_WINDOW
    if smoke:
        base = config_lib.apply_overrides(base, {"train.batch_size": "16"})
        ds, steps_per_window = synthetic_dataset("mnist", train_size=64, test_size=1), 1
        images, labels, source = ds.train_images, ds.train_labels, "random images"
    else:
        try:
            ds = load_dataset("mnist", None, download=False)
            images, labels, source = ds.train_images, ds.train_labels, "real MNIST"
        except DataError:  # no data here: random bytes time the same arithmetic
            ds = synthetic_dataset("mnist")
            images, labels, source = ds.train_images, ds.train_labels, "random images"
    data = TrainData(jnp.asarray(images), jnp.asarray(labels.astype(np.int32)))
    num_steps = len(labels) // base.train.batch_size
    bounds = jnp.asarray(0), jnp.asarray(steps_per_window)  # on the device before timing
    timed = []
    for bn in (False, True):
        cfg = config_lib.apply_overrides(base, {"model.batch_norm": str(bn).lower()})
        opt = optim.make_optimizer(cfg.optimizer, num_steps)
        # One compiled call: eager initialisation would compile op by op.
        state = jax.jit(lambda k, cfg=cfg, opt=opt: init_state(k, cfg, opt, (28, 28), 10))(
            jax.random.key(0)
        )
        plan = jax.jit(make_epoch_plan(cfg, len(labels), num_steps))(jax.random.key(1))
        steps = jax.jit(make_train_steps(cfg, opt))
        metrics = empty_metrics(num_steps)

        def run(steps=steps, state=state, plan=plan, metrics=metrics):
            return steps(state, metrics, plan, data, *bounds)

        timed.append(Timed(run, f"batch_norm={str(bn).lower()}"))
    results = time_interleaved(timed, windows=windows, warmup=1)
    ms = {
        m.label: statistics.median(s) / steps_per_window * 1e3 for m, (s, _) in zip(timed, results)
    }
    return {
        "data": source,
        "batch_size": base.train.batch_size,
        "ms_per_step": ms,
        "ratio": ms["batch_norm=true"] / ms["batch_norm=false"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/batch_norm_cost/")
    args = p.parse_args(argv)
    out = args.out or default_out("batch_norm_cost.json", args.smoke)
    windows, batch = (1, 8) if args.smoke else (args.windows, 512)
    load_before = os.getloadavg()
    layer = layer_costs(windows, batch)
    print(f"one layer, forward + backward, {batch}x28x28x16 float32 (median ms):")
    for name, ms in layer.items():
        print(f"  {name:34s} {ms:8.1f} ms")
    step = step_costs(windows, args.smoke)
    print(
        f"speedrun training step, batch {step['batch_size']}, {step['data']} (median ms per step):"
    )
    for name, ms in step["ms_per_step"].items():
        print(f"  {name:34s} {ms:8.1f} ms")
    print(f"  batch norm costs {step['ratio']:.2f}x the step")
    figures = {"layer_ms": layer, "speedrun_step": step}
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
