"""`jaxmnist bench`: honest throughput of the training step, and how close it gets to the
device's limit.

Modules: `modes` (the four ways to drive the same training step), `options` (what to
measure, and its validation), `variants` (`--variants KEY=V1,V2`: one config field as a
comparison axis, and its checks), `measure` (`run_bench(cfg, options) -> dict`, and
`--profile-steps`'s profile on the same data), `schema` (the layout of bench.json, and a
checker), `table` (the terminal table), `page` (the HTML page) and `output` (bench.json,
the bar chart, and writing all three files). Its windows are timed by `jaxmnist.timing`;
the device's peak is `profiling.peak`'s, as the profile's is.
"""

from jaxmnist.bench.measure import run_bench
from jaxmnist.bench.modes import MODES
from jaxmnist.bench.options import BenchOptions, make_options

__all__ = ["MODES", "BenchOptions", "make_options", "run_bench"]
