"""What keeping freed host memory (`jaxmnist.hostmem`) does to a CPU run.

Runs `jaxmnist train --preset speedrun` for a fixed number of steps as separate processes,
with `JAXMNIST_KEEP_HOST_MEMORY=1` (the default), the same without the run loop's
`hostmem.GrowthCheck` (switched off in that process alone), and `=0` (glibc as it comes),
taking turns (A B C A B C) so that a load that comes and goes falls on all alike. Each
process reports its training seconds (from its summary.json), and the operating system
its kernel (system) time, page faults and peak RSS. Done for one model and for a
population of 8 (one vmapped program, whose calls each allocate several hundred MB of
working memory).

Needs MNIST where JAXMNIST_DATA_DIR (or the cache) has it.

Usage: python benchmarks/host_memory.py [--rounds 2] [--steps 40]
Prints a table and writes JSON (`--out`, default benchmarks/results/host_memory/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib.results import default_out, save_benchmark

# `jaxmnist train`, its run loop's growth check switched off when argv[1] is "0".
TRAIN = """
import sys
from jaxmnist import hostmem
from jaxmnist.cli import main
if sys.argv[1] == "0":
    hostmem.GrowthCheck.before_call = hostmem.GrowthCheck.after_call = lambda self: None
    hostmem.GrowthCheck.watch = lambda self, ready: None
sys.exit(main(sys.argv[2:]))
"""
MODES = {  # label: (JAXMNIST_KEEP_HOST_MEMORY, growth check on)
    "kept": ("1", True),
    "kept, no growth check": ("1", False),
    "glibc default": ("0", True),
}


def one_run(seeds: int, steps: int, keep: str, check: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-c", TRAIN, str(int(check)), "train", "--preset", "speedrun",
            "--seeds", str(seeds), "--no-report", "--no-checkpoint", "--quiet",
            "--run-dir", tmp, "--overwrite", "train.target_accuracy=none",
            f"train.steps={steps}", "train.eval_train=false",
        ]  # fmt: skip
        env = {**os.environ, "JAXMNIST_KEEP_HOST_MEMORY": keep}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode()[-500:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return {
        "train_seconds": summary["train_seconds"],
        "system_seconds": usage.ru_stime,
        "user_seconds": usage.ru_utime,
        "minor_faults": usage.ru_minflt,
        "peak_rss_mb": usage.ru_maxrss / 1024,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, default=default_out("host_memory.json"))
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    figures: dict = {"steps": args.steps, "preset": "speedrun"}
    for seeds in (1, 8):
        runs: dict[str, list[dict]] = {label: [] for label in MODES}
        for _ in range(args.rounds):
            for label, (keep, check) in MODES.items():
                runs[label].append(one_run(seeds, args.steps, keep, check))
        medians = {
            label: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for label, rs in runs.items()
        }
        speedup = medians["glibc default"]["train_seconds"] / medians["kept"]["train_seconds"]
        print(f"{seeds} model(s), {args.steps} steps (median of {args.rounds}):")
        for label, m in medians.items():
            print(
                f"  {label:22s} train {m['train_seconds']:6.2f} s  "
                f"kernel {m['system_seconds']:6.2f} s  faults {m['minor_faults']:>10,.0f}  "
                f"peak RSS {m['peak_rss_mb']:7,.0f} MB"
            )
        unchecked = medians["kept, no growth check"]
        check = unchecked["train_seconds"] / medians["kept"]["train_seconds"]
        print(f"  kept memory trains {speedup:.2f}x as fast; with the growth check {check:.2f}x "
              f"as fast as without, peak RSS {medians['kept']['peak_rss_mb']:,.0f} MB against "
              f"{unchecked['peak_rss_mb']:,.0f} MB")  # fmt: skip
        figures[f"seeds_{seeds}"] = {
            "runs": runs, "median": medians, "speedup": speedup, "growth_check_speedup": check
        }  # fmt: skip
    print(save_benchmark(args.out, figures, load_before))


if __name__ == "__main__":
    main()
