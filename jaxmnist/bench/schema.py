"""The layout of bench.json (schema_version 1), and a checker for it.

Top level (every key always present; `null` where a figure does not apply):

- `schema_version` int, `created` ISO-8601 UTC time, `preset` and `command`
  (the command line) str or null, `wall_seconds` float: the whole run, data
  loading and compiles included.
- `config`: the full `Config.to_dict()`; `options`: the `BenchOptions` used.
- `environment`: `runtime.environment()`: versions, backend, device kind, CPU model, ...
- `data`: dataset, source (where it was read from, or the synthetic note),
  synthetic (bool), num_train_examples, num_test_examples.
- `model`: name, num_params, flops_per_example (analytic, forward + backward), flops_note.
- `peak`: {dtype: peak} with peak = dtype, matmul_shape [n, n, n],
  flops_per_matmul, matmuls_per_window, compile_seconds, window_seconds [..],
  flops_per_second {median, min, max, rel_spread}.
- `modes`, `dtypes`, `batch_sweep`: lists of measurements (below): the four modes
  at the config's batch size and dtype; the dtypes and the batch sizes in the
  sweep mode. The same measurement may appear in more than one list.
- `ratios`: {"a/b": examples/s of a over b} for scan-epoch/jit-step-host,
  scan-epoch/jit-step-device, jit-step-device/jit-step-host,
  jit-step-device/python-dispatch and bfloat16/float32, where both were measured.
- `breakdown`: median seconds per step: compiled_step_seconds (scan-epoch),
  call_overhead_seconds (jit-step-device minus scan-epoch), host_copy_seconds
  (jit-step-host minus jit-step-device), eager_dispatch_seconds (python-dispatch
  minus jit-step-device); each only where its modes were measured.
- `checks`: "scan-epoch >= jit-step-device >= python-dispatch" (bool or null),
  compiles_in_windows (always 0: a compile in a window is an error).
- `tokens`: null, or {tokens_per_example, note}: the projection's input, labelled.
- `scaling`: null, or (with `--devices 1,2,...`) {epochs, rows, fake_devices, note}: per
  device count, data- and seed-parallel examples/s and efficiency, all-reduce bytes/step.
- `variants`: null, or (with `--variants KEY=V1,V2,...`) {key, values (as given), mode
  (the sweep mode), order (how the timed windows were interleaved), rows}: one row per
  value, in order: a measurement (below) plus value, examples_per_second_vs_first (its
  median examples/s over the first value's) and same_program_as (an earlier value whose
  program and initial state are the same, e.g. `auto` and what it resolves to; else null).

A measurement: mode, dtype, batch_size, steps_per_window, windows,
warmup_windows, compile_seconds, window_seconds [..], step_seconds and
examples_per_second {median, min, max, rel_spread}, achieved_flops_per_second
(median), flops_per_example (of its own model config), mfu (achieved / the peak of
its dtype), compiles_in_windows,
transfer_guard {host_to_device, device_to_host, device_to_device}, steps_trained,
final_train_loss (mean of the last window; null if not finite), test_loss,
test_accuracy, and projected_tokens_per_second when tokens_per_example was given.
"""

from __future__ import annotations

BREAKDOWN_PARTS = {
    "compiled_step_seconds": ("scan-epoch", None),
    "call_overhead_seconds": ("jit-step-device", "scan-epoch"),
    "host_copy_seconds": ("jit-step-host", "jit-step-device"),
    "eager_dispatch_seconds": ("python-dispatch", "jit-step-device"),
}
"""Each part of `breakdown`: the mode measured, minus the mode it is compared with."""

NUM = (int, float)
OPT_NUM = (int, float, type(None))
STATS = {"median": NUM, "min": NUM, "max": NUM, "rel_spread": NUM}
GUARD = {"host_to_device": str, "device_to_host": str, "device_to_device": str}

