"""The record presets' claims: an ensemble's test accuracy, and the whole run's time.

For each preset, one `jaxmnist train --preset P` process run as a user runs it (the
report and checkpoints on), timed from start to exit (data loading, compiling,
training, evaluation and the report: the whole run). From its summary.json and
metrics.jsonl: the ensemble's test accuracy and loss (the mean of the members'
probabilities), the members' mean test accuracy with its 95% CI, and both after every
epoch. The machine's 1-minute load average is sampled every 30 s while the run goes
(other jobs slow it: a result keeps the range it saw).

Goals (#58), on one TPU v5e chip with an empty compilation cache: `record` (MNIST):
ensemble >= 99.80%, members' mean >= 99.65%, whole run <= 10 minutes; `fashion_record`
(Fashion-MNIST): ensemble >= 95.0%, members' mean >= 94.5%, whole run <= 10 minutes. On
another machine the figures are recorded against the same goals (a CPU has none of its
own: the record says how long the presets take there). Run it with an empty cache
(`XDG_CACHE_HOME` pointed at a new folder) to measure a first run.

The script never opens the device itself while the runs go: an accelerator that admits
one program at a time would refuse the next run. Each preset's machine is its run's own
environment.json.

On a machine too slow for the whole schedule (a 2-core CPU), `--steps N` runs the first N
steps of each preset instead (no report, no checkpoints) and projects the schedule's
training time from them: `projected_train_hours` is N steps' training time scaled to the
preset's steps, a projection and labelled so, not a measured run. `--set KEY=VALUE`
(repeatable) passes an override to every run and is recorded (`model.dtype=float32`, say).

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/record.py
       [--presets record,fashion_record] [--smoke] [--steps N] [--set KEY=VALUE ...]
Prints a line per preset and writes JSON (`--out`, default benchmarks/results/record/;
presets measured by earlier invocations stay in it, each with the environment and the load
average before and after its own run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from jaxmnist import config as config_lib
from jaxmnist import stats

from benchlib.launch import jaxmnist_command, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

GOALS = {
    "record": {"ensemble": 0.998, "members_mean": 0.9965, "minutes": 10},
    "fashion_record": {"ensemble": 0.95, "members_mean": 0.945, "minutes": 10},
}
# --smoke: the preset's recipe on the tiny dataset, shrunk to seconds, without the report
# (which this script does not read).
SMOKE_OVERRIDES = [
    "--seeds", "2", "train.steps=3", "train.batch_size=2", "model.channels=2,2,4,4",
    "model.hidden=4", "--no-report",
]  # fmt: skip


class LoadSampler:
    """The 1-minute load average every `every` seconds, in a thread, until stopped."""

    def __init__(self, every: float = 30.0):
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return self.samples


def run_preset(preset: str, work: Path, smoke: bool, steps=None, overrides=()) -> dict:
    """One whole `jaxmnist train --preset P` run; its figures against the goals. With
    `steps`, its first `steps` steps, and the schedule's training time projected."""
    launch, tiny = jaxmnist_command(smoke, work)
    run_dir = work / preset
    args = ["train", "--preset", preset, "--quiet", *tiny, *(SMOKE_OVERRIDES if smoke else [])]
    args += list(overrides)
    if steps is not None:
        args += [f"train.steps={steps}", "--no-report", "--no-checkpoint"]
    args += ["--run-dir", str(run_dir)]  # a scratch folder: left out of the recorded command
    sampler = LoadSampler()
    t0 = time.perf_counter()
    proc = subprocess.run([*launch, *args], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    load = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"jaxmnist {' '.join(args)} failed: {proc.stderr.strip()[-800:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    # The run's own record of its machine: this process never opens the device, which
    # holds an accelerator that admits one program at a time (a TPU) against the next run.
    environment = json.loads((run_dir / "environment.json").read_text())
    common = {
        "command": "jaxmnist " + " ".join(args[:-2]),
        "overrides": list(overrides),  # `--set`: a variant of the preset, not the preset
        "wall_seconds": wall,
        "compile_seconds": s["compile_seconds"],
        "train_seconds": s["train_seconds"],
        "members": len(environment["seeds"]),
        "load_during": {"min": min(load), "max": max(load), "samples": load},
        "environment": environment,
    }
    if steps is not None:
        return {**common, **_projection(preset, overrides, s, environment, steps)}
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    members = stats.spread(s["test_accuracy_per_seed"])
    goal = GOALS[preset]
    met = {
        "ensemble": s["ensemble_test_accuracy"] >= goal["ensemble"],
        "minutes": wall <= 60 * goal["minutes"],
    }
    if goal["members_mean"] is not None:
        met["members_mean"] = members.mean >= goal["members_mean"]
    return {
        **common,
        "goal": goal,
        "met": met,
        "eval_seconds": s["eval_seconds"],
        "epochs": s["epochs"],
        "ensemble_test_accuracy": s["ensemble_test_accuracy"],
        "ensemble_test_loss": s["ensemble_test_loss"],
        "members_mean_test_accuracy": members.mean,
        "members_ci95": members.ci95,
        "members_min": members.min,
        "members_max": members.max,
        "test_accuracy_per_seed": s["test_accuracy_per_seed"],
        "curve": [
            {
                "epoch": r["epoch"],
                "ensemble_test_accuracy": r.get("ensemble_test_accuracy"),
                "members_mean_test_accuracy": r["test_accuracy"],
                "epoch_seconds": r["epoch_seconds"],
            }
            for r in records
        ],
    }


def _projection(preset, overrides, summary, environment, steps) -> dict:
    """What a run of the first `steps` steps adds: its time a step, and the training time
    of the preset's whole schedule (with the `--set` overrides) projected from it."""
    pairs = dict(o.split("=", 1) for o in overrides)
    full = config_lib.apply_overrides(config_lib.get_preset(preset), pairs)
    full_steps = full.train.steps or full.train.epochs * environment["steps_per_epoch"]
    per_step = summary["train_seconds"] / steps
    return {
        "partial": True,
        "steps": steps,
        "seconds_per_step": per_step,
        "schedule_steps": full_steps,
        "projected_train_hours": per_step * full_steps / 3600,
    }


def describe(preset: str, r: dict) -> str:
    if r.get("partial"):
        return (
            f"{preset}: {r['steps']} steps of {r['members']} members, "
            f"{r['seconds_per_step']:.2f} s a step after {r['compile_seconds']:.0f} s of "
            f"compiling; its {r['schedule_steps']} steps would train for about "
            f"{r['projected_train_hours']:.1f} h (projected)"
        )
    ci = r["members_ci95"]
    ci_text = f", 95% CI {ci[0]:.2%}-{ci[1]:.2%}" if ci else ""
    verdict = ", ".join(f"{k} {'met' if ok else 'MISSED'}" for k, ok in r["met"].items())
    return (
        f"{preset}: ensemble of {r['members']} {r['ensemble_test_accuracy']:.2%} "
        f"(goal {r['goal']['ensemble']:.2%}); members' mean {r['members_mean_test_accuracy']:.2%}"
        f"{ci_text}; whole run {r['wall_seconds'] / 60:.1f} min (goal {r['goal']['minutes']} "
        f"min; training {r['train_seconds']:.0f} s, evaluation {r['eval_seconds']:.0f} s); "
        f"load {r['load_during']['min']:.1f}-{r['load_during']['max']:.1f}: {verdict}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="record,fashion_record")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/record/")
    p.add_argument("--steps", type=int, help="only the first N steps; project the rest")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        sys.exit(f"--steps: a positive number of steps, got {args.steps}")
    presets = args.presets.split(",")
    unknown = [x for x in presets if x not in GOALS]
    if unknown:
        sys.exit(f"unknown preset {unknown[0]!r}: this measures {', '.join(GOALS)}")
    require_data_dir(args.smoke, "the datasets")
    out = args.out or default_out("record.json", args.smoke)
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="record-") as work:
        for preset in presets:
            before = os.getloadavg()
            results[preset] = run_preset(preset, Path(work), args.smoke, args.steps, args.set)
            results[preset]["load_average_around"] = {
                "before": list(before),
                "after": list(os.getloadavg()),
            }
            print(describe(preset, results[preset]), flush=True)
    previous = json.loads(out.read_text()) if out.exists() else {}
    print(save_benchmark(out, {"presets": {**previous.get("presets", {}), **results}}, load_before))


if __name__ == "__main__":
    main()
