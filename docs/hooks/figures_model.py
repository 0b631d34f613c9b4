"""The readers of what models reach and how fast they train: accuracy over seeds, the
record presets and their trials, steps and epochs against other ways of training, the
convolution's and the augmentation's formulations, profiles.

Each takes a record (its JSON) and returns rows of (what, figure), every figure formatted
from the record's own values (`formats`); `headlines.BENCHMARKS` says which reads which
benchmark's records. A reader meets the formats its folder's records have had, and raises
KeyError on one it does not know.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from formats import ci, copy, mb, met, ms, pct, plural, range_of, rate, ratio, sec, us

Rows = list[tuple[str, str]]


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
            if p.get("partial"):  # its first steps, the schedule's training projected
                rows.append(
                    (
                        f"`{name}`, its first {p['steps']} steps, {p['members']} members"
                        + "".join(f", `{a}`" for a in p["command"].split() if "dtype" in a),
                        (
                            f"{sec(p['seconds_per_step'])} a step after "
                            f"{sec(p['compile_seconds'], 0)} of compiling; its "
                            f"{p['schedule_steps']:,} steps: about "
                            f"{p['projected_train_hours']:.1f} h of training (projected)"
                        ),
                    )
                )
                continue
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


def _whole_run(v: dict, programs: tuple[str, ...]) -> str:
    """A whole run's compile (with those of `programs` it has), steady epoch and test
    accuracy, as `benchlib.launch.patched_train` records them."""
    compiled = v["compile_programs"]
    parts = ", ".join(f"{name} {sec(compiled[name])}" for name in programs if name in compiled)
    return (
        f"compile {sec(v['compile_seconds'])}"
        + (f" ({parts})" if parts else "")
        + f"; steady epoch {sec(v['steady_epoch_seconds'], 3)}; test {pct(v['test_accuracy'])}"
    )


def first_conv(r: dict) -> Rows:
    return [
        (f"`{run}`, first layer {arm} ({v['first_layer']})", _whole_run(v, ("steps",)))
        for run, arms in r["arms"].items()
        for arm, v in arms.items()
    ]


def staged_batches(r: dict) -> Rows:
    rows = [
        (f"`{run}`, {mode}", _whole_run(v, ("steps", "stage")))
        for run, modes in r["pairs"].items()
        for mode, v in modes.items()
    ]
    staged = r.get("time_to_result_staged")  # the first record's (a TPU program's staging)
    if staged is None:
        return rows
    before = staged["without_staging_compile_seconds"]
    text = ", ".join(
        f"{p} {sec(s)}" + (f" (unstaged, an earlier call: {sec(before[p])})" if p in before else "")
        for p, s in staged["compile_seconds"].items()
    )
    rows.append(("every preset's compile, staged, from an empty cache", text))
    return rows
