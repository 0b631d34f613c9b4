"""What `jaxmnist bench` prints: a headline, then one table per comparison measured.

`format_table(result)` is the terminal's text of a bench result (laid out in `schema`);
the page (`page`) shows the same tables and reuses the pieces they share, the device's
description and the per-step breakdown.
"""

from __future__ import annotations

from jaxmnist.bench.scaling import scaling_lines
from jaxmnist.bench.schema import BREAKDOWN_PARTS
from jaxmnist.bench.variants import table_lines


def _eps(m: dict) -> float:
    return m["examples_per_second"]["median"]


def _ms(m: dict) -> float:
    return 1e3 * m["step_seconds"]["median"]


def _acc(x) -> str:
    return "—" if x is None else f"{x:.2%}"


def _num(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def headline(result: dict) -> list[str]:
    """Two lines: what was measured, and on what."""
    d, m, env = result["data"], result["model"], result["environment"]
    kind = "synthetic" if d["synthetic"] else "real"
    peaks = ", ".join(
        f"{p['dtype']} {p['flops_per_second']['median'] / 1e9:,.1f} GFLOP/s "
        f"(±{p['flops_per_second']['rel_spread'] / 2:.0%})"
        for p in result["peak"].values()
    )
    n = next(iter(result["peak"].values()))["matmul_shape"][0] if result["peak"] else 0
    return [
        (
            f"preset {result['preset'] or '-'} | {d['dataset']} "
            f"({kind}, {d['num_train_examples']:,} training examples) | "
            f"{m['name']} {m['num_params']:,} params | "
            f"{m['flops_per_example']:,} FLOP/example (forward + backward)"
        ),
        f"{device(env)} | jax {env['jax']} | measured peak ({n}^3 matmul): {peaks}",
    ]


def device(env: dict) -> str:
    """'cpu: AMD EPYC (2 CPUs)' or 'gpu: NVIDIA H100 80GB HBM3 (host: ...)'."""
    host = f"{env['cpu_model']}, {env['cpu_count']} CPUs"
    if env["backend"] == "cpu":
        return f"cpu: {host}"
    return f"{env['backend']}: {env['device_kind']} x {env['device_count']} (host: {host})"


def _token_cell(m: dict) -> str:
    t = m.get("projected_tokens_per_second")
    return "" if t is None else f"{t:>14,.0f}"


def _timing_rows(rows: list[dict], first: str, key, tokens: bool, quality: bool) -> list[str]:
    head = (
        f"{first:<16} {'compile s':>9} {'ms/step':>9} {'spread':>7} {'examples/s':>11} "
        f"{'GFLOP/s':>8} {'MFU':>5}"
    )
    if quality:
        head += f" {'steps':>6} {'train loss':>10} {'test acc':>8}"
    if tokens:
        head += f" {'tokens/s (proj.)':>16}"
    lines = [head]
    for m in rows:
        line = (
            f"{key(m):<16} {m['compile_seconds']:>9.2f} {_ms(m):>9.3f} "
            f"{m['step_seconds']['rel_spread']:>7.1%} {_eps(m):>11,.0f} "
            f"{m['achieved_flops_per_second'] / 1e9:>8.1f} {m['mfu']:>5.2f}"
        )
        if quality:
            line += (
                f" {m['steps_trained']:>6} {_num(m['final_train_loss'], '.4f'):>10} "
                f"{_acc(m['test_accuracy']):>8}"
            )
        if tokens:
            line += f" {_token_cell(m):>16}"
        lines.append(line)
    return lines


def breakdown_text(result: dict) -> str:
    """The per-step breakdown in ms, e.g. "compiled step 0.412, call overhead < noise (±0.150)".

    A part is the difference of two modes' median step times. When it is no larger
    than the noise of the two medians (half of each mode's min-max range over its
    windows, added) its size and even its sign are not measured, so it is shown as
    "< noise" with that spread instead of a number that may be negative.
    """
    steps = {m["mode"]: m["step_seconds"] for m in result["modes"]}

    def half_range(mode):
        s = steps.get(mode)
        return (s["max"] - s["min"]) / 2 if s else 0.0

    cells = []
    for name, seconds in result["breakdown"].items():
        a, b = BREAKDOWN_PARTS.get(name, (None, None))
        label = name.removesuffix("_seconds").replace("_", " ")
        noise = half_range(a) + half_range(b) if b else 0.0
        if b and abs(seconds) <= noise:
            cells.append(f"{label} < noise (±{1e3 * noise:.3f})")
        else:
            cells.append(f"{label} {1e3 * seconds:.3f}")
    return ", ".join(cells)


def format_table(result: dict) -> str:
    """The terminal report: headline, then one table per comparison."""
    tokens = result["tokens"] is not None
    o = result["options"]
    lines = headline(result)
    modes, dtypes, sweep = result["modes"], result["dtypes"], result["batch_sweep"]
    when = f"median of {o['windows']} timed windows after {o['warmup']} warm-up"
    if result.get("variants"):

        def rows(records, first, key, quality):
            return _timing_rows(records, first, key, tokens, quality)

        lines += table_lines(result["variants"], rows)
    if modes:
        lines += ["", f"Modes: batch {modes[0]['batch_size']}, {modes[0]['dtype']} ({when})"]
        lines += _timing_rows(modes, "mode", lambda m: m["mode"], tokens, quality=False)
        if any(m["mode"] == "python-dispatch" for m in modes):
            lines.append(
                "(python-dispatch compiles no whole step: its compile s is the first eager "
                "step, which compiles each op once)"
            )
        ratios = result["ratios"]
        shown = [f"{k} {v:.2f}x" for k, v in ratios.items() if k != "bfloat16/float32"]
        if shown:
            lines.append("examples/s ratios: " + ", ".join(shown))
        if result["breakdown"]:
            lines.append("per step, ms: " + breakdown_text(result))
    if dtypes:
        lines += ["", f"Compute dtype: {dtypes[0]['mode']}, batch {dtypes[0]['batch_size']}"]
        lines += _timing_rows(dtypes, "dtype", lambda m: m["dtype"], tokens, quality=True)
        if "bfloat16/float32" in result["ratios"]:
            lines.append(
                f"bfloat16/float32 examples/s: {result['ratios']['bfloat16/float32']:.2f}x"
            )
    if sweep:
        lines += ["", f"Batch size: {sweep[0]['mode']}, {sweep[0]['dtype']}"]
        lines += _timing_rows(sweep, "batch", lambda m: str(m["batch_size"]), tokens, quality=False)
    if tokens:
        t = result["tokens"]
        lines += [
            "",
            (
                f"tokens/s (proj.) = examples/s x {t['tokens_per_example']:g} tokens per "
                "example, as given: a projection, not a measurement"
            ),
        ]
    if result.get("scaling"):
        lines += scaling_lines(result["scaling"])
    if result["data"]["synthetic"]:
        lines += ["", "data are synthetic (random): speeds are real, losses and accuracies are not"]
    return "\n".join(lines)
