"""What pooling through oneDNN saves beside oneDNN's convolution, preset by preset.

With `model.conv_impl=onednn` (the default on a one-device CPU), a CNN's max-pooling is
differentiated through oneDNN's own forward and backward calls (`conv.max_pool`): left
to XLA, the pooling fuses into each of its consumers (the activation, the activation's
gradient, the pooling's own gradient) and each recomputes it from the convolution's
full-size output. This times one training step (forward, backward, Adam) of each
preset's network with the pooling left to XLA and with oneDNN's, both beside oneDNN's
convolution, the windows interleaved (A B A B ...), at batch 256. Evaluation (no
gradient) keeps XLA's pooling in both, so it is not timed here.

Usage: python benchmarks/onednn_pool.py [--windows 8] [--presets cnn,speedrun,...] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/onednn_pool/).
Needs the jaxmnist-onednn package (`pip install ./native`).
"""

from __future__ import annotations

import argparse
import contextlib
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
from jaxmnist.models import cnn, conv, onednn

from benchlib.results import SMOKE_HELP, default_out, save_benchmark
from benchlib.steps import Case, median_step_ms, report

BATCH = 256
SMOKE_BATCH = 8
# Each preset's network; `speedrun+bn` is the speedrun network with batch norm.
PRESETS = ("cnn", "speedrun", "speedrun+bn", "record", "fashion_record")


def _xla_pool(x, size, edges):
    return conv.max_pool(x, size, "xla")


VARIANTS = {
    "XLA pooling": partial(mock.patch.object, conv, "_onednn_window_max", _xla_pool),
    "oneDNN pooling": contextlib.nullcontext,  # nothing swapped: the code as it runs
}


def model_config(name: str):
    preset, _, extra = name.partition("+")
    cfg = config_lib.get_preset(preset).model
    return dataclasses.replace(cfg, conv_impl="onednn", batch_norm=extra == "bn")


def step_ms(model_cfg, windows: int, batch: int, steps_per_window: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.uniform(size=(batch, 28, 28)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, batch))
    # One compiled call: eager initialisation would compile op by op.
    params = jax.jit(lambda k: cnn.init(k, model_cfg, (28, 28), 10))(jax.random.key(0))

    def loss(p, x, y):
        logits, _ = cnn.apply(p, x, model_cfg, key=jax.random.key(1), train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    cases = [Case(label, loss, params, tracing) for label, tracing in VARIANTS.items()]
    return median_step_ms(cases, images, labels, windows=windows, steps_per_window=steps_per_window)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/onednn_pool/")
    args = p.parse_args(argv)
    if not onednn.available():
        p.error(f"oneDNN is not available here: {onednn.unavailable_reason()}")
    out = args.out or default_out("onednn_pool.json", args.smoke)
    batch, windows, steps = (SMOKE_BATCH, 1, 1) if args.smoke else (BATCH, args.windows, 10)
    presets = ("speedrun+bn",) if args.smoke else tuple(args.presets.split(","))
    load_before = os.getloadavg()
    figures = {"batch": batch, "windows": windows, "steps_per_window": steps}
    for preset in presets:
        ms = step_ms(model_config(preset), windows, batch, steps)
        figures[preset] = report(preset, batch, ms, "XLA pooling", "oneDNN pooling")
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
