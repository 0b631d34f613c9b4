"""What each benchmark's records say, in a few rows: the Results page's figures.

`BENCHMARKS` maps each folder of benchmarks/results/ to a `Benchmark`: what it measures
(a sentence with no figure in it), how it is run, and `figures`, which reads a record of
it into rows of (what, figure). Every figure on the Results page comes from one of these
readers, formatted from the record's own values; none is typed here. A reader meets the
formats its folder's records have had (a folder can hold a script's runs and trials
beside them), and raises KeyError on one it does not know, which the page reports.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

Rows = list[tuple[str, str]]


@dataclass(frozen=True)
class Benchmark:
    what: str  # what it measures: a sentence without figures
    figures: Callable[[dict], Rows] | None  # a record -> its rows; None: logs, no figures
    source: str = ""  # how it is run, where that is not `python benchmarks/<folder>.py`


# ---- formats --------------------------------------------------------------------------


def pct(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}%}"


def sec(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f} s"


def ms(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f} ms"


def us(x: float) -> str:
    return f"{x:,.1f} µs"


def ratio(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}×"


def mb(x: float) -> str:
    return f"{x:,.0f} MB"


def rate(x: float) -> str:
    return f"{x:,.0f}"


def ci(pair) -> str:
    return f"95% CI {pct(pair[0])}–{pct(pair[1])}" if pair else "no CI"


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def copy(key: str, copies: list[str]) -> str:
    """A copy of the code a script ran side by side (`this`, `pythonpath:DIR`), named
    without the folder it was in (the record says what each was)."""
    if key == "this":
        return "this checkout"
    others = [k for k in copies if k != "this"]
    return "the other copy" + (f" ({others.index(key) + 1})" if len(others) > 1 else "")


def range_of(xs) -> str:
    return f"{min(xs):.2f}–{max(xs):.2f}"


# ---- training and accuracy ------------------------------------------------------------


def cnn_presets(r: dict) -> Rows:
    rows = []
    for name, p in r["presets"].items():
        reached = p["reached_target_at"]
        when = f"after epoch {reached['epoch']}" if reached else "not reached"
        rows.append(
            (
                f"`{name}`, {plural(p['seeds'], 'seed')}, {plural(p['epochs'], 'epoch')}",
                (
                    f"mean test accuracy {pct(p['mean_test_accuracy'])} ({ci(p['ci95'])}; min "
                    f"{pct(p['min'])}, max {pct(p['max'])}); training "
                    f"{sec(p['train_seconds_all_seeds'], 1)}"
                    f" for all; its target {pct(p['target'], 1)} {when}"
                ),
            )
        )
        if "one_model" in p:
            one = p["one_model"]
            rows.append(
                (
                    f"`{name}`, training time per model",
                    (
                        f"{sec(p['train_seconds_per_model_in_population'])} in the population, "
                        f"{sec(one['train_seconds'])} alone ({pct(one['test_accuracy'])}); target "
                        f"≤ {sec(one['seconds_target'], 0)}: {met(p['meets_target'])}"
                    ),
                )
            )
    return rows


def _trial_rows(prefix: str, trials: dict) -> Rows:
    """Every trial in `trials` (nested: any dict with a validation accuracy)."""
    rows = []
    for name, t in trials.items():
        if not isinstance(t, dict):
            continue
        if "val_accuracy_mean" in t:
            text = f"members {pct(t['val_accuracy_mean'])} on validation"
            if t.get("ensemble_val_accuracy") is not None:
                text += f", ensemble {pct(t['ensemble_val_accuracy'])}"
            p = next((v for k, v in t.items() if k.startswith("welch_p")), None)
            text += f" (Welch p = {p:.2f})" if p is not None else ""
            if "steady_epoch_seconds" in t:
                text += f"; steady epoch {sec(t['steady_epoch_seconds'])}"
            elif "train_seconds" in t:
                text += f"; training {sec(t['train_seconds'], 0)}"
            rows.append((f"{prefix}`{name}`", text))
        elif "members_mean" in t and "ensemble" in t:
            rows.append(
                (
                    f"{prefix}`{name}`",
                    f"members {pct(t['members_mean'])}, ensemble {pct(t['ensemble'])}",
                )
            )
        elif "members_tta" in t:
            mean, tta = statistics.mean(t["members"]), statistics.mean(t["members_tta"])
            rows.append(
                (
                    f"{prefix}`{name}`, test-time augmentation",
                    (
                        f"members {pct(mean)} → {pct(tta)}, ensemble {pct(t['ensemble'])} → "
                        f"{pct(t['ensemble_tta'])}"
                    ),
                )
            )
        else:
            rows += _trial_rows(f"{prefix}`{name}` ", t)
    return rows


def record(r: dict) -> Rows:
    if "presets" in r:
        rows = []
        for name, p in r["presets"].items():
            rows.append(
                (
                    f"`{name}`, {p['members']} members",
                    (
                        f"ensemble {pct(p['ensemble_test_accuracy'])}, members' mean "
                        f"{pct(p['members_mean_test_accuracy'])} ({ci(p['members_ci95'])}); "
                        "whole run "
                        f"{p['wall_seconds'] / 60:.1f} min (training {sec(p['train_seconds'], 0)})"
                    ),
                )
            )
            goal, ok = p["goal"], p["met"]
            rows.append(
                (
                    f"`{name}`, goals",
                    "; ".join(
                        f"{k.replace('_', ' ')} "
                        + (f"≥ {pct(goal[k])}" if k != "minutes" else f"≤ {goal[k]} min")
                        + f": {met(ok[k])}"
                        for k in goal
                        if goal[k] is not None
                    ),
                )
            )
        return rows
    if "epochs" in r and "wall_seconds_until_stopped" in r:  # a run stopped at its limit
        last = r["epochs"][-1]
        return [
            ("epochs finished before the limit", str(len(r["epochs"]))),
            ("the last one's", ", ".join(f"{k} {v}" for k, v in last.items())),
        ]
    return _trial_rows("", {k: v for k, v in r.items() if isinstance(v, dict)})


def seeds_vs_single(r: dict) -> Rows:
    w, n, acc = r["wall_seconds"], r["seeds"], r["seeds_test_accuracy"]
    return [
        (
            "whole program, 1 seed / " + f"{n} seeds (medians)",
            (
                f"{sec(w['single']['median'])} / {sec(w['seeds']['median'])} = "
                f"{ratio(r['wall_ratio'])} (target ≤ {ratio(r['targets']['wall_ratio'], 0)}: "
                f"{met(r['wall_ratio'] <= r['targets']['wall_ratio'])})"
            ),
        ),
        ("the same from an empty compilation cache", ratio(r["wall_ratio_cold_cache"])),
        ("training alone", ratio(r["train_ratio"])),
        (
            f"test accuracy, {n} seeds",
            (
                f"{pct(acc['mean'])} ({ci(acc['ci95'])}; min {pct(acc['min'])}); one seed "
                f"{pct(r['single_test_accuracy'])}"
            ),
        ),
        (
            "peak RSS, 1 / 8 seeds",
            f"{mb(r['peak_rss_mb']['single'])} / {mb(r['peak_rss_mb']['seeds'])}",
        ),
    ]


# ---- speed -----------------------------------------------------------------------------


def cnn_vs_pytorch(r: dict) -> Rows:
    if "runs" in r and "results" not in r:  # whole runs of the script, each its record
        return [
            (f"{name}: {what}", figure)
            for name in r["order"]
            for what, figure in cnn_vs_pytorch(r["runs"][name])
        ]
    rows = []
    for row in r["results"]:
        text = (
            f"steady epoch {sec(row['steady_epoch_seconds'])} "
            f"({range_of(row['epoch_seconds_range'])}"
            f" s), {row['achieved_gflops']:.1f} GFLOP/s, MFU {row['mfu_vs_xla_peak']:.2f}"
        )
        if row.get("final_test_accuracy"):
            text += f"; test accuracy {pct(statistics.median(row['final_test_accuracy']))}"
        if row.get("time_to_99_seconds") is not None:
            text += f", 99% after {sec(row['time_to_99_seconds'], 1)}"
        rows.append((f"`{row['variant']}`", text))
    for name, value in r["ratios"].items():
        target = r.get("target", {}).get(name)
        goal = f" (target ≤ {ratio(target, 1)}: {met(value <= target)})" if target else ""
        rows.append((name, ratio(value) + goal))
    if r.get("busy_core"):
        rows.append(("one core kept busy", "yes, for both sides"))
    return rows


def epoch_vs_tutorial(r: dict) -> Rows:
    e = r["epoch_seconds"]
    rows = [
        (
            "steady epoch, the tutorial's loop / jaxmnist (medians)",
            (
                f"{sec(e['tutorial']['median'], 3)} / {sec(e['jaxmnist']['median'], 4)} = "
                f"{ratio(r['epoch_ratio'], 3)}"
            ),
        ),
        ("measured matmul peak", f"{r['matmul_peak_gflops']:,.1f} GFLOP/s"),
        ("an epoch's matmuls at that peak", ms(r["matmul_limited_epoch_seconds"] * 1e3, 2)),
        (
            "fraction of the peak, tutorial / jaxmnist",
            f"{r['peak_fraction']['tutorial']:.4f} / {r['peak_fraction']['jaxmnist']:.4f}",
        ),
    ]
    if "programs" in r:
        p = r["programs"]
        rows += [
            ("whole programs, jaxmnist / tutorial", ratio(p["wall_ratio"])),
            ("the same with the report", ratio(p["wall_ratio_with_report"])),
            ("the same from an empty cache", ratio(p["wall_ratio_cold_cache"])),
            (
                "peak RSS, tutorial / jaxmnist",
                f"{mb(p['peak_rss_mb']['tutorial'])} / {mb(p['peak_rss_mb']['jaxmnist'])}",
            ),
        ]
    return rows


def bench(r: dict) -> Rows:
    rows, seen = [], set()
    for m in [*r["modes"], *r["dtypes"], *r["batch_sweep"]]:
        label = f"`{m['mode']}`, {m['dtype']}, batch {m['batch_size']}"
        if label in seen:  # the dtypes and the batch sweep repeat the modes' scan-epoch
            continue
        seen.add(label)
        rows.append(
            (
                label,
                (
                    f"{ms(m['step_seconds']['median'] * 1e3, 3)} a step, "
                    f"{rate(m['examples_per_second']['median'])} examples/s, MFU {m['mfu']:.2f}, "
                    f"compile {sec(m['compile_seconds'])}"
                ),
            )
        )
    rows += [(name, ratio(value)) for name, value in r["ratios"].items()]
    return rows


def bf16_matmul(r: dict) -> Rows:
    rows = [(f"matmul, {k}", f"{v:,.1f} GFLOP/s") for k, v in r["matmul_gflops"].items()]
    for preset in ("codelab", "tpu101", "cnn"):
        if preset in r:
            steps = r[preset]["ms_per_step"]
            text = ", ".join(f"{k} {ms(v, 2)}" for k, v in steps.items())
            rows.append((f"`{preset}` step, batch {r[preset]['batch']}", text))
    return rows


def speedups(r: dict) -> Rows:
    """Records of {name: {"ms_per_step": {way: ms}, "speedup": x}}."""
    rows = []
    for name, v in r.items():
        if isinstance(v, dict) and "speedup" in v and "ms_per_step" in v:
            ways = " against ".join(f"{k} {ms(x)}" for k, x in v["ms_per_step"].items())
            rows.append((f"`{name}` training step", f"{ways}: {ratio(v['speedup'])}"))
    if not rows:
        raise KeyError("speedup")
    return rows


def batch_norm_cost(r: dict) -> Rows:
    rows = [(f"one layer, {k}", ms(v)) for k, v in r["layer_ms"].items()]
    step = r["speedrun_step"]
    text = ", ".join(f"{k} {ms(v)}" for k, v in step["ms_per_step"].items())
    return [*rows, ("`speedrun` step", f"{text}: {ratio(step['ratio'])}")]


def side_by_side(figure: str) -> Callable[[dict], Rows]:
    """Records of {"median": {copy: {preset: x}}, ...} (epoch_versions)."""

    def rows(r: dict) -> Rows:
        out = []
        for preset, by_copy in r["median"].items():
            copies = list(by_copy)
            text = ", ".join(f"{copy(c, copies)} {sec(x)}" for c, x in by_copy.items())
            ratios = r.get("ratio_to_this", {}).get(preset, {})
            text += "".join(
                f"; {copy(c, copies)} / this checkout {ratio(x)}"
                for c, x in ratios.items()
                if c != "this"
            )
            out.append((f"`{preset}`, {figure}", text))
        return out

    return rows


def first_block(r: dict) -> Rows:
    rows = []
    for preset, v in r.items():
        if isinstance(v, dict) and "first_block" in v:
            parts = [
                f"{what.replace('_', ' ')} {ratio(v[what]['speedup'])}"
                for what in (
                    "first_block",
                    "evaluation",
                    "first_block_training",
                    "training_gradient",
                )
                if what in v
            ]
            rows.append((f"`{preset}`, the kernel against its parts", ", ".join(parts)))
    return rows


def augment_gathers(r: dict) -> Rows:
    rows = []
    for shift, t in r["translation"].items():
        rows.append(
            (
                f"translation, {shift.replace('_', ' ')}",
                f"gather {us(t['gather'])}, selects {us(t['selects'])} a step; equal: {t['equal']}",
            )
        )
    if "warp" in r:
        w = r["warp"]
        rows.append(
            (
                "affine warp",
                (
                    f"gather {us(w['gather'])}, dense {us(w['dense'])} a step; largest difference "
                    f"{w['max_difference']} grey level"
                ),
            )
        )
    b = r["batch_gather"]
    rows.append(("a batch", f"from the images {us(b['images'])}, as rows {us(b['rows'])}"))
    return rows


def shuffle(r: dict) -> Rows:
    rows = []
    for members, v in r["shuffle_alone"].items():
        m = v["ms_per_member"]
        rows.append(
            (
                f"the shuffle alone, {members} member(s)",
                (
                    f"`jax.random.permutation` {ms(m['library'], 2)}, jaxmnist's "
                    f"{ms(m['jaxmnist'], 2)} "
                    "a member"
                ),
            )
        )
    for case, v in r["steady_epoch_seconds"].items():
        rows.append(
            (
                f"steady epoch, {case}",
                f"library {sec(v['library'], 3)}, jaxmnist {sec(v['jaxmnist'], 3)}",
            )
        )
    return rows


def pacing_overhead(r: dict) -> Rows:
    return [
        (
            f"`{name}` epoch, one call / paced (medians)",
            (
                f"{sec(p['median_one_call_seconds'], 3)} / {sec(p['median_paced_seconds'], 3)}: "
                f"{ratio(p['paced_over_one_call'], 3)}"
            ),
        )
        for name, p in r["presets"].items()
    ]


def devices_scaling(r: dict) -> Rows:
    rows = [
        (
            f"{row['devices']} device(s)",
            (
                f"data-parallel {rate(row['data_parallel_examples_per_second'])} examples/s "
                f"(efficiency {row['data_parallel_efficiency']:.2f}), seed-parallel "
                f"{rate(row['seed_parallel_examples_per_second'])} "
                f"({row['seed_parallel_efficiency']:.2f}); all-reduce "
                f"{row['allreduce_bytes_per_step'] / 1e6:.2f} MB a step"
            ),
        )
        for row in r["scaling"]["rows"]
    ]
    acc = ", ".join(f"{n} device(s) {pct(a)}" for n, a in r["tpu101_test_accuracy"].items())
    return [*rows, ("`tpu101` test accuracy", acc)]


def profile(r: dict) -> Rows:
    rows = [
        ("a step", f"{ms(r['step_seconds'] * 1e3, 3)} ({r['steps']} steps, {r['dtype']})"),
        ("measured matmul peak", f"{r['peak_flops_per_second'] / 1e9:,.1f} GFLOP/s"),
    ]
    for row in r["rows"]:
        if row["share"] < 0.005:
            continue
        text = f"{pct(row['share'], 1)} of the step"
        if row.get("flops_per_second"):
            gflops, peak = row["flops_per_second"] / 1e9, pct(row["fraction_of_peak"], 0)
            text += f", {gflops:,.1f} GFLOP/s ({peak} of peak)"
        rows.append((row["label"], text))
    return rows


def run_layer_before_after(r: dict) -> Rows:
    rows = [(f"after / before, `{k}`", ratio(v, 3)) for k, v in r["after_over_before"].items()]
    fix = r.get("onednn_scratchpad_fix")
    if fix:
        rows.append(
            (
                "oneDNN handlers' own scratchpad, CNN epoch after / before",
                ratio(fix["after_over_before"], 3),
            )
        )
    return rows


# ---- compile and start-up --------------------------------------------------------------


def compile_time(r: dict) -> Rows:
    copies = list(r["median"])
    rows = []
    for preset in r["median"]["this"]:
        text = "; ".join(
            f"{copy(c, copies)} {sec(m[preset]['compile_seconds'])} (the process "
            f"{sec(m[preset]['wall_seconds'], 1)})"
            for c, m in r["median"].items()
            if preset in m
        )
        rows.append((f"`{preset}`, compile with nothing cached", text))
    return rows


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
        rows.append((f"`{preset}`, compile from an empty cache", sec(c["compile_seconds"]) + goal))
    return rows


# ---- memory and around training --------------------------------------------------------


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


# ---- the benchmarks -------------------------------------------------------------------

REMOVED = (
    "its script, which left `benchmarks/` once the choice was made: `git show {}:benchmarks/{}.py`"
)

BENCHMARKS = {
    "accelerator_session": Benchmark(
        "The logs of the accelerator sessions: each step's command, its output and its time.",
        None,
        "`bash benchmarks/accelerator_session.sh`",
    ),
    "augment_gathers": Benchmark(
        "The augmentation's gathers (random translation, affine warp, a batch's rows) against "
        "their dense forms, per step of a scan.",
        augment_gathers,
    ),
    "batch_norm_cost": Benchmark(
        "What batch normalisation costs a layer and a `speedrun` step.", batch_norm_cost
    ),
    "bench_tpu101": Benchmark(
        "The `tpu101` training step in each way of driving it (eager, jitted steps, a compiled "
        "epoch), dtypes and batch sizes, with MFU.",
        bench,
        "`jaxmnist bench --preset tpu101`",
    ),
    "bf16_matmul": Benchmark(
        "The bfloat16 dtype against float32: a large matmul and the presets' steps.", bf16_matmul
    ),
    "checkpoint_overhead": Benchmark(
        "What a checkpoint each epoch costs, and a run killed with SIGKILL, then resumed.",
        checkpoint_overhead,
    ),
    "cnn_presets": Benchmark(
        "The CNN presets' test accuracy as the mean over seeds, and their training time.",
        cnn_presets,
    ),
    "cnn_vs_pytorch": Benchmark(
        "The reference CNN's training epoch in jaxmnist and in PyTorch on the same CPU, "
        "interleaved.",
        cnn_vs_pytorch,
    ),
    "compile_time": Benchmark(
        "Each preset's compile with every cache off: a user's first run.", compile_time
    ),
    "conv_backward": Benchmark(
        "The im2col convolution's backward pass written out, against autodiff's.",
        speedups,
        REMOVED.format("4b115f5", "conv_backward"),
    ),
    "data_loading": Benchmark(
        "Loading a dataset: its time, and how far the peak memory grows.", data_loading
    ),
    "devices_scaling": Benchmark(
        "Data- and seed-parallel training over fake CPU devices: the cost of splitting, not a "
        "speed-up.",
        devices_scaling,
    ),
    "epoch_versions": Benchmark(
        "Steady training epochs of two copies of the code, taking turns.",
        side_by_side("steady epoch (median)"),
        REMOVED.format("4b115f5", "epoch_versions"),
    ),
    "epoch_vs_tutorial": Benchmark(
        "The compiled epoch and the whole program against the TPU 101 tutorial's loop.",
        epoch_vs_tutorial,
    ),
    "eval_overhead": Benchmark(
        "Evaluation after each epoch as a share of a preset's training time.", eval_overhead
    ),
    "first_block": Benchmark(
        "A kernel of jaxmnist's own for the CNN's first block, against the oneDNN calls it "
        "replaced (since removed).",
        first_block,
        REMOVED.format("3318e96^", "first_block"),
    ),
    "host_memory": Benchmark(
        "Freed host memory kept for reuse (`jaxmnist.hostmem`), with and without the growth "
        "check, against glibc's defaults.",
        host_memory,
    ),
    "memory_estimate": Benchmark(
        "The memory estimate against the measured peak, case by case.", memory_estimate
    ),
    "onednn_pool": Benchmark(
        "Max-pooling through oneDNN's calls against the written-out gradient.",
        speedups,
        REMOVED.format("4b115f5", "onednn_pool"),
    ),
    "pacing_overhead": Benchmark(
        "An epoch in calls that end by time, against one call per epoch.",
        pacing_overhead,
        REMOVED.format("4b115f5", "pacing_overhead"),
    ),
    "profile_cnn": Benchmark(
        "Where a `cnn` training step's time goes, by kind of operation.",
        profile,
        "`jaxmnist profile --preset cnn`",
    ),
    "profile_record": Benchmark(
        "Where a `record` training step's time goes, by kind of operation.",
        profile,
        "`jaxmnist profile --preset record`",
    ),
    "record": Benchmark(
        "The record presets as a user runs them, and the validation-split trials that chose "
        "their recipes.",
        record,
    ),
    "run_layer_before_after": Benchmark(
        "The run layer's reshaping: the code before and after it, alternated.",
        run_layer_before_after,
        "the commands the record names, by hand",
    ),
    "run_overhead": Benchmark(
        "What the report adds to a `tpu101` run, and the training process's peak memory.",
        run_overhead,
    ),
    "search_pruning": Benchmark(
        "The median pruner against none in `jaxmnist search`.",
        search_pruning,
        REMOVED.format("4b115f5", "search_pruning"),
    ),
    "seeds_vs_single": Benchmark(
        "Eight seeds in one program against one seed, whole programs side by side.",
        seeds_vs_single,
    ),
    "serve_load": Benchmark(
        "The `jaxmnist serve` server under load from concurrent clients on loopback.", serve_load
    ),
    "shuffle": Benchmark(
        "The epoch's shuffle from one-operand sorts, against `jax.random.permutation`.",
        shuffle,
        REMOVED.format("4b115f5", "shuffle"),
    ),
    "startup": Benchmark(
        "The command line's start-up, and importing the computing stack.", startup
    ),
    "stop_latency": Benchmark(
        "How soon Ctrl-C or SIGTERM stops a run inside an epoch.", stop_latency
    ),
    "tpu/time_to_result": Benchmark(
        "A user's first and second `tpu101` run against the TPU 101 tutorial's, and every "
        "preset's compile from an empty cache.",
        time_to_result,
        "`python benchmarks/tpu_time_to_result.py`",
    ),
}
