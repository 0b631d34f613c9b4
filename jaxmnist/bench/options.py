"""What to measure: `BenchOptions`, the `--quick` variant, parsing and validation.

The model, optimizer, data and the batch size and dtype of the mode comparison
come from the ordinary `Config`; `BenchOptions` says which modes, dtypes and
batch sizes to measure and how long, and which config field to vary (`variants`;
with it, the other comparisons are made only when asked for). Everything a user
can get wrong (an unknown mode, a batch size of 0, a dtype the backend cannot
compute in) is a `ConfigError`, found before any data is read or anything is
compiled, except the batch sizes' upper bound, which needs the dataset
(`check_batch_sizes`); the variants' own checks are in `variants`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import jax
import jax.numpy as jnp

from jaxmnist import config as config_lib
from jaxmnist.bench.modes import MODES
from jaxmnist.bench.variants import parse_variants
from jaxmnist.errors import ConfigError
from jaxmnist.models.family import DTYPES


@dataclass(frozen=True)
class BenchOptions:
    modes: tuple[str, ...] = MODES
    dtypes: tuple[str, ...] = ("float32", "bfloat16")  # compared in `sweep_mode`
    batch_sizes: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    sweep_mode: str = "scan-epoch"  # the mode of the dtype comparison and batch sweep
    tokens_per_example: float | None = None  # for the labelled tokens/s projection
    windows: int = 5  # timed windows per measurement
    warmup: int = 1  # untimed windows before them
    dispatch_window_steps: int = 32  # python-dispatch is far slower per step: shorter windows
    train_examples: int | None = None  # train on the first N examples only; None: all
    peak_size: int | None = None  # side of the peak matmul; None: by backend (peak.py)
    peak_window_seconds: float = 0.2  # each peak window chains enough matmuls to last this long
    synthetic: bool = False  # random MNIST-shaped data instead of the real dataset
    quick: bool = False
    device_counts: tuple[int, ...] = ()  # the scaling table's device counts; (): no table
    variant_key: str | None = None  # a config field compared along its values; None: none
    variant_values: tuple[str, ...] = ()  # the values of variant_key, as given


# Seconds, for tests and smoke checks. A window is one epoch (so that the
# scan-epoch's on-device shuffle is amortised as in training), so --quick
# shortens epochs by training on a slice of the data.
QUICK = {
    "train_examples": 4096,
    "dispatch_window_steps": 4,
    "batch_sizes": (64, 256),
    "peak_window_seconds": 0.05,
}


def make_options(
    *,
    modes: str | None = None,
    dtypes: str | None = None,
    batch_sizes: str | None = None,
    sweep_mode: str | None = None,
    tokens_per_example: str | None = None,
    synthetic: bool = False,
    quick: bool = False,
    devices: str | None = None,
    variants: str | None = None,
) -> BenchOptions:
    """Options from command-line strings ("a,b,c"); None keeps the (quick) default.

    With `variants` ("KEY=V1,V2,..."), modes, dtypes and batch sizes are measured
    only when given.
    """
    opts = BenchOptions(synthetic=synthetic, quick=quick, **(QUICK if quick else {}))
    given = {}
    if variants is not None:
        key, values = parse_variants(variants)
        given.update(variant_key=key, variant_values=values, modes=(), dtypes=(), batch_sizes=())
    if modes is not None:
        given["modes"] = _split(modes, "modes")
    if dtypes is not None:
        given["dtypes"] = _split(dtypes, "dtypes")
    if batch_sizes is not None:
        given["batch_sizes"] = tuple(
            _int(b, "batch size") for b in _split(batch_sizes, "batch sizes")
        )
    if sweep_mode is not None:
        given["sweep_mode"] = sweep_mode
    if devices is not None:
        counts = tuple(_int(d, "device count") for d in _split(devices, "devices"))
        if any(c < 1 for c in counts):
            raise ConfigError(f"devices: counts must be at least 1, got {devices!r}")
        given["device_counts"] = tuple(sorted(set(counts)))
    if tokens_per_example is not None:
        try:
            given["tokens_per_example"] = float(tokens_per_example)
        except ValueError:
            raise ConfigError(
                f"tokens per example: expected a number, got {tokens_per_example!r}"
            ) from None
    opts = replace(opts, **given)
    validate_options(opts)
    return opts


def _split(text: str, what: str) -> tuple[str, ...]:
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    if not items:
        raise ConfigError(f"{what}: expected a comma-separated list, got {text!r}")
    return items


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{what}: expected an integer, got {text!r}") from None


def validate_options(opts: BenchOptions) -> None:
    """Raises ConfigError for anything wrong that needs no data or device."""
    for mode in (*opts.modes, opts.sweep_mode):
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; choose from: {', '.join(MODES)}")
    for dtype in opts.dtypes:
        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r}; choose from: {', '.join(DTYPES)}")
    if bool(opts.variant_key) != bool(opts.variant_values):
        raise ConfigError("variants: a key needs values, and values a key")
    for name in ("modes", "dtypes", "batch_sizes"):
        values = getattr(opts, name)
        if (not values and not opts.variant_key) or len(set(values)) != len(values):
            raise ConfigError(
                f"{name.replace('_', ' ')}: need at least one, without repeats, got {values}"
            )
    for b in opts.batch_sizes:
        if b <= 0:
            raise ConfigError(f"batch sizes must be positive, got {b}")
    t = opts.tokens_per_example
    if t is not None and not (math.isfinite(t) and t > 0):
        raise ConfigError(f"tokens per example must be positive, got {t:g}")
    for name in ("windows", "dispatch_window_steps"):
        if getattr(opts, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(opts, name)}")
    if not opts.peak_window_seconds > 0:
        raise ConfigError(f"peak_window_seconds must be positive, got {opts.peak_window_seconds}")
    if opts.warmup < 0:
        raise ConfigError(f"warmup must be >= 0, got {opts.warmup}")
    for name in ("train_examples", "peak_size"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")


def check_batch_sizes(opts: BenchOptions, cfg: config_lib.Config, num_train_examples: int) -> None:
    """ConfigError if a batch size exceeds the training examples in use."""
    for b in (*opts.batch_sizes, cfg.train.batch_size):
        if b > num_train_examples:
            raise ConfigError(f"batch size {b} exceeds the {num_train_examples} training examples")


def check_dtype_supported(dtype: str) -> None:
    """ConfigError unless the default backend can run a small matmul in `dtype`."""
    backend = jax.default_backend()
    try:
        x = jnp.ones((8, 8), dtype)
        jax.block_until_ready(jax.jit(jnp.matmul)(x, x))
    except Exception as e:  # noqa: BLE001 -- whatever the backend raises, the user's fix is another dtype
        raise ConfigError(
            f"dtype {dtype} is not supported by the {backend} backend "
            f"({type(e).__name__}); use --dtypes with one of the others"
        ) from None


def as_dict(opts: BenchOptions) -> dict:
    return {
        f.name: (list(v) if isinstance(v := getattr(opts, f.name), tuple) else v)
        for f in fields(opts)
    }
