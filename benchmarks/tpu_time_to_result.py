"""A user's first run against the TPU 101 tutorial's: whole processes, and every preset's
compile with an empty compilation cache.

Measures, on one machine in one run, as separate processes one after another (a TPU
admits one program at a time; this process opens the device only once every run has
ended, to record the environment):

1. Whole programs, as a user starts them: `python benchmarks/tutorial_tpu101.py`, then
   `jaxmnist train --preset tpu101` with an empty compilation cache (a user's first
   run: report and checkpoints as by default), the tutorial again, then jaxmnist again
   with the cache the first run left (every later run). The ratios are jaxmnist's
   whole process over the tutorial's run just before it: `cold_ratio`, `warm_ratio`.
   jaxmnist sizes the TPU runtime's transfer buffer to the run (`hostmem`), which
   shortens opening the chip; the tutorial then runs once more with the same setting
   given by hand, so `same_buffer_ratio` (jaxmnist warm over it) says what is left
   without that runtime setting.
2. Compile: `jaxmnist train --preset P --epochs 1 --no-report --no-checkpoint` for
   each of `--presets` (`speedrun8`: `speedrun --seeds 8`), `--repeats` times each, every
   time in a new process with an empty compilation cache (`tpu101`'s first is the whole
   run of part 1): the run's own `compile_seconds` (the wall clock from the first
   program lowered to the last compiled; they compile at once), as its summary.json says
   it. A preset's `compile_seconds` is the median of its runs, `compile_samples` every
   run's in order; `compile_programs` is each program's median compile.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/tpu_time_to_result.py
Writes JSON (`--out`, default a new record in benchmarks/results/tpu/time_to_result/, on
whatever machine: its name says which) with the commit and date it measured. `--smoke`:
tiny data, the tutorial's smoke mode (run once, the denominator of both ratios), one preset.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib.launch import jaxmnist_command, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, provenance, save_benchmark

HERE = Path(__file__).resolve().parent
# Goals (TPU v5e): whole-process ratios against the tutorial, and compile seconds.
TARGETS = {
    "cold_ratio": 0.6,
    "warm_ratio": 0.5,
    "compile_seconds": {
        "tpu101": 3.0,
        "codelab": 3.0,
        "speedrun8": 8.0,
        "record": 20.0,
        "fashion_record": 20.0,
    },
}
# `cnn` and `speedrun`: one CNN each, whose first layer's convolution once made a single
# model's compile the longest of all (docs/tpu-gpu.md); no goal of their own.
PRESETS = "tpu101,codelab,speedrun8,record,fashion_record,cnn,speedrun"


def preset_args(name: str) -> list[str]:
    """The `train` arguments of a preset name of `--presets` (`NAME8`: 8 seeds)."""
    if name.endswith("8"):
        return ["--preset", name[:-1], "--seeds", "8"]
    return ["--preset", name]


def timed(argv: list[str], env: dict, limit: float) -> tuple[float, subprocess.CompletedProcess]:
    """(whole-process wall seconds, the finished process); exits with one line on failure."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=limit, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        shown = " ".join(a for a in argv if "\n" not in a)
        sys.exit(f"{shown} failed (exit {done.returncode}): " + " | ".join(tail))
    return seconds, done


def summary_of(done: subprocess.CompletedProcess) -> dict:
    """The summary `train --json` printed on stdout."""
    return json.loads(done.stdout[done.stdout.index("{") :])


