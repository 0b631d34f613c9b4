"""Where a step's time goes: the traced operations summed by kind, as a table.

The measured time of the window (`Capture.wall_seconds`, perf_counter around the
N steps) is split so that the shares add up to it exactly:

- the time when at least one operation runs is shared among the operations
  running at that instant (two on different threads at once each get half), so
  each kind's time is its part of the busy time, never more than the window;
- what is left, the window minus the busy time, is host overhead between calls
  and operations: dispatch, the loop's control, waiting, the profiler itself.

Each arithmetic kind's FLOPs are counted from the compiled program (`flops`: every
timed matmul and convolution by its shapes, the part of it inside the window), so
a CNN's convolutions and its dense head each get an achieved FLOP/s and a fraction
of the measured peak. Where the program's count is unknown (a library call it
cannot read) and one kind of arithmetic ran, that kind gets the model family's
analytic count (`flops_per_example`, the figure `jaxmnist bench` uses for MFU)
instead; otherwise the row says "—". The arithmetic kinds together get the sum,
beside the analytic count, which leaves out what a step computes beyond the
model's layers and counts what it skips (the first layer's input gradient).
Kinds that are not arithmetic say "—".
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from jaxmnist.profiling import flops as flops_lib
from jaxmnist.profiling.classify import ARITHMETIC, KINDS, LABELS, HloIndex, OpEvent

PROFILE_JSON = "profile.json"  # the table, beside the trace: the report and bench.html read it
HOST = "host"
HOST_LABEL = "host overhead between calls"


def attribute(
    events: list[tuple[int, int, str]], start: int, end: int, in_flight: list[bool] | None = None
) -> dict[str, float]:
    """Nanoseconds per key of (start_ns, end_ns, key) intervals clipped to [start, end]:
    each instant is shared equally among the intervals covering it (a sweep line). An
    interval flagged in `in_flight` (an asynchronous operation in flight) shares only
    the instants that no unflagged interval covers: it overlaps the work it hides behind."""
    flags = in_flight or [False] * len(events)
    edges = []
    for i, (a, b, _) in enumerate(events):
        a, b = max(a, start), min(b, end)
        if b > a:
            edges.append((a, 1, i))
            edges.append((b, 0, i))
    edges.sort()
    out: dict[str, float] = defaultdict(float)
    active: dict[int, str] = {}
    last = None
    for t, opening, i in edges:
        if active and last is not None and t > last:
            running = [k for j, k in active.items() if not flags[j]]
            sharing = running or list(active.values())
            for key in sharing:
                out[key] += (t - last) / len(sharing)
        last = t
        if opening:
            active[i] = events[i][2]
        else:
            active.pop(i, None)
    return dict(out)


def breakdown(
    ops: list[OpEvent],
    index: HloIndex,
    window: tuple[int, int],
    *,
    wall_seconds: float,
    steps: int,
    flops_per_step: float | None,
    peak_flops_per_second: float | None,
) -> dict:
    """The table as a JSON-ready dict: `rows` (kind, label, seconds_per_step, share,
    flops_per_step, flops_per_second, fraction_of_peak; None where unknown) in KINDS
    order then host overhead, `arithmetic_together` where several arithmetic kinds ran,
    `top_ops`. `flops_per_step`: the model's analytic count, every member's step."""
    timed = [(e.start_ns, e.end_ns, k, e.name, e.in_flight) for e in ops
             if (k := index.kind(e.name)) is not None]  # fmt: skip
    in_flight = [f for *_, f in timed]
    per_kind = attribute([(a, b, k) for a, b, k, _, _ in timed], *window, in_flight)
    per_op = attribute([(a, b, n) for a, b, _, n, _ in timed], *window, in_flight)
    counted = program_flops([t[:4] for t in timed if not t[4]], index, window)  # done work
    wall_ns = wall_seconds * 1e9
    busy = sum(per_kind.values())
    # The annotation's window sits inside the perf_counter window; the rest is host time.
    host_ns = max(wall_ns - busy, 0.0)
    total = busy + host_ns
    ran = [k for k in ARITHMETIC if per_kind.get(k, 0) > 0]
    kind_flops = {k: None if counted[k] is None else counted[k] / steps for k in ran}
    known = [kind_flops[k] for k in ran]
    program = sum(known) if ran and None not in known else None  # the program's own count
    if len(ran) == 1 and kind_flops[ran[0]] is None:
        kind_flops[ran[0]] = flops_per_step  # the program's count unknown: the model's
    rows = []
    for kind in KINDS:
        ns = per_kind.get(kind, 0.0)
        if not ns and kind not in ("elementwise", "optimizer", "copies", "other"):
            continue  # a formulation this step does not use
        flops = kind_flops.get(kind)
        rows.append(_row(kind, LABELS[kind], ns, total, steps, flops, peak_flops_per_second))
    rows.append(_row(HOST, HOST_LABEL, host_ns, total, steps, None, None))
    together = None
    if len(ran) > 1 and (program or flops_per_step):
        ns = sum(per_kind[k] for k in ran)
        together = _row("arithmetic", "matmuls and convolutions together", ns, total, steps,
                        program or flops_per_step, peak_flops_per_second)  # fmt: skip
        together["flops_from"] = "program" if program else "model"
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:10]
    kinds = {n: k for _, _, k, n, _ in timed}
    return {
        "steps": steps,
        "wall_seconds": wall_seconds,
        "step_seconds": wall_seconds / steps,
        "busy_seconds": busy / 1e9,
        "flops_per_step": flops_per_step,
        "program_flops_per_step": program,
        "peak_flops_per_second": peak_flops_per_second,
        "rows": rows,
        "arithmetic_together": together,
        "top_ops": [
            {"name": n, "kind": kinds[n], "seconds_per_step": ns / 1e9 / steps} for n, ns in top
        ],
    }


def program_flops(timed, index: HloIndex, window: tuple[int, int]) -> dict:
    """Arithmetic kind -> FLOPs the program performed in `window`, from the timed
    operations `timed` ((start_ns, end_ns, kind, name)), each counted by its part inside
    the window; None for a kind one of whose operations cannot be counted."""
    start, end = window
    out: dict = dict.fromkeys(ARITHMETIC, 0.0)
    cache: dict = {}
    for a, b, kind, name in timed:
        if kind not in out or out[kind] is None:
            continue
        inside = min(b, end) - max(a, start)
        part = inside / (b - a) if b > a else float(start <= a <= end)
        if part <= 0:
            continue
        if name not in cache:
            cache[name] = flops_lib.count(name, index)
        out[kind] = None if cache[name] is None else out[kind] + part * cache[name]
    return out


def _row(kind, label, ns, total, steps, flops, peak) -> dict:
    seconds = ns / 1e9 / steps
    rate = flops / seconds if (flops and seconds > 0) else None
    return {
        "kind": kind,
        "label": label,
        "seconds_per_step": seconds,
        "share": ns / total if total else 0.0,
        "flops_per_step": flops,
        "flops_per_second": rate,
        # Above 1 the measured peak is no peak (a noisy or cold measurement): not shown.
        "fraction_of_peak": rate / peak if (rate and peak and rate <= peak) else None,
        "above_peak": bool(rate and peak and rate > peak),
    }


def _cell(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def table_rows(table: dict) -> list[list[str]]:
    """The table's cells: kind, share, ms/step, GFLOP/s, of peak; a total row last."""
    out = []
    for r in table["rows"]:
        gflops = None if r["flops_per_second"] is None else r["flops_per_second"] / 1e9
        out.append(
            [
                r["label"],
                f"{r['share']:.1%}",
                f"{1e3 * r['seconds_per_step']:.3f}",
                _cell(gflops, ",.1f"),
                _cell(r["fraction_of_peak"], ".1%"),
            ]
        )
    share = sum(r["share"] for r in table["rows"])
    out.append(["total (measured)", f"{share:.1%}", f"{1e3 * table['step_seconds']:.3f}", "", ""])
    return out


