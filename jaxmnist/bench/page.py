"""bench.html: the benchmark as a self-contained page, in the style of the run report.

Built with `jaxmnist.pages` (the shared template, tables and embedded
images), so it opens from disk with no network. Headline cards, one table per
comparison (the variants of `--variants` first), the bar chart, the method in a
few sentences (so a reader can judge the figures without reading the code), the
environment and the config.
"""

from __future__ import annotations

import html as html_lib
import json

from jaxmnist.bench.table import breakdown_text, device
from jaxmnist.pages import cards, figure, html_table, render_page
from jaxmnist.profiling.section import profile_section

COLUMNS = ["compile s", "ms/step", "spread", "examples/s", "GFLOP/s", "MFU"]


def _row(m: dict, first: str, quality: bool, tokens: bool) -> list:
    row = [
        first,
        f"{m['compile_seconds']:.2f}",
        f"{1e3 * m['step_seconds']['median']:.3f}",
        f"{m['step_seconds']['rel_spread']:.1%}",
        f"{m['examples_per_second']['median']:,.0f}",
        f"{m['achieved_flops_per_second'] / 1e9:.1f}",
        f"{m['mfu']:.2f}",
    ]
    if quality:
        loss = m["final_train_loss"]
        row += [
            str(m["steps_trained"]),
            "—" if loss is None else f"{loss:.4f}",
            "—" if m["test_loss"] is None else f"{m['test_loss']:.4f}",
            f"{m['test_accuracy']:.2%}",
        ]
    if tokens:
        row.append(f"{m['projected_tokens_per_second']:,.0f}")
    return row


def _table(
    rows: list[dict], first: str, key, result: dict, quality: bool = False, extra=None
) -> str:
    """`extra`: (header, m -> cell) of one more column, or None."""
    tokens = result["tokens"] is not None
    header = [first, *COLUMNS]
    if quality:
        header += ["steps", "train loss", "test loss", "test acc"]
    if tokens:
        header.append("tokens/s (projection)")
    if extra:
        header.append(extra[0])
    body = [_row(m, key(m), quality, tokens) + ([extra[1](m)] if extra else []) for m in rows]
    eps = [m["examples_per_second"]["median"] for m in rows]
    best = {(eps.index(max(eps)), 4)} if eps else set()
    return html_table(header, body, best=best)


def _variants(section: dict, result: dict) -> str:
    rows = section["rows"]
    table = _table(
        rows,
        "value",
        lambda m: m["value"],
        result,
        quality=True,
        extra=(f"vs {rows[0]['value']}", lambda m: f"{m['examples_per_second_vs_first']:.2f}×"),
    )
    shared = [f"{m['value']} = {m['same_program_as']}" for m in rows if m["same_program_as"]]
    note = (
        f"Each value is the config with {section['key']} set to it, measured in "
        f"{section['mode']}; the timed windows of all values are interleaved (window 1 of "
        "each, then window 2, ...), so that a change of load on the machine falls on all."
    )
    if shared:
        note += f" Same program and initial state: {', '.join(shared)}."
    return table + _p(note)


def _p(text: str) -> str:
    return f"<p>{html_lib.escape(text)}</p>"


def _summary(result: dict) -> str:
    items = []
    r = result["ratios"]
    if "scan-epoch/jit-step-host" in r:
        items.append(("scan-epoch / jit-step-host", f"{r['scan-epoch/jit-step-host']:.2f}×"))
    variants = (result.get("variants") or {}).get("rows") or []
    measured = variants + result["modes"] + result["dtypes"] + result["batch_sweep"]
    if measured:
        top = max(measured, key=lambda m: m["examples_per_second"]["median"])
        items.append(("best examples/s", f"{top['examples_per_second']['median']:,.0f}"))
        best = max(measured, key=lambda m: m["mfu"])
        items.append(
            (f"best MFU (batch {best['batch_size']}, {best['dtype']})", f"{best['mfu']:.2f}")
        )
    for p in result["peak"].values():
        items.append(
            (f"peak {p['dtype']}", f"{p['flops_per_second']['median'] / 1e9:,.0f} GFLOP/s")
        )
    return cards(items)


