"""What picking pixels and examples costs inside the compiled epoch, per formulation.

Two operations of every augmented CNN step move data rather than compute:

- the random translation (`augment.random_translate`): on the CPU each image's crop is a
  slice of its own (a `vmap` of `dynamic_slice`, one gather); on other backends each
  image selects its rows, then its columns, among the 2·max_shift + 1 shifted copies of
  the batch, because a TPU runs that gather as a loop over the images;
- the affine warp (`augment.warp_images`, as `record` draws it): on the CPU bilinear
  sampling gathers each output pixel's four neighbours (`map_coordinates`); elsewhere the
  same weighted sums are written dense (`bilinear_dense`), for the same reason;
- the batch gather (`step.make_train_steps`): the batch's examples taken from the
  training images on the device, as (N, H, W) uint8 or as rows of the flattened (N, H·W)
  images, which a TPU lays out with N outermost.

Each is timed on this machine's default backend, both ways side by side, inside a
`lax.scan` of `--steps` steps as in the epoch (random keys and batch indices per step), so
that a call's launch does not count; the two translations are checked to agree exactly,
the two warps to within one grey level (float rounding before the uint8 round).
Figures are microseconds per step, medians of `--repeats` calls.

Usage: python benchmarks/augment_gathers.py [--batch 256] [--steps 50] [--repeats 7] [--smoke]
Prints a table and writes JSON (`--out`, default a new record in
benchmarks/results/augment_gathers/, whose name says the machine: the CPU or the accelerator).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist.data.augment import random_translate, random_warp

from benchlib.results import SMOKE_HELP, default_out, save_benchmark

FORMULATIONS = {"gather": "cpu", "selects": "tpu"}  # random_translate's `backend` argument
WARPS = {"gather": "cpu", "dense": "tpu"}  # and random_warp's
RECORD_WARP = {"max_shift": 2, "max_rotation": 10.0, "max_scale": 0.1, "max_shear": 10.0}


def per_step_us(fn, args, steps: int, repeats: int) -> float:
    """Median microseconds per scanned step of `fn(*args)` (compiled and run once first)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) / steps * 1e6


def translation(batch: np.ndarray, max_shift: int, backend: str, steps: int):
    """A compiled scan of `steps` translations of `batch`, each with its own key."""

    def run(key, images):
        def body(total, k):
            moved = random_translate(k, images, max_shift, backend)
            return total + moved.astype(jnp.int32).sum(), None

        return jax.lax.scan(body, 0, jax.random.split(key, steps))[0]

    return jax.jit(run)


def warp(batch: np.ndarray, backend: str, steps: int):
    """A compiled scan of `steps` affine warps of `batch` as `record` draws them."""

    def run(key, images):
        def body(total, k):
            moved = random_warp(k, images, **RECORD_WARP, backend=backend)
            return total + moved.astype(jnp.int32).sum(), None

        return jax.lax.scan(body, 0, jax.random.split(key, steps))[0]

    return jax.jit(run)


def batch_gather(shape: tuple[int, ...], flat: bool):
    """A compiled scan that gathers one batch per row of `indices` from `data`, with
    `flat` from its images flattened inside the program, as the training step does."""

    def run(data, indices):
        source = data.reshape(len(data), -1) if flat else data

        def body(total, idx):
            batch = source[idx].reshape(len(idx), *shape)
            return total + batch.astype(jnp.int32).sum(), None

        return jax.lax.scan(body, 0, indices)[0]

    return jax.jit(run)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50, help="steps per compiled scan")
    p.add_argument("--repeats", type=int, default=7, help="timed calls of each (median)")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    backend = jax.default_backend()
    out = args.out or default_out("augment_gathers.json", args.smoke)
    batch, steps, repeats = args.batch, args.steps, args.repeats
    examples, image = 60000, (28, 28)
    if args.smoke:
        batch, steps, repeats, examples = 8, 3, 1, 64
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.integers(0, 256, (batch, *image), np.uint8))
    key = jax.random.key(0)

    figures: dict = {"backend": backend, "batch": batch, "steps": steps, "translation": {}}
    print(f"microseconds per step, {backend}, batch {batch}, {steps} steps per call")
    for max_shift in (1, 2):
        row = {}
        for label, formulation in FORMULATIONS.items():
            fn = translation(images, max_shift, formulation, steps)
            row[label] = per_step_us(fn, (key, images), steps, repeats)
        a, b = (random_translate(key, images, max_shift, f) for f in FORMULATIONS.values())
        row["equal"] = bool(np.array_equal(a, b))
        figures["translation"][f"max_shift_{max_shift}"] = row
        print(
            f"  translation, max_shift {max_shift}: gather {row['gather']:9.1f}, "
            f"selects {row['selects']:9.1f} (equal: {row['equal']})"
        )

    row = {label: per_step_us(warp(images, f, steps), (key, images), steps, repeats)
           for label, f in WARPS.items()}  # fmt: skip
    a, b = (np.asarray(random_warp(key, images, **RECORD_WARP, backend=f), np.int32)
            for f in WARPS.values())  # fmt: skip
    row["max_difference"] = int(np.abs(a - b).max())
    figures["warp"] = row
    print(
        f"  affine warp as record draws it: gather {row['gather']:9.1f}, dense "
        f"{row['dense']:9.1f} (largest difference: {row['max_difference']} grey levels)"
    )

    data = jnp.asarray(rng.integers(0, 256, (examples, *image), np.uint8))
    indices = jax.random.randint(jax.random.key(1), (steps, batch), 0, examples)
    gathers = {}
    for label, flat in (("images", False), ("rows", True)):
        gathers[label] = per_step_us(batch_gather(image, flat), (data, indices), steps, repeats)
    figures["batch_gather"] = gathers
    print(
        f"  batch of {batch} from {examples} examples: (N, 28, 28) {gathers['images']:9.1f}, "
        f"(N, 784) rows {gathers['rows']:9.1f}"
    )
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
