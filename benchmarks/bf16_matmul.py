"""What accumulating bfloat16 matmuls in float32 gains on this machine.

jaxmnist's bfloat16 matmuls (`layers.matmul`, the im2col convolution's `layers.wide_dot`)
read bfloat16 operands and ask XLA for a float32 result (`preferred_element_type`), then
round it to bfloat16. Asking for a bfloat16 result instead (plain `a @ b`) is the same
arithmetic on most backends, but on CPU XLA widens such a dot's operands to float32 and
runs it at float32's rate, while it hands the mixed one to YNNPACK's bfloat16 kernels
where the CPU has them (AVX512-BF16 on the development CPU). This measures, side by
side in one process:

- the rate of chained n³ matmuls (n = 2048 on CPU; larger on accelerators, as for
  `jaxmnist bench`'s peak): float32, bfloat16 -> bfloat16, bfloat16 -> float32;
- one training step (forward, backward, Adam; windows interleaved) of the `codelab`
  and `tpu101` MLPs and the reference CNN (`cnn` preset), each at its preset's batch
  size: float32, bfloat16 with bfloat16-result dots, bfloat16 as jaxmnist runs it.

Usage: python benchmarks/bf16_matmul.py [--windows 12] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/bf16_matmul/).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmnist import config as config_lib
from jaxmnist.models import cnn, conv, get_model, mlp
from jaxmnist.profiling import peak

from benchlib.results import SMOKE_HELP, default_out, save_benchmark
from benchlib.steps import Case, median_step_ms

# Steps per timed window: enough for a window to last a good fraction of a second on a CPU.
PRESETS = {"codelab": 60, "tpu101": 200, "cnn": 8}


def _plain(a, b):
    return a @ b


@contextlib.contextmanager
def bf16_results():
    """Every model matmul as a plain `a @ b` (a bfloat16 result in bfloat16) while a
    program is traced."""
    with contextlib.ExitStack() as stack:
        for module, name in (
            (mlp, "matmul"),
            (cnn, "matmul"),
            (conv, "wide_dot"),
            (peak, "matmul"),
        ):
            stack.enter_context(mock.patch.object(module, name, _plain))
        yield


def peaks(n: int, smoke: bool = False) -> dict[str, float]:
    """GFLOP/s of chained n³ products (`smoke`: one short window)."""
    short = {"windows": 1, "warmup": 0, "min_window_seconds": 0.0} if smoke else {}

    def rate(dtype):
        report = peak.measure_matmul_peak(dtype, n, **short)
        return report["flops_per_second"]["median"] / 1e9

    out = {"float32": rate("float32"), "bfloat16 -> float32 (jaxmnist)": rate("bfloat16")}
    with bf16_results():
        out["bfloat16 -> bfloat16"] = rate("bfloat16")
    return out


def step_ms(
    preset: str, windows: int, steps_per_window: int, batch: int | None = None
) -> dict[str, float]:
    """One training step of `preset`'s model in each dtype, at `batch` (default the
    preset's batch size)."""
    cfg = config_lib.get_preset(preset)
    batch = batch or cfg.train.batch_size
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.uniform(size=(batch, 28, 28)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, batch))
    model = get_model(cfg.model.name)
    cases = []
    for label, dtype, tracing in (
        ("float32", "float32", contextlib.nullcontext),
        ("bfloat16, bfloat16-result dots", "bfloat16", bf16_results),
        ("bfloat16, float32 accumulation", "bfloat16", contextlib.nullcontext),
    ):
        model_cfg = dataclasses.replace(cfg.model, dtype=dtype)

        def loss(p, x, y, model_cfg=model_cfg):
            logits = model.apply(p, x, model_cfg)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        # One compiled call: eager initialisation would compile op by op.
        init = jax.jit(lambda k, model_cfg=model_cfg: model.init(k, model_cfg, (28, 28), 10))
        params = init(jax.random.key(0))
        cases.append(Case(label, loss, params, tracing))
    ms = median_step_ms(cases, images, labels, windows=windows, steps_per_window=steps_per_window)
    return {"batch": batch, "steps_per_window": steps_per_window, "ms_per_step": ms}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=12)
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/bf16_matmul/")
    args = p.parse_args(argv)
    out = args.out or default_out("bf16_matmul.json", args.smoke)
    load_before = os.getloadavg()
    n = 64 if args.smoke else peak.default_size(jax.default_backend())  # 2048 on CPU
    figures = {"matmul_size": n, "matmul_gflops": peaks(n, args.smoke)}
    print(f"{n}³ matmul (median GFLOP/s):")
    for label, value in figures["matmul_gflops"].items():
        print(f"  {label:32s} {value:7.1f}")
    presets, windows, batch = ({"tpu101": 1}, 1, 8) if args.smoke else (PRESETS, args.windows, None)
    for preset, steps in presets.items():
        figures[preset] = step_ms(preset, windows, steps, batch)
        ms = figures[preset]["ms_per_step"]
        base = ms["float32"]
        print(f"{preset}, one training step at batch {figures[preset]['batch']} (median ms):")
        for label, value in ms.items():
            print(f"  {label:32s} {value:7.2f} ms  {base / value:5.2f}x float32's rate")
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
