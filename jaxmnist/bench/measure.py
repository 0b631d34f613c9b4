"""`run_bench(cfg, options) -> dict`: every measurement of `jaxmnist bench`, in one run.

Up to four comparisons, each made side by side in one process: the four modes at
the config's batch size and compute dtype; the compute dtypes in `sweep_mode`;
the batch sizes in `sweep_mode`; and, with `--variants`, the values of one config
field in `sweep_mode` (`variants`), their timed windows interleaved. A measurement
is a short training run from the same initial parameters: compile, warm up, time
the windows (`jaxmnist.timing`), then evaluate on the test set, so that speed and quality
are reported together. A measurement that appears in two comparisons is made once.
Utilisation is analytic FLOPs per example (forward and backward, from the shapes of
the measurement's own model) times examples/s, over the peak of a large matmul in
the same dtype measured in the same run (`profiling.peak`). JAX's persistent compilation
cache is not used, so that compile times are compile times. The result is one
JSON-ready dict, laid out in `schema`.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import time
from collections.abc import Callable

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import optim, runtime, timing
from jaxmnist.bench import options as options_lib
from jaxmnist.bench import variants as variants_lib
from jaxmnist.bench.modes import HostData, build_runner
from jaxmnist.bench.options import BenchOptions
from jaxmnist.bench.scaling import check_devices, measure_scaling
from jaxmnist.bench.schema import BREAKDOWN_PARTS
from jaxmnist.data import Dataset, get_spec, load_dataset
from jaxmnist.errors import ConfigError
from jaxmnist.models import count_params, get_model
from jaxmnist.profiling import peak as peak_lib
from jaxmnist.profiling.recipe import profile_config
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training.loop import place_train_data
from jaxmnist.training.step import init_state, model_params

SCHEMA_VERSION = 1
SYNTHETIC_NOTE = (
    "synthetic: uniform random pixels and labels of the dataset's shape "
    "(speed only; accuracy is chance)"
)


def synthetic_dataset(
    name: str, seed: int = 0, train_size: int | None = None, test_size: int | None = None
):
    """A `Dataset` of random uint8 data with the real one's shapes, and its sizes unless
    `train_size` or `test_size` says."""
    spec = get_spec(name)
    rng = np.random.default_rng(seed)

    def split(n):
        images = rng.integers(0, 256, (n, *spec.image_shape), dtype=np.uint8)
        return images, rng.integers(0, spec.num_classes, n, dtype=np.uint8)

    return Dataset(
        spec,
        *split(train_size or spec.train_size),
        *split(test_size or spec.test_size),
        SYNTHETIC_NOTE,
    )


def _load(cfg, opts: BenchOptions):
    """The dataset to measure on: real or synthetic, cut to `opts.train_examples`."""
    if opts.synthetic:
        return synthetic_dataset(cfg.data.dataset, cfg.train.seed, opts.train_examples)
    ds = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=cfg.data.download)
    n = opts.train_examples
    if n is None or n >= len(ds.train_labels):
        return ds
    return dataclasses.replace(
        ds,
        train_images=ds.train_images[:n],
        train_labels=ds.train_labels[:n],
        source=f"{ds.source} (first {n} training examples)",
    )


class _Bench:
    """The state shared by one run's measurements: data on both sides, caches, peaks."""

    def __init__(self, cfg, opts: BenchOptions, dataset, log):
        self.cfg, self.opts, self.log = cfg, opts, log
        self.input_shape = dataset.train_images.shape[1:]
        self.num_classes = len(dataset.spec.class_names)
        self.num_train = len(dataset.train_labels)
        self.data = place_train_data(dataset.train_images, dataset.train_labels)
        self.host = HostData(dataset.train_images, dataset.train_labels.astype(np.int32))
        self.test_set = evaluate_lib.place_eval_data(
            dataset.test_images, dataset.test_labels, cfg.train.eval_batch_size
        )
        self.flops_per_example = get_model(cfg.model.name).flops_per_example(
            cfg.model, self.input_shape, self.num_classes
        )
        self.peaks: dict[str, dict] = {}
        self._measured: dict[tuple, dict] = {}
        self._evaluators: dict = {}

    def peak(self, dtype: str) -> dict:
        if dtype not in self.peaks:
            n = self.opts.peak_size or peak_lib.default_size(jax.default_backend(), self.opts.quick)
            self.log(f"peak: {n}x{n} matmul in {dtype}")
            self.peaks[dtype] = peak_lib.measure_matmul_peak(
                dtype,
                n,
                windows=self.opts.windows,
                warmup=max(1, self.opts.warmup),
                min_window_seconds=self.opts.peak_window_seconds,
            )
        return self.peaks[dtype]

    def window_steps(self, mode: str, batch_size: int) -> int:
        """One epoch (the last partial batch dropped); python-dispatch does fewer steps."""
        steps = self.num_train // batch_size
        if mode == "python-dispatch":
            steps = min(steps, self.opts.dispatch_window_steps)
        return steps

    def measure(self, mode: str, dtype: str, batch_size: int) -> dict:
        """The bench's config at this dtype and batch size, in `mode` (measured once)."""
        cfg = dataclasses.replace(
            self.cfg,
            model=dataclasses.replace(self.cfg.model, dtype=dtype),
            train=dataclasses.replace(self.cfg.train, batch_size=batch_size),
        )
        if (mode, cfg) not in self._measured:
            self._measured[mode, cfg] = self.measure_side_by_side(mode, [cfg])[0]
        return self._measured[mode, cfg]

    def measure_side_by_side(self, mode: str, cfgs: list, names: list[str] = ()) -> list[dict]:
        """One measurement of each config in `mode`, their timed windows interleaved;
        each is kept for the comparisons that come after. `names` label the log lines."""
        o = self.opts
        runners, labels = [], []
        for i, cfg in enumerate(cfgs):
            steps = self.window_steps(mode, cfg.train.batch_size)
            label = f"{mode} {cfg.model.dtype} batch {cfg.train.batch_size}"
            if i < len(names):
                label += f" {names[i]}"
            self.log(f"{label}: {o.warmup} warm-up + {o.windows} timed windows of {steps} steps")
            # The schedule spans the steps this measurement trains (+1: python-dispatch's
            # first step).
            optimizer = optim.make_optimizer(cfg.optimizer, (o.warmup + o.windows) * steps + 1)
            state = init_state(
                jax.random.key(cfg.train.seed), cfg, optimizer, self.input_shape, self.num_classes
            )
            runners.append(build_runner(mode, cfg, optimizer, state, self.data, self.host, steps))
            labels.append(label)
        if len(cfgs) > 1:
            self.log(f"{len(cfgs)} measurements side by side, windows interleaved")
        timed = timing.time_interleaved(
            [timing.Timed(r.run, lbl, r.prepare, r.guard) for r, lbl in zip(runners, labels)],
            windows=o.windows,
            warmup=o.warmup,
        )
        compiles = timing.last_window_compiles()  # counted, not assumed
        records = []
        for cfg, runner, (seconds, out) in zip(cfgs, runners, timed):
            records.append(self._record(mode, cfg, runner, seconds, out, compiles))
            self._measured.setdefault((mode, cfg), records[-1])
        return records

    def _record(self, mode: str, cfg, runner, seconds: list[float], out, compiles: int) -> dict:
        o, batch_size, steps = self.opts, cfg.train.batch_size, runner.steps
        losses = runner.losses(out)
        params = model_params(runner.state)
        test = self._evaluator(cfg.model, params)(params, self.test_set)
        step_stats = timing.stats(np.asarray(seconds) / steps)
        eps = peak_lib.invert(timing.stats(seconds), steps * batch_size)
        flops = get_model(cfg.model.name).flops_per_example(
            cfg.model, self.input_shape, self.num_classes
        )
        achieved = eps["median"] * flops
        record = {
            "mode": mode,
            "dtype": cfg.model.dtype,
            "batch_size": batch_size,
            "steps_per_window": steps,
            "windows": o.windows,
            "warmup_windows": o.warmup,
            "compile_seconds": runner.compile_seconds,
            "window_seconds": seconds,
            "step_seconds": step_stats,
            "examples_per_second": eps,
            "flops_per_example": flops,
            "achieved_flops_per_second": achieved,
            "mfu": achieved / self.peak(cfg.model.dtype)["flops_per_second"]["median"],
            "compiles_in_windows": compiles,
            "transfer_guard": runner.guard.as_dict(),
            "steps_trained": int(jax.device_get(runner.state.step)),
            "final_train_loss": _finite(float(losses.mean())),
            "test_loss": _finite(test.loss),
            "test_accuracy": test.accuracy,
        }
        if o.tokens_per_example is not None:
            record["projected_tokens_per_second"] = eps["median"] * o.tokens_per_example
        return record

    def _evaluator(self, model_cfg, params):
        if model_cfg not in self._evaluators:
            self._evaluators[model_cfg] = evaluate_lib.compile_evaluate(
                model_cfg, params, self.test_set, self.num_classes
            )
        return self._evaluators[model_cfg]


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None


