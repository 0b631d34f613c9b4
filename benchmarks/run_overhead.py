"""What the report costs a `tpu101` run, and the run's peak memory (#23).

Runs `jaxmnist train --preset tpu101` as fresh processes, each into a temporary run
directory, with and without `--no-report`, alternating which goes first in each round
so that a load that comes and goes falls on both alike; and, after each pair, once with
`--no-report --no-checkpoint`, which shows what Orbax's checkpoints add to the peak. Per
process: the wall time from start to exit, and its peak memory measured two ways:

- `peak_rss_mb`: the kernel's `ru_maxrss` from `wait4`, the largest peak of the process
  and of any child it waited for (a maximum, not a sum);
- `tree_rss_mb`: the largest sum of the RSS of the process and all its descendants
  alive at the same moment, sampled every 10 ms from /proc (what a user sees of the
  whole job; a peak shorter than the interval can be missed).

Prints the medians, the report's cost (median with report minus median without), the
CPU it adds (user and system time of the process and the children it waited for) and
the goals: at most 0.5 s for the report, at most 320 MB for the run. `--pythonpath DIR`
runs another copy of the code (e.g. an export of an older commit) side by side.

Needs MNIST where JAXMNIST_DATA_DIR (or the cache) has it; `--smoke` trains a few steps
on a tiny generated dataset instead. Writes JSON (`--out`, default
benchmarks/results/run_overhead/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchlib.launch import (
    add_code_copies,
    code_copies,
    code_env,
    jaxmnist_command,
    require_data_dir,
)
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

GOAL_REPORT_SECONDS = 0.5
GOAL_PEAK_MB = 320
FLAGS = {
    "report": [],
    "no_report": ["--no-report"],
    "no_checkpoint": ["--no-report", "--no-checkpoint"],
}


def tree_rss_kb(pid: int) -> int:
    """The summed VmRSS (KiB) of `pid` and its living descendants; 0 once it is gone."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue  # it exited meanwhile
    return total


def one_run(cmd: list[str], env: dict, cwd: str | None = None) -> dict:
    """Runs `cmd` to the end in `cwd`; its wall seconds and peak memory (module docstring).
    `python -m` puts the working directory first on sys.path: a folder outside any copy
    of the code keeps PYTHONPATH's copy the one that runs."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    tree_peak = 0
    while True:
        done, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if done:
            break
        tree_peak = max(tree_peak, tree_rss_kb(proc.pid))
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode()[-800:]}")
    proc.stderr.close()
    return {
        "wall_seconds": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "tree_rss_mb": tree_peak / 1024,
        "user_seconds": usage.ru_utime,
        "system_seconds": usage.ru_stime,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="pairs of runs (default 3)")
    add_code_copies(p, "run")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/run_overhead/")
    args = p.parse_args(argv)
    out = args.out or default_out("run_overhead.json", args.smoke)
    require_data_dir(args.smoke)
    load_before = os.getloadavg()
    codes = code_copies(args)
    rounds = 1 if args.smoke else args.rounds
    runs: dict = {code: {kind: [] for kind in FLAGS} for code in codes}
    with tempfile.TemporaryDirectory(prefix="run-overhead-") as work:
        prefix, tiny = jaxmnist_command(args.smoke, Path(work))
        base = ["train", "--preset", "tpu101", "--quiet", *tiny]
        if args.smoke:
            base += ["train.steps=4", "train.batch_size=2"]
        for i in range(rounds):
            for code, path in codes.items():
                env = code_env(path)
                order = ["no_report", "report"] if i % 2 == 0 else ["report", "no_report"]
                for kind in [*order, "no_checkpoint"]:
                    run_dir = Path(work) / f"run{len(list(Path(work).glob('run*')))}"
                    cmd = [*prefix, *base, "--run-dir", str(run_dir), *FLAGS[kind]]
                    runs[code][kind].append(one_run(cmd, env, cwd=work))
    figures: dict = {
        "what": "jaxmnist train --preset tpu101 in fresh processes, with and without "
        "--no-report, alternated, then with --no-report --no-checkpoint: wall seconds and "
        "peak memory",
        "rounds": rounds,
        "goal_report_seconds": GOAL_REPORT_SECONDS,
        "goal_peak_mb": GOAL_PEAK_MB,
        "codes": codes,
        "runs": runs,
        "median": {},
    }
    lines = []
    for code, kinds in runs.items():
        med = {
            kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for kind, rs in kinds.items()
        }
        cost = med["report"]["wall_seconds"] - med["no_report"]["wall_seconds"]
        med["report_seconds"] = cost
        cpu = {
            k: statistics.median(r["user_seconds"] + r["system_seconds"] for r in rs)
            for k, rs in kinds.items()
        }
        # The CPU the report adds to the job (its child's included): steadier than the
        # wall time on a shared machine, and what the report takes from the run's cores.
        med["report_cpu_seconds"] = cpu["report"] - cpu["no_report"]
        figures["median"][code] = med
        peak = max(med["report"]["tree_rss_mb"], med["report"]["peak_rss_mb"])
        lines.append(
            f"{code}: wall {med['no_report']['wall_seconds']:.2f} s without the report, "
            f"{med['report']['wall_seconds']:.2f} s with: the report costs {cost:+.2f} s "
            f"(goal <= {GOAL_REPORT_SECONDS} s) and {med['report_cpu_seconds']:+.2f} s of CPU; "
            f"peak RSS {med['no_report']['peak_rss_mb']:.0f} / "
            f"{med['report']['peak_rss_mb']:.0f} MB (process), whole job with the report "
            f"{med['report']['tree_rss_mb']:.0f} MB (goal <= {GOAL_PEAK_MB} MB: "
            f"{'met' if peak <= GOAL_PEAK_MB else 'not met'}); without checkpoints "
            f"{med['no_checkpoint']['peak_rss_mb']:.0f} MB (process)"
        )
    print("\n".join(lines))
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
