"""The readers of what happens around a run: compiling and starting, the memory estimate
and the host allocator, the report, evaluation, checkpoints, stopping, searching, serving.

Each takes a record (its JSON) and returns rows of (what, figure), every figure formatted
from the record's own values (`formats`); `headlines.BENCHMARKS` says which reads which
benchmark's records.
"""

from __future__ import annotations

from formats import copy, mb, met, ms, pct, plural, ratio, sec

Rows = list[tuple[str, str]]


def compile_time(r: dict) -> Rows:
    copies = list(r["median"])
    rows = []
    for preset in r["median"]["this"]:
        text = "; ".join(
            f"{copy(c, copies)} {sec(m[preset]['compile_seconds'])} (the process "
            f"{sec(m[preset]['wall_seconds'], 1)}{_slowest(m[preset].get('programs'))})"
            for c, m in r["median"].items()
            if preset in m
        )
        name, *overrides = preset.split(":")
        label = f"`{name}`" + "".join(f", `{o}`" for o in overrides)
        rows.append((f"{label}, compile with nothing cached", text))
    return rows


def aot_compile(r: dict) -> Rows:
    rows = []
    for text, p in r["presets"].items():
        slowest = _slowest(p["compile_programs"])
        rows.append(
            (
                f"`{text.replace(':', '`, `')}`, compiled for a {r['target']} by the host's CPU",
                f"{sec(p['compile_seconds_sum'])} in all, one program at a time{slowest}",
            )
        )
    return rows


def _slowest(programs: dict | None) -> str:
    """ ", the slowest program X s" of a run's programs (name -> seconds), if given."""
    if not programs:
        return ""
    name = max(programs, key=programs.get)
    return f"; the slowest program, {name}, {sec(programs[name])}"


def startup(r: dict) -> Rows:
    rows = [
        (
            "slowest of `--version`, `--help` and every command's `--help` (medians)",
            (
                f"{sec(r['slowest_median_seconds'], 3)} (goal ≤ {sec(r['goal_seconds'], 1)}: "
                f"{met(r['within_goal'])})"
            ),
        )
    ]
    stack = r.get("stack_imports", {})
    copies = list(stack)
    for c, imports in stack.items():
        text = ", ".join(f"{k} {sec(v['median_seconds'], 3)}" for k, v in imports.items())
        rows.append((f"importing the stack, {copy(c, copies)}", text))
    return rows


def data_loading(r: dict) -> Rows:
    copies = list(r["median"])
    return [
        (
            f"loading {r['dataset']}, {copy(c, copies)} (medians)",
            (
                f"{sec(m['seconds'], 3)}; the peak grew {mb(m['peak_growth_mb'])} for "
                f"{mb(m['array_mb'])} of arrays"
            ),
        )
        for c, m in r["median"].items()
    ]


def time_to_result(r: dict) -> Rows:
    t = r["targets"]
    rows = [
        (
            "whole `tpu101` process against the tutorial's, first run",
            (
                f"{sec(r['jaxmnist_cold_seconds'], 1)} / {sec(r['tutorial_cold_seconds'], 1)} = "
                f"{ratio(r['cold_ratio'])} (target ≤ {ratio(t['cold_ratio'], 1)}: "
                f"{met(r['cold_ratio'] <= t['cold_ratio'])})"
            ),
        ),
        (
            "the same, warm",
            (
                f"{sec(r['jaxmnist_warm_seconds'], 1)} / {sec(r['tutorial_warm_seconds'], 1)} = "
                f"{ratio(r['warm_ratio'])} (target ≤ {ratio(t['warm_ratio'], 1)}: "
                f"{met(r['warm_ratio'] <= t['warm_ratio'])})"
            ),
        ),
    ]
    for preset, c in r["compile"].items():
        target = t["compile_seconds"].get(preset)
        goal = (
            f" (target ≤ {sec(target, 0)}: {met(c['compile_seconds'] <= target)})" if target else ""
        )
        samples = c.get("compile_samples", [])
        each = f" (median of {len(samples)}: {', '.join(sec(x) for x in samples)})"
        figure = sec(c["compile_seconds"]) + (each if len(samples) > 1 else "")
        rows.append((f"`{preset}`, compile from an empty cache", figure + goal))
    return rows


def memory_estimate(r: dict) -> Rows:
    cases, goal = r["cases"], r["goal"]
    within = sum(c["within_goal"] for c in cases)
    rows = [
        (
            f"cases within {goal['low']:.2f}–{goal['high']:.2f} of the measured peak",
            (
                f"{within} of {len(cases)}; estimate / measured "
                f"{min(c['ratio'] for c in cases):.2f}–{max(c['ratio'] for c in cases):.2f}"
            ),
        )
    ]
    for c in cases:
        bn = {True: ", batch norm", False: "", None: ""}[c["batch_norm"]]
        rows.append(
            (
                f"`{c['preset']}`{bn}, {plural(c['seeds'], 'seed')}",
                (
                    f"estimate {mb(c['estimate_mb'])}, measured {mb(c['measured_mb'])} "
                    f"({c['measured_as']}): {c['ratio']:.2f}"
                ),
            )
        )
    return rows


