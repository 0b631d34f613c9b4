"""What the first block's own kernels save in inference and in training, preset by preset.

A CNN preset's first block (one input channel, float32, ReLU) is one call of jaxmnist's
kernel that convolves, pools, adds the bias and rectifies (`onednn.first_block`;
`first_block_forward` in training, with `first_block_backward` for the weights' and
bias's gradient), instead of oneDNN's convolution and then oneDNN's pooling with the
bias and ReLU (`conv.max_pool_bias_relu`), which write and read the convolution's
full-size map in between (and, in training, its gradient). This times, side by side in
one process with the windows interleaved (A B A B ...):

- on images of the test set's size in batches of the CNN presets' evaluation batch, the
  first block alone, both ways, and the whole network's evaluation forward pass (every
  member of the preset's population, as `jaxmnist train` evaluates after each epoch);
- on `STEPS` batches of the preset's training batch, the first block's forward pass and
  gradient alone (one member), and the whole network's gradient (every member: the
  training step without the optimizer's update).

`--isa AVX2` (or SSE41) caps the instruction sets of both oneDNN's kernels and
jaxmnist's (`$ONEDNN_MAX_CPU_ISA`), to see what a CPU without AVX-512 gets.

Usage: python benchmarks/first_block.py [--windows 7] [--presets cnn,...] [--isa AVX2]
Prints a table and writes JSON (`--out`, default benchmarks/results/first_block.json).
Needs the `onednn` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
from functools import partial
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist.config import CNN_EVAL_BATCH_SIZE
from jaxmnist.models import cnn, conv, onednn

from benchlib.results import SMOKE_HELP, default_out, save_benchmark

IMAGES = 10_000  # the test set's size
STEPS = 20  # training batches timed per window
PRESETS = ("cnn", "speedrun", "record", "fashion_record")
SMOKE = {"images": 16, "batch": 8, "windows": 1, "presets": ("speedrun",), "steps": 2}

VARIANTS = {
    "parts": partial(mock.patch.object, onednn, "first_block_supported", lambda *a: False),
    "first block": contextlib.nullcontext,  # nothing swapped: the code as it runs
}


def _block(x, w, b, padding):
    return conv.conv_pool_bias_relu(x, w, b, "onednn", padding)


def _network(params, batches, model_cfg):
    def forward(images):
        logits = jax.vmap(cnn.apply, (0, None, None))(params, images, model_cfg)
        return logits.sum()

    return jax.lax.map(forward, batches).sum()


def _network_gradient(params, batches, labels, model_cfg):
    """Every member's gradient of its mean cross-entropy, batch after batch."""

    def loss(params, images, labels, key):
        logits, _ = cnn.apply(params, images, model_cfg, key, train=True)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1).mean()

    def step(total, batch):
        images, labels = batch
        keys = jax.random.split(jax.random.key(1), jax.tree.leaves(params)[0].shape[0])
        grads = jax.vmap(jax.grad(loss), (0, None, None, 0))(params, images, labels, keys)
        return total + sum(g.sum() for g in jax.tree.leaves(grads)), None

    return jax.lax.scan(step, 0.0, (batches, labels))[0]


def _compiled(variant: str, fn, *args):
    with VARIANTS[variant]():  # a function of its own: jit would reuse the other's trace
        lowered = jax.jit(lambda *a: fn(*a)).lower(*args)
    fused = "jaxmnist_first_block" in lowered.as_text()
    compiled = lowered.compile()
    assert fused == (variant == "first block"), f"{variant}: the first block fused is {fused}"
    return lambda: jax.block_until_ready(compiled(*args))


def _median_ms(calls: dict, windows: int) -> dict[str, float]:
    """Each call once to warm up, then `windows` rounds taking turns; medians in ms."""
    for call in calls.values():
        call()
    times = {name: [] for name in calls}
    for _ in range(windows):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(1e3 * (time.perf_counter() - start))
    return {name: float(np.median(t)) for name, t in times.items()}


def measure(preset: str, images: int, batch: int, windows: int, steps: int) -> dict:
    cfg = config_lib.get_preset(preset)
    model_cfg = dataclasses.replace(cfg.model, conv_impl="onednn")
    members = cfg.train.seeds
    rng = np.random.default_rng(0)
    pixels = jnp.asarray(rng.uniform(size=(images // batch, batch, 28, 28, 1)), jnp.float32)
    keys = jax.random.split(jax.random.key(0), members)
    params = jax.jit(jax.vmap(lambda k: cnn.init(k, model_cfg, (28, 28), 10)))(keys)
    first = params["conv"][0]
    w, b = first["w"][0], first["b"][0]

    def block_only(pixels, w, b):
        return jax.lax.map(lambda x: _block(x, w, b, model_cfg.padding).sum(), pixels).sum()

    def block_gradient(pixels, w, b):
        def one(total, x):
            loss = lambda w, b: jnp.tanh(_block(x, w, b, model_cfg.padding)).sum()
            return total + sum(g.sum() for g in jax.grad(loss, (0, 1))(w, b)), None

        return jax.lax.scan(one, 0.0, pixels)[0]

    train_batch = batch if images < IMAGES else cfg.train.batch_size  # smaller when smoke
    train_pixels = jnp.asarray(rng.uniform(size=(steps, train_batch, 28, 28, 1)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, size=(steps, train_batch)), jnp.int32)
    network_gradient = partial(_network_gradient, model_cfg=model_cfg)
    timed = {
        "first_block": {v: _compiled(v, block_only, pixels, w, b) for v in VARIANTS},
        "evaluation": {
            v: _compiled(v, partial(_network, model_cfg=model_cfg), params, pixels[..., 0])
            for v in VARIANTS
        },
        "first_block_training": {
            v: _compiled(v, block_gradient, train_pixels, w, b) for v in VARIANTS
        },
        "training_gradient": {
            v: _compiled(v, network_gradient, params, train_pixels[..., 0], labels)
            for v in VARIANTS
        },
    }
    result = {
        "members": members, "images": images, "batch": batch,
        "training_batches": steps, "training_batch": train_batch,
    }  # fmt: skip
    for name, calls in timed.items():
        ms = _median_ms(calls, windows)
        result[name] = {"ms": ms, "speedup": ms["parts"] / ms["first block"]}
        print(
            f"{preset:15s} {name:20s} parts {ms['parts']:8.1f} ms  first block "
            f"{ms['first block']:8.1f} ms  {ms['parts'] / ms['first block']:5.2f}x"
        )
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=7)
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated")
    p.add_argument("--isa", help="cap the instruction sets ($ONEDNN_MAX_CPU_ISA), e.g. AVX2")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/first_block.json")
    args = p.parse_args(argv)
    if args.isa:  # before the library loads: both oneDNN and jaxmnist's kernel read it once
        os.environ["ONEDNN_MAX_CPU_ISA"] = args.isa
    if not onednn.available():
        p.error(f"oneDNN is not available here: {onednn.unavailable_reason()}")
    out = args.out or default_out("first_block.json", args.smoke)
    images, batch, windows, steps = IMAGES, CNN_EVAL_BATCH_SIZE, args.windows, STEPS
    presets = tuple(args.presets.split(","))
    if args.smoke:
        images, batch, windows, presets, steps = (
            SMOKE[k] for k in ("images", "batch", "windows", "presets", "steps")
        )
    load_before = os.getloadavg()
    figures = {"windows": windows, "isa": os.environ.get("ONEDNN_MAX_CPU_ISA")}
    for preset in presets:
        figures[preset] = measure(preset, images, batch, windows, steps)
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
