"""Capturing a `jax.profiler` trace of N steady training steps, and reading it back.

`capture` runs a population's compiled `train_steps` for N steps once untraced
(the warm-up: the programs are compiled already, this warms caches and thread
pools) and once under `jax.profiler.trace`, inside a `TraceAnnotation` that marks
the timed window, with one `block_until_ready` at its end. Without a given N it
warms up `MIN_STEPS` and traces as many steps as one of a run loop's calls holds
(`call_steps`). JAX writes
`plugins/profile/<time>/<host>.xplane.pb` (TensorBoard's profile plugin reads it)
and `perfetto_trace.json.gz` (for ui.perfetto.dev) under the folder given.

`read_ops` opens the XSpace with JAX's own reader (`jax.profiler.ProfileData`)
and keeps the events of operations: those named by an instruction of the step's
HLO (a GPU kernel by its `hlo_op`, a TPU's by the instruction it writes out whole) and
a device's memory copies. Where a device plane holds operations (GPU, TPU) only device
planes count, so that a host's launch of a kernel is not taken for the kernel; on the
CPU the operations are the host threads' events. A device's line of asynchronous
operations (a TPU's "Async XLA Ops") times a copy from its start to its done while the
device runs other work: its events are flagged `in_flight`, and the table counts them
only where no other operation runs (`breakdown.attribute`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import NamedTuple

import jax

from jaxmnist.profiling.classify import TRANSFER, OpEvent
from jaxmnist.training import pacing

WINDOW = "jaxmnist.profile.steps"  # the TraceAnnotation around the timed calls
# A device's line of asynchronous operations in flight (a TPU's "Async XLA Ops": a copy
# from its start to its done, beside the line of the operations the device runs).
ASYNC_LINE = "Async"


class Capture(NamedTuple):
    """A traced window of `steps` training steps in `calls` calls."""

    steps: int
    calls: int
    wall_seconds: float  # perf_counter around the calls, to their last result
    folder: Path  # plugins/profile/<time>/
    xplane: Path  # <host>.xplane.pb
    perfetto: Path | None  # perfetto_trace.json.gz


MIN_STEPS = 20  # the fewest steps a profile traces unless told otherwise, and its warm-up


def call_steps(seconds_per_step: float, steps_per_epoch: int) -> int:
    """The steps to trace when none are given: those of one of a run loop's calls (as
    many as fill `pacing.TARGET_SECONDS`, at most an epoch), and at least `MIN_STEPS`.
    A run's calls are that long, so a call's launch and wait take the share of a step's
    time in the profile that they take in a run; on an accelerator a handful of steps
    in one call would show mostly launch and wait."""
    fill = math.ceil(pacing.TARGET_SECONDS / max(seconds_per_step, 1e-9))
    return max(MIN_STEPS, min(steps_per_epoch, fill))


def step_ranges(num_steps: int, steps_per_epoch: int) -> list[tuple[int, int]]:
    """The calls that run `num_steps` steps: ranges of one epoch's plan, each as long as
    the epoch allows (a run's loop makes calls of an epoch or less)."""
    ranges, left = [], num_steps
    while left > 0:
        n = min(left, steps_per_epoch)
        ranges.append((0, n))
        left -= n
    return ranges


def capture(
    population, states, data, num_steps: int | None, steps_per_epoch: int, out_dir
) -> Capture:
    """Traces `num_steps` steps of `population` (a `training.population.Population`, its
    programs compiled) from `states` (donated) on `data` (`step.TrainData`) into `out_dir`,
    after as many untraced (`MIN_STEPS` when `num_steps` is None: then as many are traced
    as `call_steps` chooses from the untraced steps' speed)."""
    out_dir = Path(out_dir)
    plans = population.plan_epoch(0, data=data)

    def run(states, metrics, ranges):
        for start, stop in ranges:
            states, metrics = population.train_steps(states, metrics, plans, data, start, stop)
        return jax.block_until_ready((states, metrics))

    warm = num_steps or MIN_STEPS
    start = time.perf_counter()
    states, metrics = run(states, population.new_metrics(), step_ranges(warm, steps_per_epoch))
    if num_steps is None:
        num_steps = call_steps((time.perf_counter() - start) / warm, steps_per_epoch)
    ranges = step_ranges(num_steps, steps_per_epoch)
    root = out_dir / "plugins" / "profile"
    before = set(root.glob("*")) if root.is_dir() else set()
    jax.profiler.start_trace(out_dir, create_perfetto_trace=True)
    try:
        with jax.profiler.TraceAnnotation(WINDOW):
            start = time.perf_counter()
            run(states, metrics, ranges)
            wall = time.perf_counter() - start
    finally:
        jax.profiler.stop_trace()
    new = sorted(set(root.glob("*")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise RuntimeError(f"jax.profiler wrote no trace under {root}")
    folder = new[-1]
    xplane = next(iter(sorted(folder.glob("*.xplane.pb"))), None)
    if xplane is None:
        raise RuntimeError(f"jax.profiler wrote no .xplane.pb in {folder}")
    perfetto = folder / "perfetto_trace.json.gz"
    return Capture(
        num_steps, len(ranges), wall, folder, xplane, perfetto if perfetto.exists() else None
    )


def load(xplane: Path):
    """The trace as `jax.profiler.ProfileData` (JAX's reader of an XSpace file)."""
    return jax.profiler.ProfileData.from_file(str(xplane))


def window(profile) -> tuple[int, int]:
    """(start_ns, end_ns) of the timed calls' TraceAnnotation."""
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name == WINDOW:
                    return event.start_ns, event.end_ns
    raise RuntimeError(f"the trace has no {WINDOW!r} event")


def _hlo_op(event) -> str:
    """The HLO instruction an event ran: a GPU kernel's `hlo_op` stat, else its name, or
    the name of the instruction a TPU's "XLA Ops" line writes out whole
    (`%fusion.3 = f32[...] fusion(...), ...`)."""
    for key, value in event.stats:
        if key == "hlo_op" and isinstance(value, str):
            return value
    name = event.name
    if name.startswith("%") and " = " in name:
        return name[1 : name.index(" = ")]
    return name


def read_ops(profile, known: set[str] | dict) -> list[OpEvent]:
    """The events of operations (see the module doc): `known` holds the HLO instruction
    names of the traced programs."""
    by_plane = []
    for plane in profile.planes:
        device = plane.name.startswith("/device:") and "CUSTOM" not in plane.name
        ops = []
        for line in plane.lines:
            in_flight = device and line.name.startswith(ASYNC_LINE)
            for event in line.events:
                name = _hlo_op(event)
                if name in known or (device and TRANSFER.search(event.name)):
                    ops.append(OpEvent(name, event.start_ns, event.end_ns, in_flight))
        by_plane.append((device, ops))
    on_devices = [ops for device, ops in by_plane if device and ops]
    chosen = on_devices or [ops for _, ops in by_plane]
    return [e for ops in chosen for e in ops]
