"""What batch normalisation costs the CNN's training step on this machine.

Two measurements, each side by side with its windows interleaved (A B C A B C ...):

1. One batch-norm layer, forward and backward, on the speedrun's first block output
   (512 x 28 x 28 x 16 float32): the conv bias alone (what the layer replaces), the
   formula differentiated by JAX, and the CNN's written-out gradient (`cnn._normalise`).
2. The `speedrun` preset's whole training step (batch 512, real MNIST when
   JAXMNIST_DATA_DIR has it, else random images of the same shape) with
   `model.batch_norm` false and true: ms per step and the ratio.

Whether batch norm earns its keep is accuracy per second: (2) is the second's part; the
README gives the accuracy part from training runs.

Usage: python benchmarks/batch_norm_cost.py [--windows 10]
Prints a table and writes JSON (`--out`, default benchmarks/results/batch_norm_cost.json).
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
from jaxmnist import optim, runtime
from jaxmnist.bench.timing import Timed, time_interleaved
from jaxmnist.errors import DataError
from jaxmnist.models import cnn
from jaxmnist.training.step import (
    TrainData,
    empty_metrics,
    init_state,
    make_epoch_plan,
    make_train_steps,
)

HERE = Path(__file__).resolve().parent
STEPS_PER_WINDOW = 8


def layer_costs(windows: int) -> dict:
    x = jax.random.normal(jax.random.key(0), (512, 28, 28, 16))
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


def step_costs(windows: int) -> dict:
    base = config_lib.get_preset("speedrun")
    try:
        from jaxmnist.data import load_dataset

        ds = load_dataset("mnist", None, download=False)
        images, labels, source = ds.train_images, ds.train_labels, "real MNIST"
    except DataError:  # no data here: random bytes time the same arithmetic
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (60_000, 28, 28), np.uint8)
        labels, source = rng.integers(0, 10, 60_000).astype(np.int32), "random images"
    data = TrainData(jnp.asarray(images), jnp.asarray(labels))
    num_steps = len(labels) // base.train.batch_size
    bounds = jnp.asarray(0), jnp.asarray(STEPS_PER_WINDOW)  # on the device before timing
    timed = []
    for bn in (False, True):
        cfg = config_lib.apply_overrides(base, {"model.batch_norm": str(bn).lower()})
        opt = optim.make_optimizer(cfg.optimizer, num_steps)
        state = init_state(jax.random.key(0), cfg, opt, (28, 28), 10)
        plan = jax.jit(make_epoch_plan(cfg, len(labels), num_steps))(jax.random.key(1))
        steps = jax.jit(make_train_steps(cfg, opt))
        metrics = empty_metrics(num_steps)

        def run(steps=steps, state=state, plan=plan, metrics=metrics):
            return steps(state, metrics, plan, data, *bounds)

        timed.append(Timed(run, f"batch_norm={str(bn).lower()}"))
    results = time_interleaved(timed, windows=windows, warmup=1)
    ms = {
        m.label: statistics.median(s) / STEPS_PER_WINDOW * 1e3 for m, (s, _) in zip(timed, results)
    }
    return {
        "data": source,
        "ms_per_step": ms,
        "ratio": ms["batch_norm=true"] / ms["batch_norm=false"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=10)
    p.add_argument("--out", type=Path, default=HERE / "results" / "batch_norm_cost.json")
    args = p.parse_args()
    load_before = os.getloadavg()
    layer = layer_costs(args.windows)
    print("one layer, forward + backward, 512x28x28x16 float32 (median ms):")
    for name, ms in layer.items():
        print(f"  {name:34s} {ms:8.1f} ms")
    step = step_costs(args.windows)
    print(f"speedrun training step, batch 512, {step['data']} (median ms per step):")
    for name, ms in step["ms_per_step"].items():
        print(f"  {name:34s} {ms:8.1f} ms")
    print(f"  batch norm costs {step['ratio']:.2f}x the step")
    figures = {"layer_ms": layer, "speedrun_step": step}
    print(runtime.save_benchmark(args.out, figures, load_before))


if __name__ == "__main__":
    main()
