"""The device's own limit: a large square matmul's FLOP/s, measured in a given dtype.

MFU is the achieved FLOP/s of training divided by a peak. A datasheet peak is
unknown for most CPUs and rarely reached even on accelerators, so the peak is
measured in the same run, on the same device and in the same dtype as the
training step: `C = A @ B` with A, B (n, n) in that dtype, by the models' own
matmul (`layers.matmul`, which accumulates bfloat16 in float32), 2 n^3 FLOPs per
product. Each timed window runs enough chained products to last about
`min_window_seconds`; the figure is the median over the windows, like every
other timed figure (`jaxmnist.timing`). `jaxmnist bench` and `jaxmnist profile` both
divide by it.
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist import timing
from jaxmnist.models.layers import matmul

# A side long enough to be compute-bound on each backend yet quick to run:
# 2048^3 is 17 GFLOP, long enough to time on a CPU; accelerators need more. `--quick`
# halves the CPU's side (an eighth of the work, near the same rate) but keeps the
# accelerators': a small product leaves a TPU or GPU mostly idle, and a peak taken from
# it would inflate every MFU of the run many times over.
DEFAULT_SIZE = {"cpu": 2048}
QUICK_SIZE = {"cpu": 1024}
ACCELERATOR_SIZE = 8192


def default_size(backend: str, quick: bool = False) -> int:
    """The side of the peak's matmul on `backend`, for a full or a `quick` measurement."""
    return (QUICK_SIZE if quick else DEFAULT_SIZE).get(backend, ACCELERATOR_SIZE)


def measure_matmul_peak(
    dtype: str,
    n: int,
    *,
    windows: int = 5,
    warmup: int = 1,
    min_window_seconds: float = 0.2,
) -> dict:
    """Median FLOP/s of (n, n) @ (n, n) products in `dtype` on the default device.

    One window is one compiled loop of `reps` chained products `x <- x @ q`
    (`operands`); chaining makes the products run one after another on any backend,
    and one call per window keeps dispatch out of the figure. Returns a JSON-ready
    dict: dtype, matmul_shape [n, n, n], flops_per_matmul, matmuls_per_window,
    compile_seconds, window_seconds and flops_per_second (median, min, max,
    rel_spread).
    """
    x, q = jax.block_until_ready(operands(jax.random.key(0), n, dtype))

    def chain(x, q, reps):
        return jax.lax.fori_loop(0, reps, lambda _, x: matmul(x, q), x)

    one = jax.device_put(np.int32(1))
    start = time.perf_counter()
    run_chain = jax.jit(chain).lower(x, q, one).compile()
    compile_seconds = time.perf_counter() - start

    jax.block_until_ready(run_chain(x, q, one))  # first call: allocations, thread-pool start
    start = time.perf_counter()
    jax.block_until_ready(run_chain(x, q, one))
    once = max(time.perf_counter() - start, 1e-6)
    reps = max(1, math.ceil(min_window_seconds / once))
    reps_on_device = jax.device_put(np.int32(reps))

    seconds, out = timing.time_windows(
        lambda: run_chain(x, q, reps_on_device),
        windows=windows,
        warmup=warmup,
        label=f"matmul peak {dtype}",
    )
    if not bool(jnp.isfinite(out).all()):
        raise RuntimeError(f"matmul peak {dtype}: the chained product is not finite")
    flops = 2 * n**3
    return {
        "dtype": dtype,
        "matmul_shape": [n, n, n],
        "flops_per_matmul": flops,
        "matmuls_per_window": reps,
        "compile_seconds": compile_seconds,
        "window_seconds": seconds,
        "flops_per_second": invert(timing.stats(seconds), flops * reps),
    }


@functools.partial(jax.jit, static_argnums=(1, 2))
def operands(key: jax.Array, n: int, dtype: str) -> tuple[jax.Array, jax.Array]:
    """The peak's (n, n) operands in `dtype`: x random normal, q a random permutation
    matrix, stored dense.

    `x @ q` only reorders x's columns, so a chain of products neither overflows nor
    decays into slow denormals, at the full cost of dense products. An orthogonal q from
    a QR factorisation would do as much, but a TPU's compiler takes longer over the QR
    of an accelerator-sized matrix than over everything else a profile compiles.
    """
    kx, kq = jax.random.split(key)
    q = jax.nn.one_hot(jax.random.permutation(kq, n), n, dtype=dtype)
    return jax.random.normal(kx, (n, n), jnp.float32).astype(dtype), q


def invert(time_stats: dict, work: float) -> dict:
    """Stats of the rate `work / seconds`, given `timing.stats` of the seconds."""
    rate = {
        "median": work / time_stats["median"],
        "min": work / time_stats["max"],
        "max": work / time_stats["min"],
    }
    rate["rel_spread"] = (rate["max"] - rate["min"]) / rate["median"]
    return rate
