"""`train --profile-steps N`: a run-loop callback that profiles N steps after training.

At `on_finish` the run is over and summarised (its timings are untouched by the
profiler), every member's parameters are on the host (`RunEnd.params`), and the
population's programs are compiled: N more steps of the same program are traced
from the final states, which nothing needs any more (the steps consume them),
into the run directory (`profile_population`). Every process runs the steps (a
sharded step is collective); only process 0 keeps the trace and writes
profile.json, which the report reads. `log` gets the table's lines.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from jaxmnist.profiling.breakdown import format_table
from jaxmnist.profiling.recipe import profile_population
from jaxmnist.training import parallel
from jaxmnist.training.hooks import Callback, RunEnd, RunStart


class ProfileSteps(Callback):
    """Profiles `steps` steady steps into `workdir` when the run finishes."""

    def __init__(self, workdir, steps: int, log: Callable[[str], None] | None = None):
        self.workdir, self.steps, self.log = Path(workdir), steps, log
        self.cfg = None
        self.table: dict | None = None

    def on_start(self, start: RunStart) -> None:
        self.cfg = start.cfg

    def on_finish(self, end: RunEnd) -> None:
        main = parallel.is_main_process()
        with tempfile.TemporaryDirectory(prefix="jaxmnist-profile-") as scratch:
            self.table = profile_population(
                self.cfg,
                end.result.population,
                end.result.states,
                end.dataset,
                steps=self.steps,
                steps_per_epoch=end.result.plan.steps_per_epoch,
                out_dir=self.workdir if main else scratch,
                write=main,
            )
        if main and self.log:
            for line in format_table(self.table).splitlines():
                self.log(line)
