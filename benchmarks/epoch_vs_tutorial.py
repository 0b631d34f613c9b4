"""jaxmnist's compiled epoch against the TPU 101 tutorial's loop, side by side.

Measures, on one machine in one run:

1. Steady-state epoch time of the tutorial's loop (host batches copied every
   step, one jitted step per batch, one sync per epoch) and of jaxmnist's scanned
   epoch, same model, optimizer and batch (`tpu101`). One untimed warm-up epoch
   each (compilation), then the two alternate for `--rounds` epochs so that
   machine noise hits both alike; medians and ranges are reported.
2. Achieved FLOP/s of each against a large float32 matmul measured in the same
   run: the fraction of measured peak, and the epoch time that peak implies.
3. Whole programs, as separate processes, alternating: `python
   benchmarks/tutorial_tpu101.py` and `jaxmnist train --preset tpu101`, each
   `--runs` times: wall time and peak resident memory (from `wait4`). jaxmnist is
   measured with `--no-report` (the same work as the tutorial script) and with
   its default HTML report, with a warm persistent compilation cache (what every
   run after the first gets) and, once, with an empty one.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/epoch_vs_tutorial.py
Prints a table and writes JSON (`--out`, default benchmarks/results/epoch_vs_tutorial/).
`--smoke` runs parts 1 and 2 for one round on tiny random data and skips part 3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import optim, runtime
from jaxmnist.bench.measure import synthetic_dataset
from jaxmnist.data import load_dataset
from jaxmnist.models import mlp
from jaxmnist.profiling.peak import default_size, measure_matmul_peak
from jaxmnist.training.loop import place_train_data
from jaxmnist.training.step import init_state, make_train_epoch

from benchlib.results import SMOKE_HELP, default_out, provenance
from tutorial_tpu101 import TutorialLoop

HERE = Path(__file__).resolve().parent
TARGETS = {"epoch_ratio": 0.33, "peak_fraction": 0.75, "wall_ratio": 0.4, "peak_rss_mb": 600}


class JaxmnistEpoch:
    """jaxmnist's `tpu101` epoch, compiled ahead of time, state carried across calls."""

    def __init__(self, ds, cfg):
        plan = config_lib.plan_steps(cfg.train, len(ds.train_labels))
        optimizer = optim.make_optimizer(cfg.optimizer, plan.total_steps)
        self.state = jax.jit(lambda k: init_state(k, cfg, optimizer, (28, 28), 10))(
            jax.random.key(0)
        )
        self.data = place_train_data(ds.train_images, ds.train_labels)
        self.key = jax.random.key(1)
        fn = make_train_epoch(cfg, optimizer, plan.steps_per_epoch)
        self.fn = jax.jit(fn, donate_argnums=0).lower(self.state, self.key, self.data).compile()
        self.keys = iter(jax.random.split(self.key, 1000))

    def epoch(self) -> float:
        self.state, metrics = self.fn(self.state, next(self.keys), self.data)
        return float(jax.device_get(metrics.loss).mean())


def time_epochs(loops: dict, rounds: int) -> dict[str, list[float]]:
    """One warm-up epoch each, then `rounds` alternating timed epochs."""
    for loop in loops.values():
        loop.epoch()
    times = {name: [] for name in loops}
    for _ in range(rounds):
        for name, loop in loops.items():
            t0 = time.perf_counter()
            loop.epoch()  # both end in a host read of the loss: a full sync
            times[name].append(time.perf_counter() - t0)
    return times


# A lean parent for each measured program: on Linux a child's ru_maxrss counts
# the memory it inherited at fork, so forking straight from this process (which
# holds JAX and both training loops) would inflate every figure.
RUNNER = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = proc.stderr.read()
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - t0
rc = os.waitstatus_to_exitcode(status)
print(json.dumps({"wall": wall, "maxrss_kb": usage.ru_maxrss, "rc": rc,
                  "stderr": err.decode()[-500:]}))
"""


def run_program(cmd: list[str], env: dict) -> tuple[float, float]:
    """Runs `cmd`; returns (wall seconds, peak RSS in MB) of that process alone."""
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, *cmd], env=env, capture_output=True, text=True, check=True
    )
    r = json.loads(out.stdout)
    if r["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r['rc']}): {r['stderr'].strip()}")
    return r["wall"], r["maxrss_kb"] / 1024


def time_programs(runs: int) -> dict:
    """Whole programs, alternating. jaxmnist is run as the tutorial script runs
    (`--no-report`: the same work) and as users get it by default (with the report)."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        env["XDG_CACHE_HOME"] = tmp  # a private compilation cache, empty at first
        train = [
            sys.executable,
            "-m",
            "jaxmnist",
            "train",
            "--preset",
            "tpu101",
            "--quiet",
            "--run-dir",
            f"{tmp}/run",
            "--overwrite",
        ]
        cmds = {
            "tutorial": [sys.executable, str(HERE / "tutorial_tpu101.py")],
            "jaxmnist": [*train, "--no-report"],
            "jaxmnist_with_report": train,
        }
        cold = run_program(cmds["jaxmnist"], env)
        measured = {name: [] for name in cmds}
        for _ in range(runs):
            for name, cmd in cmds.items():
                measured[name].append(run_program(cmd, env))
    walls = {k: stats([w for w, _ in v]) for k, v in measured.items()}
    tutorial = walls["tutorial"]["median"]
    return {
        "wall_seconds": walls,
        "jaxmnist_cold_cache_wall_seconds": cold[0],
        "peak_rss_mb": {k: max(m for _, m in v) for k, v in measured.items()},
        "wall_ratio": walls["jaxmnist"]["median"] / tutorial,
        "wall_ratio_with_report": walls["jaxmnist_with_report"]["median"] / tutorial,
        "wall_ratio_cold_cache": cold[0] / tutorial,
    }


