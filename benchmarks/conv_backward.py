"""What the im2col convolution's written-out backward pass saves on this machine.

`conv.conv_im2col` has a hand-written VJP; `conv.im2col_autodiff` is the same forward pass
left to JAX's autodiff. This times one training step (forward, backward, Adam) of a
network with each, side by side with the windows interleaved (A B A B ...), for the
reference CNN (`cnn` preset: 3×3 same convolutions, 16/32 channels, dense 128) and the
`speedrun` preset's network (5×5 then 3×3 valid convolutions, 24/32 channels, dense 256),
both at batch 256.

Usage: python benchmarks/conv_backward.py [--windows 8] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/conv_backward/).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from functools import partial
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmnist import config as config_lib
from jaxmnist.models import cnn, conv

from benchlib.results import SMOKE_HELP, default_out, save_benchmark
from benchlib.steps import Case, median_step_ms, report

BATCH = 256
SMOKE_BATCH = 8

VARIANTS = {"autodiff": conv.im2col_autodiff, "written-out VJP": conv.conv_im2col}


def step_ms(model_cfg, windows: int, batch: int, steps_per_window: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.uniform(size=(batch, 28, 28)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, batch))
    model_cfg = dataclasses.replace(model_cfg, conv_impl="im2col")
    # One compiled call: eager initialisation would compile op by op.
    params = jax.jit(lambda k: cnn.init(k, model_cfg, (28, 28), 10))(jax.random.key(0))

    def loss(p, x, y):
        logits = cnn.apply(p, x, model_cfg)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    cases = [
        Case(label, loss, params, partial(mock.patch.dict, conv.CONV_IMPLS, im2col=fn))
        for label, fn in VARIANTS.items()
    ]
    return median_step_ms(cases, images, labels, windows=windows, steps_per_window=steps_per_window)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/conv_backward/")
    args = p.parse_args(argv)
    out = args.out or default_out("conv_backward.json", args.smoke)
    batch, windows, steps = (SMOKE_BATCH, 1, 1) if args.smoke else (BATCH, args.windows, 10)
    presets = ("speedrun",) if args.smoke else ("cnn", "speedrun")
    load_before = os.getloadavg()
    figures = {"batch": batch}
    for preset in presets:
        model_cfg = config_lib.get_preset(preset).model
        ms = step_ms(model_cfg, windows, batch, steps)
        figures[preset] = report(preset, batch, ms, "autodiff", "written-out VJP")
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
