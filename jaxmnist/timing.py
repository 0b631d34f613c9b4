"""Timed windows: an untimed warm-up, then repeated synchronised windows, with guards.

What `jaxmnist bench` times, and the device's matmul peak (`profiling.peak`), are timed
this way, as are some scripts under benchmarks/; the tests count compilations with
`compile_count`.

A measurement runs `warmup` untimed windows (they compile, fill caches and
reach steady state), then `windows` timed ones. Work inside a window is
enqueued asynchronously; `jax.block_until_ready` is called only at its edges:
the clock starts after the previous window's results (and this window's untimed
`prepare`) are ready, and stops when the window's last result is. Figures are
the median over the timed windows, with the min, max and relative spread
((max - min) / median) beside them. Measurements compared side by side can be
interleaved, window by window (`time_interleaved`).

Hidden costs fail loudly inside timed windows. Every JAX compilation (tracing,
lowering to MLIR or a backend compile, each reported through `jax.monitoring`)
raises `RecompilationError`. Implicit transfers are refused by
`jax.transfer_guard`; a `Guard` says which directions are refused, because the
un-jitted step cannot run without uploading its Python-scalar constants (see
`bench.modes`). Explicit `jax.device_put` is always allowed by a transfer guard.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

# The events jax._src.dispatch records for every trace, lowering and backend
# compile (the same ones `jax.log_compiles` reports). A persistent-cache hit
# still traces and lowers, so it is counted too.
COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    }
)


class RecompilationError(RuntimeError):
    """JAX compiled something inside a timed window: a bug in the benchmark."""


class _CompileCounter:
    """Counts compile events process-wide; registered once, never removed."""

    def __init__(self) -> None:
        self.count = 0
        self.registered = False

    def __call__(self, event: str, duration_secs: float, **kwargs) -> None:
        if event in COMPILE_EVENTS:
            self.count += 1

    def ensure_registered(self) -> None:
        if not self.registered:
            jax.monitoring.register_event_duration_secs_listener(self)
            self.registered = True


_COUNTER = _CompileCounter()


def compile_count() -> int:
    """Compile events seen so far in this process (starts counting on first call)."""
    _COUNTER.ensure_registered()
    return _COUNTER.count


class Guard(NamedTuple):
    """Transfer-guard level ("allow" or "disallow") for each direction of implicit copy."""

    host_to_device: str = "disallow"
    device_to_host: str = "disallow"
    device_to_device: str = "disallow"

    def as_dict(self) -> dict:
        return self._asdict()


STRICT = Guard()  # every implicit copy refused


@contextlib.contextmanager
def no_compiles(label: str):
    """Raises `RecompilationError` if JAX compiles anything inside the block."""
    before = compile_count()
    yield
    compiled = compile_count() - before
    if compiled:
        raise RecompilationError(
            f"{label}: {compiled} JAX compile event(s) inside a timed window; every program "
            "must be compiled during warm-up (same shapes, dtypes and static arguments)"
        )


@contextlib.contextmanager
def guarded(label: str, guard: Guard = STRICT):
    """The context of a timed window: no compiles, and the given transfer guards."""
    with (
        jax.transfer_guard_host_to_device(guard.host_to_device),
        jax.transfer_guard_device_to_host(guard.device_to_host),
        jax.transfer_guard_device_to_device(guard.device_to_device),
        no_compiles(label),
    ):
        yield


def stats(values) -> dict:
    """median, min, max and rel_spread = (max - min) / median of a few numbers."""
    v = np.asarray(values, np.float64)
    median = float(np.median(v))
    return {
        "median": median,
        "min": float(v.min()),
        "max": float(v.max()),
        "rel_spread": float((v.max() - v.min()) / median) if median else 0.0,
    }


class Timed(NamedTuple):
    """One measurement's window: `run()` enqueues it and returns what to wait for;
    `prepare(i)` (untimed, may return arrays to wait for) readies window `i`."""

    run: Callable[[], Any]
    label: str
    prepare: Callable[[int], Any] | None = None
    guard: Guard = STRICT


def time_windows(
    run: Callable[[], Any],
    *,
    windows: int,
    warmup: int,
    label: str,
    prepare: Callable[[int], Any] | None = None,
    guard: Guard = STRICT,
) -> tuple[list[float], Any]:
    """Runs `warmup + windows` windows; returns the timed windows' seconds and the
    last window's output.

    `prepare(i)` (untimed, may return arrays to wait for) readies window `i`;
    `run()` enqueues one window of work and returns what to wait for.
    """
    return time_interleaved([Timed(run, label, prepare, guard)], windows=windows, warmup=warmup)[0]


def time_interleaved(
    measurements: list[Timed], *, windows: int, warmup: int
) -> list[tuple[list[float], Any]]:
    """Window i of every measurement, in the order given, then window i + 1 (A B A B ...),
    so that a load that comes and goes on the machine falls on all of them alike.

    Returns, per measurement, its timed windows' seconds and its last window's output.
    """
    if windows < 1 or warmup < 0:
        raise ValueError(f"need windows >= 1 and warmup >= 0, got {windows}, {warmup}")
    global _window_compiles
    seconds: list[list[float]] = [[] for _ in measurements]
    outs: list[Any] = [None] * len(measurements)
    _window_compiles = 0
    for i in range(warmup + windows):
        for j, m in enumerate(measurements):
            jax.block_until_ready(m.prepare(i) if m.prepare is not None else None)
            if i < warmup:
                outs[j] = jax.block_until_ready(m.run())
                continue
            before = compile_count()
            try:
                with guarded(m.label, m.guard):
                    start = time.perf_counter()
                    outs[j] = jax.block_until_ready(m.run())
                    seconds[j].append(time.perf_counter() - start)
            finally:
                _window_compiles += compile_count() - before
    return list(zip(seconds, outs))


_window_compiles = 0


def last_window_compiles() -> int:
    """JAX compiles counted inside the timed windows of the last `time_windows` or
    `time_interleaved` call
    (0 whenever it returned: `guarded` raises on the first)."""
    return _window_compiles
