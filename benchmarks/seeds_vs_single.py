"""`jaxmnist train --seeds 8` against a single-seed run, whole programs side by side.

Runs `jaxmnist train --preset tpu101 --no-report` (one seed) and the same with
`--seeds 8` as separate processes, back to back, alternating which goes first,
`--repeats` times each, with a private persistent compilation cache: the first
pair starts from an empty cache (a user's first run: noted, not in the medians),
the timed pairs find it warm (a user's second run). For each process: wall time
and peak resident memory (`wait4`), and its summary.json (compile, training and
evaluation time; test accuracy per seed). Reported: median wall times, their
ratio (target: 8 seeds <= 5x one seed) and the 8 seeds' mean test accuracy with
its 95% CI (target: mean >= 97.3%). The machine's load average before and after
is saved too: other processes on a shared machine inflate both runs.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/seeds_vs_single.py [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/seeds_vs_single/).
`--smoke` runs one pair, of one seed against 2, for one epoch on a tiny generated
dataset, through the same command line; its empty-cache pair is also its timed pair (one
process of each program is enough to check the script end to end).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxmnist import runtime, stats

from benchlib.launch import jaxmnist_command
from benchlib.results import SMOKE_HELP, default_out, provenance

TARGETS = {"wall_ratio": 5.0, "mean_test_accuracy": 0.973}


def run_program(cmd: list[str], env: dict, run_dir: Path) -> dict:
    """Runs one `jaxmnist train`; returns wall seconds, peak RSS (MB) and its summary."""
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        err = proc.stderr.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err.strip()[-500:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    keep = (
        "test_accuracy",
        "test_accuracy_std",
        "test_accuracy_ci95",
        "test_accuracy_per_seed",
        "compile_seconds",
        "train_seconds",
        "eval_seconds",
        "wall_seconds",
        "steady_epoch_seconds",
    )
    return {
        "wall_seconds": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        **{k: summary[k] for k in keep if k in summary},
    }


def spread(xs: list[float]) -> dict:
    return {
        "median": float(np.median(xs)),
        "min": float(min(xs)),
        "max": float(max(xs)),
        "n": len(xs),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each program (warm cache)"
    )
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--preset", default="tpu101")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--out", help="default: a new record in results/seeds_vs_single/")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else default_out("seeds_vs_single.json", args.smoke)
    if args.smoke:
        args.repeats, args.seeds = 0, 2

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_CACHE_HOME": tmp}  # a private compilation cache, empty at first
        launch, extra = jaxmnist_command(args.smoke, Path(tmp))
        extra += ["--epochs", "1", "train.batch_size=2"] if args.smoke else []
        # --overwrite: each program runs again into the run directory of its last run.
        base = [*launch, "train", "--preset", args.preset, "--no-report", "--quiet", "--overwrite"]
        base += extra
        cmds = {
            "single": (base + ["--run-dir", f"{tmp}/single"], Path(tmp) / "single"),
            "seeds": (
                base + ["--seeds", str(args.seeds), "--run-dir", f"{tmp}/seeds"],
                Path(tmp) / "seeds",
            ),
        }
        cold = {name: run_program(cmd, env, d) for name, (cmd, d) in cmds.items()}
        runs = {"single": [], "seeds": []}
        for r in range(args.repeats):
            order = ("single", "seeds") if r % 2 == 0 else ("seeds", "single")
            for name in order:
                cmd, d = cmds[name]
                runs[name].append(run_program(cmd, env, d))
        if args.smoke:
            runs = {name: [run] for name, run in cold.items()}
    walls = {k: spread([x["wall_seconds"] for x in v]) for k, v in runs.items()}
    last = runs["seeds"][-1]
    acc = stats.spread(last["test_accuracy_per_seed"])
    result = {
        "command": {
            k: " ".join(["jaxmnist", *c[len(launch) + 1 :]]).replace(f"{tmp}/", "")
            for k, (c, _) in cmds.items()
        },
        "targets": TARGETS,
        "seeds": args.seeds,
        "wall_seconds": walls,
        "wall_ratio": walls["seeds"]["median"] / walls["single"]["median"],
        "paired_wall_ratios": [
            s["wall_seconds"] / o["wall_seconds"] for s, o in zip(runs["seeds"], runs["single"])
        ],
        "cold_cache": {k: v["wall_seconds"] for k, v in cold.items()},
        "wall_ratio_cold_cache": cold["seeds"]["wall_seconds"] / cold["single"]["wall_seconds"],
        "train_seconds": {k: spread([x["train_seconds"] for x in v]) for k, v in runs.items()},
        "eval_seconds": {k: spread([x["eval_seconds"] for x in v]) for k, v in runs.items()},
        "train_ratio": (
            np.median([x["train_seconds"] for x in runs["seeds"]])
            / np.median([x["train_seconds"] for x in runs["single"]])
        ),
        "peak_rss_mb": {k: max(x["peak_rss_mb"] for x in v) for k, v in runs.items()},
        "single_test_accuracy": runs["single"][-1]["test_accuracy"],
        "seeds_test_accuracy": {
            "mean": acc.mean,
            "std": acc.std,
            "ci95": acc.ci95,
            "min": acc.min,
            "max": acc.max,
            "per_seed": last["test_accuracy_per_seed"],
        },
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "runs": runs,
        "cold_runs": cold,
        "environment": runtime.environment(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "provenance": provenance()}, indent=2) + "\n")
    print_table(result)
    print(f"\nwritten: {out}")


def print_table(r: dict) -> None:
    env, w, n = r["environment"], r["wall_seconds"], r["seeds"]
    print(
        f"{env['backend']} / {env['cpu_model']} ({env['cpu_count']} cores), jax {env['jax']}; "
        f"load average before {r['load_average']['before'][0]:.2f}, "
        f"after {r['load_average']['after'][0]:.2f}"
    )
    print(f"{'':34}{'1 seed':>10}{f'{n} seeds':>10}{'ratio':>8}{'target':>10}")
    ok = "ok" if r["wall_ratio"] <= TARGETS["wall_ratio"] else "MISS"
    print(
        f"{'whole program wall s (median)':34}"
        f"{w['single']['median']:>10.2f}{w['seeds']['median']:>10.2f}{r['wall_ratio']:>8.2f}"
        f"{'<= 5':>10}  {ok}"
    )
    print(
        f"{'  range':34}{w['single']['min']:>5.1f}-{w['single']['max']:<4.1f}"
        f"{w['seeds']['min']:>5.1f}-{w['seeds']['max']:<4.1f}  paired ratios "
        + ", ".join(f"{x:.2f}" for x in r["paired_wall_ratios"])
    )
    c = r["cold_cache"]
    print(
        f"{'  empty compilation cache':34}{c['single']:>10.2f}{c['seeds']:>10.2f}"
        f"{r['wall_ratio_cold_cache']:>8.2f}"
    )
    t, e = r["train_seconds"], r["eval_seconds"]
    print(
        f"{'training s (compiled epochs)':34}"
        f"{t['single']['median']:>10.2f}{t['seeds']['median']:>10.2f}{r['train_ratio']:>8.2f}"
    )
    print(
        f"{'evaluation s':34}{e['single']['median']:>10.2f}{e['seeds']['median']:>10.2f}"
        f"{e['seeds']['median'] / e['single']['median']:>8.2f}"
    )
    m = r["peak_rss_mb"]
    print(f"{'peak resident MB':34}{m['single']:>10.0f}{m['seeds']:>10.0f}")
    a = r["seeds_test_accuracy"]
    ok = "ok" if a["mean"] >= TARGETS["mean_test_accuracy"] else "MISS"
    print(
        f"{'test accuracy':34}{100 * r['single_test_accuracy']:>9.2f}%{100 * a['mean']:>9.2f}%"
        f"{'':>8}{'>= 97.3%':>10}  {ok}"
    )
    print(
        f"  {n} seeds: {100 * a['mean']:.2f}% ± {100 * a['std']:.2f}% "
        f"(95% CI {100 * a['ci95'][0]:.2f}–{100 * a['ci95'][1]:.2f}%), "
        f"min {100 * a['min']:.2f}%, max {100 * a['max']:.2f}%"
    )


if __name__ == "__main__":
    main()