MEASUREMENT = {
    "mode": str,
    "dtype": str,
    "batch_size": int,
    "steps_per_window": int,
    "windows": int,
    "warmup_windows": int,
    "compile_seconds": NUM,
    "window_seconds": [NUM],
    "step_seconds": STATS,
    "examples_per_second": STATS,
    "flops_per_example": int,
    "achieved_flops_per_second": NUM,
    "mfu": NUM,
    "compiles_in_windows": int,
    "transfer_guard": GUARD,
    "steps_trained": int,
    "final_train_loss": OPT_NUM,
    "test_loss": OPT_NUM,
    "test_accuracy": NUM,
}
OPTIONAL_MEASUREMENT = {"projected_tokens_per_second": NUM}
VARIANTS = {
    "key": str,
    "values": [str],
    "mode": str,
    "order": str,
    "rows": [
        {
            **MEASUREMENT,
            "value": str,
            "examples_per_second_vs_first": NUM,
            "same_program_as": (str, type(None)),
        }
    ],
}

PEAK = {
    "dtype": str,
    "matmul_shape": [int],
    "flops_per_matmul": int,
    "matmuls_per_window": int,
    "compile_seconds": NUM,
    "window_seconds": [NUM],
    "flops_per_second": STATS,
}

SCHEMA = {
    "schema_version": int,
    "created": str,
    "preset": (str, type(None)),
    "command": (str, type(None)),
    "wall_seconds": NUM,
    "config": dict,
    "options": dict,
    "environment": {"jax": str, "backend": str, "device_kind": str, "cpu_model": str},
    "data": {
        "dataset": str,
        "source": str,
        "synthetic": bool,
        "num_train_examples": int,
        "num_test_examples": int,
    },
    "model": {"name": str, "num_params": int, "flops_per_example": int, "flops_note": str},
    "peak": ("mapping", PEAK),
    "modes": [MEASUREMENT],
    "dtypes": [MEASUREMENT],
    "batch_sweep": [MEASUREMENT],
    "ratios": ("mapping", NUM),
    "breakdown": ("mapping", NUM),
    "checks": {
        "scan-epoch >= jit-step-device >= python-dispatch": (bool, type(None)),
        "compiles_in_windows": int,
    },
    "tokens": (dict, type(None)),
    "scaling": (dict, type(None)),
    "variants": ("nullable", VARIANTS),
}


def check(result: dict) -> list[str]:
    """Every way `result` departs from SCHEMA, as 'path: problem' lines; [] if none."""
    problems: list[str] = []
    _check(result, SCHEMA, "bench", problems)
    sections = {s: result.get(s) or [] for s in ("modes", "dtypes", "batch_sweep")}
    if isinstance(result.get("variants"), dict):
        sections["variants.rows"] = result["variants"].get("rows") or []
    for section, rows in sections.items():
        for i, m in enumerate(rows):
            for key, typ in OPTIONAL_MEASUREMENT.items():
                if key in m:
                    _check(m[key], typ, f"bench.{section}[{i}].{key}", problems)
    return problems


def _check(value, spec, path: str, problems: list[str]) -> None:
    if isinstance(spec, dict):  # a record: these keys at least (extra keys are allowed)
        if not isinstance(value, dict):
            problems.append(f"{path}: expected an object, got {type(value).__name__}")
            return
        for key, sub in spec.items():
            if key not in value:
                problems.append(f"{path}: missing {key!r}")
            else:
                _check(value[key], sub, f"{path}.{key}", problems)
    elif isinstance(spec, list):  # a list of spec[0]
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check(item, spec[0], f"{path}[{i}]", problems)
    elif isinstance(spec, tuple) and spec and spec[0] == "nullable":  # null or spec[1]
        if value is not None:
            _check(value, spec[1], path, problems)
    elif isinstance(spec, tuple) and spec and spec[0] == "mapping":  # {str: spec[1]}
        if not isinstance(value, dict):
            problems.append(f"{path}: expected an object, got {type(value).__name__}")
            return
        for key, item in value.items():
            _check(item, spec[1], f"{path}.{key}", problems)
    else:  # a type or a tuple of types; bool is not a number here
        types = spec if isinstance(spec, tuple) else (spec,)
        if isinstance(value, bool) and bool not in types:
            problems.append(f"{path}: expected {_names(types)}, got bool")
        elif not isinstance(value, types):
            problems.append(f"{path}: expected {_names(types)}, got {type(value).__name__}")


def _names(types) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)
