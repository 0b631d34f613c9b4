"""What the first block's own kernel saves in inference, preset by preset.

A CNN preset's first block (one input channel, float32, ReLU) is, without a gradient,
one call of jaxmnist's kernel that convolves, pools, adds the bias and rectifies
(`onednn.first_block`), instead of oneDNN's convolution and then oneDNN's pooling with
the bias and ReLU (`conv.max_pool_bias_relu`), which write and read the convolution's
full-size map in between. This times, side by side in one process with the windows
interleaved (A B A B ...), on images of the test set's size in batches of the CNN
presets' evaluation batch:

- the first block alone, both ways;
- the whole network's evaluation forward pass (every member of the preset's population,
  as `jaxmnist train` evaluates after each epoch): the first block fused, or its parts.

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
PRESETS = ("cnn", "speedrun", "record", "fashion_record")
SMOKE = {"images": 16, "batch": 8, "windows": 1, "presets": ("speedrun",)}

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


def measure(preset: str, images: int, batch: int, windows: int) -> dict:
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

    block = {v: _compiled(v, block_only, pixels, w, b) for v in VARIANTS}
    network = {
        v: _compiled(v, partial(_network, model_cfg=model_cfg), params, pixels[..., 0])
        for v in VARIANTS
    }
    block_ms, network_ms = _median_ms(block, windows), _median_ms(network, windows)
    result = {"members": members, "images": images, "batch": batch}
    for name, ms in (("first_block", block_ms), ("evaluation", network_ms)):
        result[name] = {"ms": ms, "speedup": ms["parts"] / ms["first block"]}
        print(
            f"{preset:15s} {name:12s} parts {ms['parts']:8.1f} ms  first block "
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
    images, batch, windows = IMAGES, CNN_EVAL_BATCH_SIZE, args.windows
    presets = tuple(args.presets.split(","))
    if args.smoke:
        images, batch, windows, presets = (
            SMOKE[k] for k in ("images", "batch", "windows", "presets")
        )
    load_before = os.getloadavg()
    figures = {"windows": windows, "isa": os.environ.get("ONEDNN_MAX_CPU_ISA")}
    for preset in presets:
        figures[preset] = measure(preset, images, batch, windows)
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