def compile_figures(runs: list[dict]) -> dict:
    """A preset's compile over its cold runs' summaries: the median of their seconds,
    every run's in order, each program's median, and the first run's training seconds."""
    programs = [run.get("compile_programs", {}) for run in runs]
    return {
        "compile_seconds": statistics.median(run["compile_seconds"] for run in runs),
        "compile_samples": [run["compile_seconds"] for run in runs],
        "compile_programs": {
            name: statistics.median(p[name] for p in programs if name in p) for name in programs[0]
        },
        "train_seconds": runs[0]["train_seconds"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default=PRESETS, help=f"compiled cold, one by one ({PRESETS})")
    p.add_argument("--limit", type=float, default=240.0, help="seconds each process may take")
    p.add_argument(
        "--repeats", type=int, default=3, help="cold compiles of each preset, a median (3)"
    )
    p.add_argument("--out", type=Path, help="JSON output")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    given = sys.argv[1:] if argv is None else argv  # the arguments, as run
    args = p.parse_args(given)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    require_data_dir(args.smoke)
    load_before = os.getloadavg()
    presets = ["tpu101"] if args.smoke else args.presets.split(",")
    with tempfile.TemporaryDirectory(prefix="jaxmnist-ttr-") as tmp:
        work = Path(tmp)
        cmd, extra = jaxmnist_command(args.smoke, work)
        steps = ["--steps", "4", "--batch-size", "2"] if args.smoke else []
        tutorial = [sys.executable, str(HERE / "tutorial_tpu101.py")]
        tutorial += ["--smoke"] * args.smoke
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        def train(name: str, cache: str, *flags: str) -> tuple[float, dict]:
            run_dir = work / "runs" / f"{name}-{len(list(work.glob('runs/*')))}"
            seconds, done = timed(
                [*cmd, "train", *preset_args(name), *extra, *steps, *flags]
                + ["--run-dir", str(run_dir), "--json"],
                {**env, "XDG_CACHE_HOME": str(work / cache)},
                args.limit,
            )
            environments.append(json.loads((run_dir / "environment.json").read_text()))
            return seconds, summary_of(done)

        environments: list[dict] = []  # as the runs saw it: this process never opens a device

        whole = {}
        again = "" if args.smoke else " tutorial,"
        print(f"whole programs: tutorial, jaxmnist (empty cache),{again} jaxmnist (warm)")
        whole["tutorial_cold_seconds"], _ = timed(tutorial, env, args.limit)
        whole["jaxmnist_cold_seconds"], cold = train("tpu101", "cache-first")
        if args.smoke:  # one tutorial process is enough to check the script: both ratios use it
            whole["tutorial_warm_seconds"] = whole["tutorial_cold_seconds"]
        else:
            whole["tutorial_warm_seconds"], _ = timed(tutorial, env, args.limit)
        whole["jaxmnist_warm_seconds"], warm = train("tpu101", "cache-first")
        buffer = environments[-1].get("tpu_transfer_buffer")
        if buffer and buffer["set_by"] == "jaxmnist":  # the same runtime setting, given by hand
            size = str(buffer["bytes"])
            tuned = {**env, "TPU_PREMAPPED_BUFFER_SIZE": size}
            tuned["TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"] = size
            whole["tutorial_same_buffer_seconds"], _ = timed(tutorial, tuned, args.limit)
        for key, value in whole.items():
            print(f"  {key:<24} {value:7.2f} s")
        compiles = {}
        epoch = ["--epochs", "1"] if not args.smoke else []
        flags = [*epoch, "--no-report", "--no-checkpoint"]
        for name in presets:
            # tpu101's first: the whole cold run above, the same compile with an empty cache
            runs = [cold] if name == "tpu101" else []
            while len(runs) < args.repeats:
                runs.append(train(name, f"cache-{name}-{len(runs)}", *flags)[1])
            compiles[name] = compile_figures(runs)
            samples = " ".join(f"{s:.2f}" for s in compiles[name]["compile_samples"])
            print(f"  compile {name:<16} {compiles[name]['compile_seconds']:7.2f} s ({samples})")
    measured = provenance()  # untracked files (a session's scratch) leave a checkout clean
    figures = {
        **{key: measured[key] for key in ("date", "commit", "dirty")},
        "command": " ".join(["python", "benchmarks/tpu_time_to_result.py", *given]),
        "smoke": args.smoke,
        "cold_ratio": whole["jaxmnist_cold_seconds"] / whole["tutorial_cold_seconds"],
        "warm_ratio": whole["jaxmnist_warm_seconds"] / whole["tutorial_warm_seconds"],
        **whole,
        "same_buffer_ratio": (
            whole["jaxmnist_warm_seconds"] / whole["tutorial_same_buffer_seconds"]
            if "tutorial_same_buffer_seconds" in whole
            else None
        ),
        "tpu_transfer_buffer": environments[0].get("tpu_transfer_buffer"),
        "jaxmnist_cold_compile_seconds": cold["compile_seconds"],
        "jaxmnist_warm_compile_seconds": warm["compile_seconds"],
        "jaxmnist_cold_test_accuracy": cold["test_accuracy"],
        "compile_tpu101_s": compiles.get("tpu101", {}).get("compile_seconds"),
        "compile_speedrun8_s": compiles.get("speedrun8", {}).get("compile_seconds"),
        "compile": compiles,
        "compile_repeats": args.repeats,
        "targets": TARGETS,
    }
    print(f"cold ratio {figures['cold_ratio']:.2f}x, warm ratio {figures['warm_ratio']:.2f}x")
    out = args.out or default_out("tpu/time_to_result.json", args.smoke)
    print(save_benchmark(out, figures, load_before))  # opens the device: every run has ended


if __name__ == "__main__":
    main()