def stats(xs: list[float]) -> dict:
    return {
        "median": float(np.median(xs)),
        "min": float(min(xs)),
        "max": float(max(xs)),
        "n": len(xs),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed epochs of each loop")
    parser.add_argument("--runs", type=int, default=3, help="whole-program runs of each script")
    parser.add_argument("--skip-programs", action="store_true", help="skip the whole-program part")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--out", help="default benchmarks/results/epoch_vs_tutorial/")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else default_out("epoch_vs_tutorial.json", args.smoke)

    cfg = config_lib.get_preset("tpu101")
    if args.smoke:  # the programs of part 3 read the real data: skipped
        ds = synthetic_dataset("mnist", train_size=512, test_size=64)
        args.rounds, args.skip_programs = 1, True
    else:
        ds = load_dataset("mnist", download=False)
    # The programs first: this process has not opened the device yet, and an accelerator
    # that one program at a time can hold (a TPU) would refuse them once it had.
    programs = None if args.skip_programs else time_programs(args.runs)
    steps = len(ds.train_labels) // cfg.train.batch_size
    epoch_flops = mlp.flops_per_example(cfg.model) * steps * cfg.train.batch_size

    times = time_epochs(
        {
            "tutorial": TutorialLoop(ds.train_images, ds.train_labels),
            "jaxmnist": JaxmnistEpoch(ds, cfg),
        },
        args.rounds,
    )
    if args.smoke:
        peak_report = measure_matmul_peak("float32", 64, windows=1, min_window_seconds=0.0)
    else:
        peak_report = measure_matmul_peak("float32", default_size(jax.default_backend()))
    peak = peak_report["flops_per_second"]["median"]
    tut, ours = (stats(times[k]) for k in ("tutorial", "jaxmnist"))
    result = {
        "config": cfg.to_dict(),
        "environment": runtime.environment(),
        "epoch_seconds": {"tutorial": tut, "jaxmnist": ours},
        "epoch_ratio": ours["median"] / tut["median"],
        "epoch_gflop": epoch_flops / 1e9,
        "matmul_peak_gflops": peak / 1e9,
        "matmul_peak": peak_report,
        "matmul_limited_epoch_seconds": epoch_flops / peak,
        "peak_fraction": {
            "tutorial": epoch_flops / tut["median"] / peak,
            "jaxmnist": epoch_flops / ours["median"] / peak,
        },
    }

    if programs is not None:
        result["programs"] = programs

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "provenance": provenance()}, indent=2) + "\n")
    print_table(result)
    print(f"\nwritten: {out}")


def print_table(r: dict) -> None:
    e = r["epoch_seconds"]
    env = r["environment"]
    print(
        f"{env['backend']} / {env['device_kind']} / {env['cpu_model']} "
        f"({env['cpu_count']} cores), jax {env['jax']}"
    )
    n = r["matmul_peak"]["matmul_shape"][0]
    print(
        f"matmul peak ({n}^3 float32): {r['matmul_peak_gflops']:.1f} GFLOP/s; "
        f"epoch = {r['epoch_gflop']:.1f} GFLOP -> {r['matmul_limited_epoch_seconds']:.3f} s at peak"
    )
    print(f"{'':28}{'tutorial':>12}{'jaxmnist':>12}{'ratio':>8}{'target':>10}")

    def row(name, a, b, ratio, target, fmt="{:.3f}"):
        ok = "" if target is None else ("  ok" if ratio <= target else "  MISS")
        t = "" if target is None else f"<= {target}"
        print(f"{name:28}{fmt.format(a):>12}{fmt.format(b):>12}{ratio:>8.2f}{t:>10}{ok}")

    row(
        "steady epoch s (median)",
        e["tutorial"]["median"],
        e["jaxmnist"]["median"],
        r["epoch_ratio"],
        TARGETS["epoch_ratio"],
    )
    pf = r["peak_fraction"]
    print(
        f"{'fraction of matmul peak':28}{pf['tutorial']:>12.2f}{pf['jaxmnist']:>12.2f}{'':>8}"
        f"{'>= ' + str(TARGETS['peak_fraction']):>10}"
        f"{'  ok' if pf['jaxmnist'] >= TARGETS['peak_fraction'] else '  MISS'}"
    )
    if "programs" in r:
        p = r["programs"]
        w = p["wall_seconds"]
        row(
            "whole program wall s",
            w["tutorial"]["median"],
            w["jaxmnist"]["median"],
            p["wall_ratio"],
            TARGETS["wall_ratio"],
        )
        print(
            f"{'  jaxmnist, empty cache':28}{'':>12}"
            f"{p['jaxmnist_cold_cache_wall_seconds']:>12.3f}{p['wall_ratio_cold_cache']:>8.2f}"
        )
        print(
            f"{'  jaxmnist, with report':28}{'':>12}"
            f"{w['jaxmnist_with_report']['median']:>12.3f}{p['wall_ratio_with_report']:>8.2f}"
        )
        m = p["peak_rss_mb"]
        print(
            f"{'peak resident MB':28}{m['tutorial']:>12.0f}{m['jaxmnist']:>12.0f}"
            f"{'':>8}{'<= 600':>10}"
            f"{'  ok' if m['jaxmnist'] <= TARGETS['peak_rss_mb'] else '  MISS'}"
        )
        print(f"{'  jaxmnist, with report':28}{'':>12}{m['jaxmnist_with_report']:>12.0f}")


if __name__ == "__main__":
    main()