def host_memory(r: dict) -> Rows:
    rows = []
    for key, v in r.items():
        if not key.startswith("seeds_"):
            continue
        n = key.removeprefix("seeds_")
        for mode, m in v["median"].items():
            rows.append(
                (
                    f"{n} model(s), {mode}",
                    (
                        f"training {sec(m['train_seconds'])}, kernel time "
                        f"{sec(m['system_seconds'])}, "
                        f"peak RSS {mb(m['peak_rss_mb'])}"
                    ),
                )
            )
        rows.append((f"{n} model(s), kept memory against glibc's defaults", ratio(v["speedup"])))
        if "growth_check_speedup" in v:
            rows.append(
                (
                    f"{n} model(s), with the growth check against without",
                    ratio(v["growth_check_speedup"]),
                )
            )
    return rows


def run_overhead(r: dict) -> Rows:
    copies, rows, goal = list(r["median"]), [], r["goal_report_seconds"]
    for c, m in r["median"].items():
        name = copy(c, copies)
        rows.append(
            (
                f"what the report adds to a `tpu101` run, {name} (medians)",
                (
                    f"+{sec(m['report_seconds'])}"
                    + (
                        f", +{sec(m['report_cpu_seconds'])} of CPU"
                        if "report_cpu_seconds" in m
                        else ""
                    )
                    + f" (goal ≤ {sec(goal, 1)}: {met(m['report_seconds'] <= goal)})"
                ),
            )
        )
        peaks = ", ".join(
            f"{k.replace('_', ' ')} {mb(m[k]['peak_rss_mb'])}"
            for k in ("report", "no_report", "no_checkpoint")
            if k in m
        )
        rows.append(
            (
                f"peak RSS of the training process, {name}",
                f"{peaks} (goal ≤ {mb(r['goal_peak_mb'])})",
            )
        )
    return rows


def eval_overhead(r: dict) -> Rows:
    rows = []
    for c in r["cases"]:
        n = c["train_eval_examples"]
        which = (
            "no training set"
            if not n
            else "the training set"
            if n >= c["train_size"]
            else f"{n:,} training examples"
        )
        rows.append(
            (
                f"`{c['preset']}`, the test set and {which}",
                f"evaluation {pct(c['steady_eval_fraction'])} of training time",
            )
        )
    sides = r.get("side_by_side") or {}
    copies = list(sides)
    for c, presets in sides.items():
        text = ", ".join(f"`{p}` {pct(v['median'])}" for p, v in presets.items())
        rows.append(
            (
                f"in fresh processes, {copy(c, copies)} (medians)",
                f"{text} (goal ≤ {pct(r['goal_eval_fraction'], 0)})",
            )
        )
    return rows


def checkpoint_overhead(r: dict) -> Rows:
    e, k = r["median_epoch_wall_seconds"], r["kill_and_resume"]
    overhead, target = r["checkpoint_overhead"], r["target_overhead"]
    return [
        (
            "`tpu101` epoch, with / without a checkpoint each (medians)",
            (
                f"{sec(e['checkpoint'], 3)} / {sec(e['no_checkpoint'], 3)}: {overhead:+.1%} "
                f"(target ≤ {pct(target, 0)}: {met(overhead <= target)})"
            ),
        ),
        ("the loop's wait per save", ms(r["median_save_call_seconds"] * 1e3)),
        (
            "killed with SIGKILL, resumed",
            (
                f"{sec(k['resume_wall_seconds'], 1)} (restore {sec(k['restore_seconds'])}); "
                "parameters "
                f"equal to the uninterrupted run's: {k['params_equal_uninterrupted']}"
            ),
        ),
    ]


def stop_latency(r: dict) -> Rows:
    rows = []
    for c in r["cases"].values():
        saved = sum(s["checkpoint_at_that_step"] for s in c["stops"])
        rows.append(
            (
                f"`{c['command']}`",
                (
                    f"worst {sec(c['worst_seconds_to_exit'])} from the signal to the exit (target "
                    f"≤ {sec(r['target_seconds'], 0)}: {met(c['meets_target'])}); a checkpoint "
                    f"at the step it stopped at in {saved} of {len(c['stops'])} stops"
                ),
            )
        )
    return rows


def search_pruning(r: dict) -> Rows:
    t = r["time_to_target_seconds"]
    rows = [
        (
            (
                f"time to {pct(r['target_val_accuracy'])} validation accuracy, no pruner / median "
                "pruner"
            ),
            f"{sec(t['none'], 1)} / {sec(t['median'], 1)}: {ratio(r['time_to_target_ratio'])}",
        )
    ]
    for run in r["runs"]:
        rows.append(
            (
                f"pruner `{run['pruner']}`",
                (
                    f"{run['pruned']} of {r['trials']} trials pruned, "
                    f"{run['epochs_trained']} epochs trained"
                ),
            )
        )
    return rows


def serve_load(r: dict) -> Rows:
    lat = r["latency_ms"]
    errors_ok = r["errors"] <= r["target"]["errors"]
    return [
        (
            f"{r['requests']:,} requests from {r['clients']} clients",
            f"{r['completed']:,} answered, {r['errors']} errors ({met(errors_ok)})",
        ),
        ("throughput", f"{r['requests_per_second']:,.0f} requests/s"),
        (
            "latency",
            (
                f"p50 {ms(lat['p50'])}, p99 {ms(lat['p99'])} (target < "
                f"{ms(r['target']['p99_ms'], 0)}: "
                f"{met(lat['p99'] < r['target']['p99_ms'])})"
            ),
        ),
        ("server CPU per request", ms(r["server_cpu_ms_per_request"], 2)),
    ]