def run_bench(
    cfg: config_lib.Config,
    opts: BenchOptions,
    *,
    dataset=None,
    preset: str | None = None,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Runs every measurement `opts` asks for on the default device; returns the result.

    `dataset` (a `jaxmnist.data.Dataset`) skips loading; otherwise the real data
    are loaded, or random data of their shape with `opts.synthetic`. `log` gets
    a line as each measurement starts; `preset` and `command` are recorded as
    given. `cfg` arrives validated and `opts` checked (`options.make_options`), as the
    command makes them; raises ConfigError for a dtype the backend lacks.
    """
    wall_start = time.perf_counter()
    log = log or (lambda line: None)
    # A persistent-cache hit would report a cache load as compile time: the cache
    # stays off, and the saved config says so.
    cfg = dataclasses.replace(cfg, compile_cache=False)
    variants = []
    if opts.variant_key:
        spec = dataset.spec if dataset is not None else get_spec(cfg.data.dataset)
        variants = variants_lib.variant_configs(
            cfg,
            opts.variant_key,
            opts.variant_values,
            opts.sweep_mode,
            spec.image_shape,
            len(spec.class_names),
        )
    dtypes_used = (cfg.model.dtype, *opts.dtypes, *(v.cfg.model.dtype for v in variants))
    for dtype in dict.fromkeys(dtypes_used):
        options_lib.check_dtype_supported(dtype)
    check_devices(opts.device_counts)
    dataset = dataset if dataset is not None else _load(cfg, opts)
    options_lib.check_batch_sizes(opts, cfg, len(dataset.train_labels))
    for v in variants:
        try:
            options_lib.check_batch_sizes(opts, v.cfg, len(dataset.train_labels))
        except ConfigError as e:
            raise ConfigError(f"variants {opts.variant_key}={v.value}: {e}") from None

    bench = _Bench(cfg, opts, dataset, log)
    for dtype in dict.fromkeys(dtypes_used):
        bench.peak(dtype)
    variant_section = None
    if variants:  # first, so that the comparisons below reuse what they share with it
        records = bench.measure_side_by_side(
            opts.sweep_mode,
            [v.cfg for v in variants],
            [f"{opts.variant_key}={v.value}" for v in variants],
        )
        variant_section = {
            "key": opts.variant_key,
            "values": list(opts.variant_values),
            "mode": opts.sweep_mode,
            "order": "interleaved: timed window i of every value, in order, then window i + 1",
            "rows": variants_lib.rows(variants, records),
        }
    batch, dtype = cfg.train.batch_size, cfg.model.dtype
    modes = [bench.measure(m, dtype, batch) for m in opts.modes]
    dtypes = [bench.measure(opts.sweep_mode, d, batch) for d in opts.dtypes]
    sweep = [bench.measure(opts.sweep_mode, dtype, b) for b in opts.batch_sizes]
    scaling = None
    if opts.device_counts:
        scaling = measure_scaling(cfg, dataset, opts.device_counts, log)

    params = jax.eval_shape(
        lambda: (
            init_state(
                jax.random.key(0),
                cfg,
                optim.make_optimizer(cfg.optimizer, 1),
                bench.input_shape,
                bench.num_classes,
            ).params
        )
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "preset": preset,
        "command": command,
        "config": cfg.to_dict(),
        "options": options_lib.as_dict(opts),
        "environment": runtime.environment(),
        "data": {
            "dataset": dataset.spec.name,
            "source": dataset.source,
            "synthetic": dataset.source.startswith(SYNTHETIC_NOTE),
            "num_train_examples": bench.num_train,
            "num_test_examples": len(dataset.test_labels),
        },
        "model": {
            "name": cfg.model.name,
            "num_params": count_params(params),
            "flops_per_example": bench.flops_per_example,
            "flops_note": "analytic matmul FLOPs of one training example, forward and backward "
            "(elementwise work and the optimizer update left out)",
        },
        "peak": bench.peaks,
        "modes": modes,
        "dtypes": dtypes,
        "batch_sweep": sweep,
        "ratios": _ratios(modes, dtypes),
        "breakdown": _breakdown(modes),
        "checks": _checks(modes),
        "tokens": None
        if opts.tokens_per_example is None
        else {
            "tokens_per_example": opts.tokens_per_example,
            "note": (
                "a projection, not a measurement: examples/s times the tokens per example you gave"
            ),
        },
        "scaling": scaling,
        "variants": variant_section,
        "wall_seconds": time.perf_counter() - wall_start,
    }


def profile_bench_config(cfg, opts, bench_result: dict, steps: int, out_dir) -> dict:
    """`bench --profile-steps N`: `profile_config` on the benchmark's kind of data (random
    with `opts.synthetic`, else the real set) and with the peak the benchmark measured."""
    if opts.synthetic:
        dataset = synthetic_dataset(cfg.data.dataset, cfg.train.seed, opts.train_examples)
    else:
        dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=cfg.data.download)
    peak = bench_result["peak"].get(cfg.model.dtype, {}).get("flops_per_second", {})
    cfg = dataclasses.replace(cfg, compile_cache=False)  # as the benchmark ran it
    return profile_config(cfg, dataset, steps=steps, out_dir=out_dir, peak_flops=peak.get("median"))


def _eps(records: list[dict], key: str, value: str) -> float | None:
    for r in records:
        if r[key] == value:
            return r["examples_per_second"]["median"]
    return None


def _ratios(modes: list[dict], dtypes: list[dict]) -> dict:
    """Examples/s ratios of the comparisons that matter, where both sides were measured."""
    pairs = {
        "scan-epoch/jit-step-host": (modes, "mode", "scan-epoch", "jit-step-host"),
        "scan-epoch/jit-step-device": (modes, "mode", "scan-epoch", "jit-step-device"),
        "jit-step-device/jit-step-host": (modes, "mode", "jit-step-device", "jit-step-host"),
        "jit-step-device/python-dispatch": (modes, "mode", "jit-step-device", "python-dispatch"),
        "bfloat16/float32": (dtypes, "dtype", "bfloat16", "float32"),
    }
    out = {}
    for name, (records, key, a, b) in pairs.items():
        ea, eb = _eps(records, key, a), _eps(records, key, b)
        if ea is not None and eb is not None:
            out[name] = ea / eb
    return out


def _breakdown(modes: list[dict]) -> dict:
    """Where a step's time goes, as differences of median seconds per step between modes."""
    t = {r["mode"]: r["step_seconds"]["median"] for r in modes}
    return {
        name: t[a] - (t[b] if b else 0.0)
        for name, (a, b) in BREAKDOWN_PARTS.items()
        if a in t and (b is None or b in t)
    }


def _checks(modes: list[dict]) -> dict:
    order = ["scan-epoch", "jit-step-device", "python-dispatch"]
    eps = [_eps(modes, "mode", m) for m in order]
    holds = None if None in eps else all(a >= b for a, b in itertools.pairwise(eps))
    compiles = sum(m["compiles_in_windows"] for m in modes)
    return {
        "scan-epoch >= jit-step-device >= python-dispatch": holds,
        "compiles_in_windows": compiles,
    }
