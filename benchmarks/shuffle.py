"""What the epoch's shuffle costs, drawn by `jax.random.permutation` and by jaxmnist's
`training.shuffle.permutation` (the same permutation, bit for bit, from one-operand sorts).

Two measurements, each alternating the two ways so that a load that comes and goes
falls on both alike:

- the shuffle alone: one jitted program drawing the permutations of 1, 16 and 256
  members (vmapped, as an epoch's plan draws them) of the 60,000 training examples;
  medians of interleaved windows, per member, and a check that both give the same
  permutations;
- whole runs of `jaxmnist train` in fresh processes: `tpu101` (one member, 5 epochs;
  three runs a round, as its epochs are short and noisy) and a population of 256 small
  MLPs (784-32-10, 2 epochs), once as jaxmnist runs and once with the library's
  permutation put back in its place; the steady epoch's seconds (the median of the
  epochs after the first, from metrics.jsonl) and the test accuracy, which must be the
  same.

Needs MNIST where JAXMNIST_DATA_DIR (or the cache) has it, except with --smoke.

Usage: python benchmarks/shuffle.py [--rounds 2] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/shuffle/).
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

import jax
import numpy as np

from jaxmnist.training import shuffle

from benchlib.launch import jaxmnist_command, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

EXAMPLES = 60_000
MEMBERS = (1, 16, 256)
# name -> (arguments, runs per round: a short run's epochs are noisier, and cheap)
RUNS = {
    "tpu101": (["--preset", "tpu101"], 3),
    "tpu101, 256 members of 784-32-10": (
        ["--preset", "tpu101", "--seeds", "256", "--epochs", "2", "model.hidden=32"], 1,
    ),
}  # fmt: skip
# Starts `jaxmnist` (CODE: the package's entry, or a smoke run's launcher) with the
# library's permutation in jaxmnist's place when WAY is "library".
LAUNCH = """\
import sys
import jax
from jaxmnist.training import shuffle
way, code, *sys.argv[1:] = sys.argv[1:]
if way == "library":
    shuffle.permutation = lambda key, n, platform=None: jax.random.permutation(key, n)
exec(compile(code, "<jaxmnist>", "exec"))
"""
MAIN = "from jaxmnist.cli import main\nsys.exit(main(sys.argv[1:]))\n"
WAYS = {"library": jax.random.permutation, "jaxmnist": shuffle.permutation}


def shuffle_alone(members: int, n: int, windows: int) -> dict:
    """Milliseconds per member of each way's program (medians of interleaved windows),
    and whether their permutations agree."""
    keys = jax.random.split(jax.random.key(0), members)
    programs = {
        way: jax.jit(jax.vmap(lambda k, f=f: f(k, n))).lower(keys).compile()
        for way, f in WAYS.items()
    }
    first = {way: np.asarray(p(keys)) for way, p in programs.items()}
    times: dict = {way: [] for way in programs}
    calls = max(1, 64 // members)
    for w in range(windows):
        for way in sorted(programs, reverse=w % 2 == 1):
            t = time.perf_counter()
            for _ in range(calls):
                out = programs[way](keys)
            jax.block_until_ready(out)
            times[way].append((time.perf_counter() - t) / calls / members * 1e3)
    return {
        "ms_per_member": {way: statistics.median(ts) for way, ts in times.items()},
        "windows_ms_per_member": times,
        "identical": bool(np.array_equal(first["library"], first["jaxmnist"])),
    }


def one_run(start: list[str], args: list[str], way: str, work: Path) -> dict:
    """One `jaxmnist train ARGS` in a fresh process (`start`: the launcher's code and
    arguments), the shuffle `way`: its epochs' seconds and test accuracy."""
    run_dir = work / f"run{len(list(work.glob('run*')))}"
    cmd = [sys.executable, "-c", LAUNCH, way, *start, "train", *args, "--run-dir", str(run_dir)]
    cmd += ["--quiet", "--no-report", "--no-checkpoint", "train.target_accuracy=none"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"jaxmnist train {' '.join(args)} failed:\n{done.stderr[-800:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    seconds = [json.loads(line)["epoch_seconds"] for line in lines]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "epoch_seconds": seconds,
        "steady_epoch_seconds": statistics.median(seconds[1:] or seconds),
        "test_accuracy": summary["test_accuracy"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--rounds", type=int, default=2, help="rounds of runs, each way alternated (default 2)"
    )
    p.add_argument("--windows", type=int, default=12, help="timed windows of the shuffle alone")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/shuffle/")
    args = p.parse_args(argv)
    out = args.out or default_out("shuffle.json", args.smoke)
    require_data_dir(args.smoke)
    load_before = os.getloadavg()
    n, members = (1000, (1, 2)) if args.smoke else (EXAMPLES, MEMBERS)
    windows, rounds = (1, 1) if args.smoke else (args.windows, args.rounds)
    alone = {str(m): shuffle_alone(m, n, windows) for m in members}
    runs: dict = {name: {way: [] for way in WAYS} for name in RUNS}
    with tempfile.TemporaryDirectory(prefix="shuffle-") as tmp:
        work = Path(tmp)
        prefix, tiny = jaxmnist_command(args.smoke, work)
        # The launcher's code and its arguments before the command's own.
        start = prefix[2:] if args.smoke else [MAIN]
        for name, (run_args, per_round) in RUNS.items():
            run_args = [*run_args, *tiny]
            if args.smoke:
                run_args += ["--seeds", "2", "train.steps=4", "train.batch_size=2"]
            for i in range(rounds * (1 if args.smoke else per_round)):
                for way in sorted(WAYS, reverse=i % 2 == 1):
                    runs[name][way].append(one_run(start, run_args, way, work))
    steady = {
        name: {w: statistics.median(r["steady_epoch_seconds"] for r in rs) for w, rs in ws.items()}
        for name, ws in runs.items()
    }
    same = all(
        len({r["test_accuracy"] for rs in ws.values() for r in rs}) == 1 for ws in runs.values()
    )
    figures = {
        "what": "the epoch's shuffle by jax.random.permutation (library) and by "
        "jaxmnist.training.shuffle.permutation (jaxmnist): the shuffle alone, per member, "
        "and the steady epoch of whole runs",
        "examples": n,
        "shuffle_alone": alone,
        "runs": runs,
        "steady_epoch_seconds": steady,
        "same_test_accuracy": same,
    }
    print(f"the shuffle of {n:,} examples, ms per member (median of {windows} windows):")
    for m, r in alone.items():
        lib, ours = r["ms_per_member"]["library"], r["ms_per_member"]["jaxmnist"]
        print(f"  {m:>4} members: library {lib:7.2f}, jaxmnist {ours:7.2f} ({ours / lib:.2f}x)"
              f"{'' if r['identical'] else '  PERMUTATIONS DIFFER'}")  # fmt: skip
    print("steady epoch, seconds (median over runs of each run's median):")
    for name, s in steady.items():
        lib, ours, count = s["library"], s["jaxmnist"], len(runs[name]["library"])
        ratio = f"{ours / lib:.2f}x, {count} runs each"
        print(f"  {name}: library {lib:.3f}, jaxmnist {ours:.3f} ({ratio})")
    print(f"same test accuracy both ways: {same}")
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
