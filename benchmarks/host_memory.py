"""What keeping freed host memory (`jaxmnist.hostmem`) does to a CPU run.

Runs `jaxmnist train --preset speedrun` for a fixed number of steps as separate processes,
with `JAXMNIST_KEEP_HOST_MEMORY=1` (the default), the same without the run loop's
`hostmem.GrowthCheck` (switched off in that process alone), and `=0` (glibc as it comes),
taking turns (A B C A B C) so that a load that comes and goes falls on all alike. Each
process reports its training seconds (from its summary.json), and the operating system
its kernel (system) time, page faults and peak RSS. Done for one model and for a
population of 8 (one vmapped program, whose calls each allocate several hundred MB of
working memory).

Needs MNIST where JAXMNIST_DATA_DIR (or the cache) has it, except with `--smoke`, which
runs each mode once for a population of 2, for 2 steps, on a tiny generated dataset.

Usage: python benchmarks/host_memory.py [--rounds 2] [--steps 40] [--smoke]
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

from benchlib.launch import SMOKE_LAUNCH
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

# Put before the code that starts `jaxmnist`: its run loop's growth check is switched off
# when argv[1] is "0" (then taken off argv, so that what follows reads its own arguments).
GROWTH_CHECK = """
import sys
from jaxmnist import hostmem
if sys.argv.pop(1) == "0":
    hostmem.GrowthCheck.before_call = hostmem.GrowthCheck.after_call = lambda self: None
    hostmem.GrowthCheck.watch = lambda self, ready: None
"""
CLI = "from jaxmnist.cli import main\nsys.exit(main(sys.argv[1:]))\n"
MODES = {  # label: (JAXMNIST_KEEP_HOST_MEMORY, growth check on)
    "kept": ("1", True),
    "kept, no growth check": ("1", False),
    "glibc default": ("0", True),
}


def one_run(seeds: int, steps: int, keep: str, check: bool = True, smoke: Path | None = None):
    """One `jaxmnist train` process (with `smoke`, on the tiny dataset, written there)."""
    with tempfile.TemporaryDirectory() as tmp:
        code, data = (SMOKE_LAUNCH, [str(smoke)]) if smoke else (CLI, [])
        cmd = [
            sys.executable, "-c", GROWTH_CHECK + code, str(int(check)), *data,
            "train", "--preset", "speedrun",
            "--seeds", str(seeds), "--no-report", "--no-checkpoint", "--quiet",
            "--run-dir", tmp, "--overwrite", "train.target_accuracy=none",
            f"train.steps={steps}", "train.eval_train=false",
        ]  # fmt: skip
        if smoke:
            cmd += ["--dataset", "tiny", "--data-dir", str(smoke), "train.batch_size=2"]
        env = {**os.environ, "JAXMNIST_KEEP_HOST_MEMORY": keep}
        with subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        ) as proc:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            err = proc.stderr.read().decode()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {err[-500:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return {
        "train_seconds": summary["train_seconds"],
        "system_seconds": usage.ru_stime,
        "user_seconds": usage.ru_utime,
        "minor_faults": usage.ru_minflt,
        "peak_rss_mb": usage.ru_maxrss / 1024,
    }


def population(seeds: int, rounds: int, steps: int, smoke: Path | None) -> dict:
    """Every mode `rounds` times in turn for a population of `seeds`: the runs, their
    medians and the two speed-ups, with a table printed."""
    runs: dict[str, list[dict]] = {label: [] for label in MODES}
    for _ in range(rounds):
        for label, (keep, check) in MODES.items():
            runs[label].append(one_run(seeds, steps, keep, check, smoke))
    medians = {
        label: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for label, rs in runs.items()
    }
    speedup = medians["glibc default"]["train_seconds"] / medians["kept"]["train_seconds"]
    print(f"{seeds} model(s), {steps} steps (median of {rounds}):")
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
    return {"runs": runs, "median": medians, "speedup": speedup, "growth_check_speedup": check}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default: a new record in results/host_memory/")
    args = p.parse_args(argv)
    out = args.out or default_out("host_memory.json", args.smoke)
    populations, rounds, steps = ((2,), 1, 2) if args.smoke else ((1, 8), args.rounds, args.steps)
    load_before = os.getloadavg()
    figures: dict = {"steps": steps, "preset": "speedrun"}
    with tempfile.TemporaryDirectory() as work:
        smoke = Path(work) / "data" if args.smoke else None
        for seeds in populations:
            figures[f"seeds_{seeds}"] = population(seeds, rounds, steps, smoke)
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