HEADER = ["kind", "share", "ms/step", "GFLOP/s", "of peak"]


def format_table(table: dict) -> str:
    """The table for a terminal, with a line on the arithmetic kinds together and the
    costliest operations."""
    rows = [HEADER, *table_rows(table)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = [f"where a step's time goes ({table['steps']} steps traced):"]
    for r in rows:
        lines.append(
            "  " + r[0].ljust(widths[0]) + "".join(f"  {c:>{w}}" for c, w in zip(r[1:], widths[1:]))
        )
    lines += [f"  {line}" for line in notes(table)]
    return "\n".join(lines)


def notes(table: dict) -> list[str]:
    """The lines under the table: the arithmetic together, the peak, the costliest ops."""
    out = []
    t = table.get("arithmetic_together")
    if t and t["flops_per_second"]:
        peak = t["fraction_of_peak"]
        out.append(
            f"matmuls and convolutions together: {t['flops_per_second'] / 1e9:,.1f} GFLOP/s"
            + (f", {peak:.1%} of peak" if peak is not None else "")
            + (" (the model's analytic FLOPs)" if t.get("flops_from") == "model" else "")
        )
    program, model = table.get("program_flops_per_step"), table.get("flops_per_step")
    if program and model:
        out.append(
            f"FLOPs per step: {program / 1e9:,.3f} G counted in the compiled program, "
            f"{model / 1e9:,.3f} G in the model's analytic count"
        )
    if table.get("peak_flops_per_second"):
        out.append(
            f"measured peak: {table['peak_flops_per_second'] / 1e9:,.1f} GFLOP/s "
            "(a large square matmul in the model's dtype)"
        )
        above = [r for r in [*table["rows"], t] if r and r.get("above_peak")]
        if above:
            fastest = max(above, key=lambda r: r["flops_per_second"])
            out.append(
                f"no fraction of it is shown: {fastest.get('label', 'the arithmetic together')} "
                f"ran at {fastest['flops_per_second'] / 1e9:,.1f} GFLOP/s, above it, so the "
                "measured peak is too low (measure again with nothing else running)"
            )
    top = ", ".join(
        f"{o['name']} {1e3 * o['seconds_per_step']:.3f} ms" for o in table["top_ops"][:5]
    )
    if top:
        out.append(f"costliest operations per step: {top}")
    return out


def read_profile(run_dir: str | os.PathLike) -> dict | None:
    """A folder's profile.json, or None when it holds none (or an unreadable one)."""
    try:
        return json.loads((Path(run_dir) / PROFILE_JSON).read_text())
    except (OSError, ValueError):
        return None