def _method(result: dict) -> str:
    o, m = result["options"], result["model"]
    text = [
        (
            "All modes run the same training step (jaxmnist.training.step.make_train_step) on the "
            "same model, optimizer and batch. python-dispatch calls it un-jitted, op by op; "
            "jit-step-host calls it jitted once per batch, gathering each batch in NumPy and "
            "copying it with jax.device_put; jit-step-device calls it jitted once per batch on "
            "data already on the device; scan-epoch runs jaxmnist's compiled epoch (lax.scan)."
        ),
        (
            f"Each measurement compiles first (compile s), runs {o['warmup']} untimed warm-up "
            f"window(s), then {o['windows']} timed windows of one epoch each (python-dispatch: "
            f"{o['dispatch_window_steps']} steps). block_until_ready is called only at window "
            "edges; figures are medians, spread is (max - min) / median over the windows. A JAX "
            "compile inside a timed window is an error, and so is an implicit host-device "
            "transfer (python-dispatch may upload its Python-scalar constants: eager dispatch "
            "cannot run without that)."
        ),
        (
            f"MFU = achieved FLOP/s / measured peak. Achieved FLOP/s = examples/s x "
            f"{m['flops_per_example']:,} FLOPs per example ({m['flops_note']}). "
            "The peak is a chained square matmul in the same dtype, "
            "measured in this run on this device."
        ),
        (
            "python-dispatch compiles no whole step: its compile time is its first eager step, "
            "which compiles each operation once."
        ),
    ]
    if result["data"]["synthetic"]:
        text.append(
            "The data are synthetic (random pixels and labels): speeds are real, "
            "losses and accuracies are not."
        )
    return "".join(_p(t) for t in text)


def render_bench_page(result: dict, png: bytes, table_text: str) -> str:
    """The whole page as a string; `png` is the bar chart, `table_text` the terminal table."""
    env, d = result["environment"], result["data"]
    sections = [
        (
            "Summary",
            _summary(result)
            + _p(
                f"{d['dataset']} from {d['source']}; {d['num_train_examples']:,} training examples."
            ),
        )
    ]
    modes, dtypes, sweep = result["modes"], result["dtypes"], result["batch_sweep"]
    if result.get("variants"):
        v = result["variants"]
        sections.append((f"Variants of {v['key']}", _variants(v, result)))
    if modes:
        extra = ""
        if result["breakdown"]:
            extra = _p(
                f"Per step, ms: {breakdown_text(result)} (a difference of two modes within "
                "their measurement noise is shown as < noise, with that spread)"
            )
        sections.append(
            (
                f"Modes (batch {modes[0]['batch_size']}, {modes[0]['dtype']})",
                _table(modes, "mode", lambda m: m["mode"], result) + extra,
            )
        )
    if dtypes:
        sections.append(
            (
                f"Compute dtype ({dtypes[0]['mode']}, batch {dtypes[0]['batch_size']})",
                _table(dtypes, "dtype", lambda m: m["dtype"], result, quality=True),
            )
        )
    if sweep:
        sections.append(
            (
                f"Batch size ({sweep[0]['mode']}, {sweep[0]['dtype']})",
                _table(sweep, "batch", lambda m: str(m["batch_size"]), result),
            )
        )
    sections.append(
        (
            "Chart",
            figure(
                png,
                "examples/s of each comparison measured",
                "Bars: median examples/s; whiskers: min and max over the timed windows.",
            ),
        )
    )
    if result["tokens"] is not None:
        t = result["tokens"]
        sections.append(
            (
                "Tokens/s projection",
                _p(
                    f"tokens/s = examples/s x {t['tokens_per_example']:g} tokens per example, "
                    f"as given. {t['note']}."
                ),
            )
        )
    if result.get("profile"):  # `bench --profile-steps N`
        sections.append(profile_section(result["profile"]))
    sections.append(("Method", _method(result)))
    sections.append(("Terminal output", f"<pre>{html_lib.escape(table_text)}</pre>"))
    env_rows = [
        [k, ", ".join(map(str, v)) if isinstance(v, list) else str(v)] for k, v in env.items()
    ]
    sections.append(("Environment", html_table(["", ""], env_rows, kv=True)))
    sections.append(
        ("Config", f"<pre>{html_lib.escape(json.dumps(result['config'], indent=2))}</pre>")
    )
    subtitle = f"{device(env)}, jax {env['jax']}, {result['created']}"
    return render_page(f"jaxmnist bench: {result['preset'] or 'custom config'}", sections, subtitle)
