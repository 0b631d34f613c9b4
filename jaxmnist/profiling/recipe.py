"""Profiling a run's steady steps: trace them, read the trace back, tabulate, write.

`profile_population` is the one recipe, used by `jaxmnist profile` (after a short
warm-up run of the config, `profile_config`), by `train --profile-steps` (after
training, `callback.ProfileSteps`) and by `bench --profile-steps` (`bench.measure`). It
traces N steps of the population's own compiled program (`trace.capture`), indexes the
program's optimized HLO (`classify.read_hlo`), reads the operations back from the trace
with JAX's reader, and splits the measured time by kind (`breakdown`). The FLOPs are
counted from the program (`flops`), beside the model family's analytic count, and the
peak is a large matmul's measured FLOP/s (`peak`, which `jaxmnist bench` uses too). The
table is written to profile.json beside the trace; the report and bench.html read it
from there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax

from jaxmnist.models import get_model
from jaxmnist.profiling import peak as peak_lib
from jaxmnist.profiling import trace
from jaxmnist.profiling.breakdown import PROFILE_JSON, breakdown
from jaxmnist.profiling.classify import read_hlo
from jaxmnist.runs.rundir import atomic_write
from jaxmnist.training.loop import place_train_data, train_population
from jaxmnist.training.population import seed_members

FLOPS_NOTE = (
    "each kind's matmuls and convolutions counted from the compiled program's shapes, "
    "per step of every member (the model's analytic count, as `jaxmnist bench` uses, "
    "where the program's cannot be counted)"
)


def measure_peak(dtype: str, size: int | None = None) -> float:
    """FLOP/s of a large square matmul in `dtype` on the default device (`peak`): the
    best of 5 windows, since anything else running only ever slows a window down."""
    n = size or peak_lib.default_size(jax.default_backend())
    return peak_lib.measure_matmul_peak(dtype, n, windows=5)["flops_per_second"]["max"]


def profile_population(
    cfg,
    population,
    states,
    dataset,
    *,
    steps: int | None,
    steps_per_epoch: int,
    out_dir: str | os.PathLike,
    peak_flops: float | None = None,
    peak_size: int | None = None,
    write: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Traces `steps` steady steps of `population` (its programs compiled) from `states`
    (donated) into `out_dir` (None: as many as one of a run's calls holds,
    `trace.call_steps`) and returns the table (`breakdown.breakdown`'s dict, plus where
    the trace is, `steps_chosen` and `phase_seconds`: what each phase of this took).
    `peak_flops`: a peak already measured (else measured here, a `peak_size` matmul). With `write`,
    the table goes to `out_dir`/profile.json. `log` gets a line as each phase ends, so
    that a slow one (reading a large trace, the peak's compile on an accelerator) shows
    where the time goes."""
    out_dir = Path(out_dir)
    phases = Phases(log)
    data = place_train_data(dataset.train_images, dataset.train_labels, population.layout)
    cap = trace.capture(population, states, data, steps, steps_per_epoch, out_dir)
    phases.done("trace", f"traced {cap.steps} steps into {cap.xplane.relative_to(out_dir)}")
    index = read_hlo(*(program.as_text() for program in population.steps_fns.values()))
    profile = trace.load(cap.xplane)
    ops = trace.read_ops(profile, index.instructions)
    phases.done("read", f"read {len(ops)} operations back from the trace")
    if peak_flops is None:
        peak_flops = measure_peak(cfg.model.dtype, peak_size)
        phases.done("peak", f"measured the {cfg.model.dtype} matmul peak")
    flops = get_model(cfg.model.name).flops_per_example(
        cfg.model, tuple(dataset.train_images.shape[1:]), len(dataset.spec.class_names)
    )
    table = breakdown(
        ops,
        index,
        trace.window(profile),
        wall_seconds=cap.wall_seconds,
        steps=cap.steps,
        flops_per_step=float(flops * cfg.train.batch_size * len(population)),
        peak_flops_per_second=peak_flops,
    )
    table.update(
        calls=cap.calls,
        steps_chosen="given" if steps else "one of a run's calls",
        backend=jax.default_backend(),
        device=str(population.layout.mesh.devices.flat[0]),
        dtype=cfg.model.dtype,
        flops_note=FLOPS_NOTE,
        trace=str(cap.xplane.relative_to(out_dir)),
        perfetto=str(cap.perfetto.relative_to(out_dir)) if cap.perfetto else None,
        phase_seconds=phases.seconds,
    )
    if write:
        atomic_write(out_dir / PROFILE_JSON, (json.dumps(table, indent=2) + "\n").encode())
    return table


class Phases:
    """Seconds of each phase of a profile, from the end of the one before; `log` (if
    any) gets a line as each ends."""

    def __init__(self, log: Callable[[str], None] | None = None):
        self.log, self.seconds = log, {}
        self._since = time.perf_counter()

    def done(self, name: str, what: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._since, 3)
        self._since = now
        if self.log:
            self.log(f"profile: {what} in {self.seconds[name]:.1f} s")


def profile_config(
    cfg,
    dataset,
    *,
    steps: int | None,
    out_dir: str | os.PathLike,
    layout=None,
    peak_flops: float | None = None,
    peak_size: int | None = None,
    callbacks=(),
    log: Callable[[str], None] | None = None,
) -> dict:
    """`jaxmnist profile`: the config's population trained for `steps` steps by the run
    loop (compiling it and warming up, no evaluation of the training set, no target;
    `trace.MIN_STEPS` when `steps` is None), then `steps` more traced
    (`profile_population`, which chooses them when None; `log` as there, with a first
    line when the warm-up is over). `cfg` arrives validated."""
    warm_steps = steps or trace.MIN_STEPS
    t = dataclasses.replace(cfg.train, steps=warm_steps, target_accuracy=None, eval_train=False)
    warm = dataclasses.replace(cfg, train=t)
    start = time.perf_counter()
    result = train_population(warm, seed_members(warm), dataset, callbacks, layout=layout)
    if log:
        log(
            f"profile: compiled (in {result.compile_seconds:.1f} s) and ran {warm_steps} steps "
            f"in {time.perf_counter() - start:.1f} s"
        )
    return profile_population(
        warm,
        result.population,
        result.states,
        dataset,
        steps=steps,
        steps_per_epoch=result.plan.steps_per_epoch,
        out_dir=out_dir,
        peak_flops=peak_flops,
        peak_size=peak_size,
        log=log,
    )
