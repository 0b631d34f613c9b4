"""One network's training step in several formulations, compiled and timed side by side.

The micro-benchmarks under `benchmarks/` that compare one way of computing a step
against another (a convolution's backward pass, a matmul's precision) time the same
thing: `steps_per_window` Adam steps in one compiled `lax.scan`, on one fixed batch
passed in as an argument (not a constant XLA could fold), the formulations' windows
interleaved (A B A B ...) so that load on the machine falls on all alike.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import optax
from jax import lax

from jaxmnist.timing import Timed, time_interleaved


class Case(NamedTuple):
    """A formulation: `loss(params, images, labels)` -> scalar, and a context that is
    active while the step is traced and compiled (to swap a function in, say)."""

    label: str
    loss: Callable[[Any, jax.Array, jax.Array], jax.Array]
    params: Any
    tracing: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def median_step_ms(
    cases: list[Case], images, labels, *, windows: int, steps_per_window: int = 10
) -> dict[str, float]:
    """Median milliseconds per training step of each case, by label."""
    opt = optax.adam(1e-3)
    timed = []
    for case in cases:

        def steps(p, s, x, y, loss=case.loss):
            def body(carry, _):
                p, s = carry
                updates, s = opt.update(jax.grad(loss)(p, x, y), s, p)
                return (optax.apply_updates(p, updates), s), None

            return lax.scan(body, (p, s), None, length=steps_per_window)[0]

        state = opt.init(case.params)
        with case.tracing():
            compiled = jax.jit(steps).lower(case.params, state, images, labels).compile()
        timed.append(Timed(partial(compiled, case.params, state, images, labels), case.label))
    results = time_interleaved(timed, windows=windows, warmup=1)
    return {
        m.label: statistics.median(s) / steps_per_window * 1e3 for m, (s, _) in zip(timed, results)
    }


def report(network: str, batch: int, ms: dict[str, float], base: str, new: str) -> dict:
    """Prints one network's medians (`median_step_ms`), each against case `base`, and
    returns its figures for the JSON: the medians and `new`'s speed-up over `base`."""
    print(f"{network} network, one training step at batch {batch} (median ms):")
    for label, value in ms.items():
        print(f"  {label:16s} {value:7.1f} ms  {ms[base] / value:5.2f}x as fast")
    return {"ms_per_step": ms, "speedup": ms[base] / ms[new]}
