"""What checkpointing costs a `tpu101` run, and how long a killed run takes to resume.

1. Overhead: `jaxmnist train --preset tpu101` with and without checkpoints (one
   Orbax checkpoint per epoch, asynchronous), alternating which goes first,
   `--repeats` times each, in this process. Per run, the wall time from one
   epoch's end to the next (training, evaluation, every callback, the blocking
   part of the save, and whatever the background write takes from the CPU),
   median over epochs 2..E; and the seconds the save call itself blocked.
   Target: checkpointing adds at most 5% to an epoch.
2. Kill and resume: the same run in a child process, killed with SIGKILL half
   an epoch after its epoch-2 checkpoint is complete, then `jaxmnist train
   --resume` here: its wall time, the seconds spent restoring the checkpoint,
   and whether the final parameters equal the uninterrupted run's (array_equal).

The persistent compilation cache is on (a user's default), in a private folder
warmed by the first run. The machine's load average before and after is saved:
other processes on a shared machine inflate every figure.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/checkpoint_overhead.py
Prints the figures and writes JSON (`--out`, default benchmarks/results/checkpoint_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TARGET_OVERHEAD = 0.05
STEPS_PER_EPOCH = 468  # tpu101: 60000 examples, batch 128


def timed_run(argv: list[str]) -> dict:
    """Runs `jaxmnist <argv>` here; returns epoch-end timestamps and save-call seconds."""
    from jaxmnist import cli
    from jaxmnist.runs import checkpoint
    from jaxmnist.training import loop as train

    ends, saves = [], []
    on_epoch_end, save = train._RunFiles.on_epoch_end, checkpoint.Checkpointer.save

    def stamp(self, end):
        on_epoch_end(self, end)
        ends.append(time.perf_counter())

    def timed_save(self, *args):
        t0 = time.perf_counter()
        save(self, *args)
        saves.append(time.perf_counter() - t0)

    train._RunFiles.on_epoch_end, checkpoint.Checkpointer.save = stamp, timed_save
    try:
        code = cli.main(argv)
    finally:
        train._RunFiles.on_epoch_end, checkpoint.Checkpointer.save = on_epoch_end, save
    assert code == 0, f"jaxmnist {' '.join(argv)} exited {code}"
    intervals = np.diff(ends)  # epoch 2..E, each from the previous epoch's end
    return {"epoch_wall_seconds": intervals.tolist(), "save_call_seconds": saves}


def same_params(a: Path, b: Path) -> bool:
    with np.load(a / "params.npz") as x, np.load(b / "params.npz") as y:
        return sorted(x.files) == sorted(y.files) and all(
            np.array_equal(x[k], y[k]) for k in x.files
        )


def kill_and_resume(base: list[str], out: Path, env: dict, reference: Path) -> dict:
    from jaxmnist import cli
    from jaxmnist.runs import resume

    run = out / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxmnist", *base, "--run-dir", str(run)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    committed = run / "checkpoints" / str(2 * STEPS_PER_EPOCH)
    while not committed.exists():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        time.sleep(0.05)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    time.sleep(records[-1]["epoch_seconds"] / 2)  # into epoch 3
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    restore = []
    call = resume.Resumer.__call__

    def timed_call(self, setup):
        t0 = time.perf_counter()
        result = call(self, setup)
        restore.append(time.perf_counter() - t0)
        return result

    resume.Resumer.__call__ = timed_call
    t0 = time.perf_counter()
    try:
        code = cli.main(["train", "--resume", str(run), "--quiet", "--no-report"])
    finally:
        resume.Resumer.__call__ = call
    wall = time.perf_counter() - t0
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    env_json = json.loads((run / "environment.json").read_text())
    return {
        "killed_with_sigkill": proc.returncode == -signal.SIGKILL,
        "resumed_at_step": env_json["resumed_at_step"],
        "resume_wall_seconds": wall,
        "restore_seconds": restore[0],
        "resume_compile_seconds": summary["compile_seconds"],
        "params_equal_uninterrupted": same_params(run, reference),
        "test_accuracy": summary["test_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "checkpoint_overhead.json")
    args = parser.parse_args()
    if not os.environ.get("JAXMNIST_DATA_DIR"):
        sys.exit("set JAXMNIST_DATA_DIR to the folder holding mnist/ (no download here)")
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")  # a private compilation cache
    env = dict(os.environ)
    base = ["train", "--preset", "tpu101", "--epochs", str(args.epochs), "--quiet", "--no-report"]
    timed_run([*base, "--run-dir", str(work / "warm"), "--no-checkpoint"])  # fills the cache
    runs = {"checkpoint": [], "no_checkpoint": []}
    for i in range(args.repeats):
        order = ["no_checkpoint", "checkpoint"] if i % 2 == 0 else ["checkpoint", "no_checkpoint"]
        for kind in order:
            extra = ["--no-checkpoint"] if kind == "no_checkpoint" else []
            runs[kind].append(timed_run([*base, "--run-dir", str(work / f"{kind}{i}"), *extra]))
    medians = {
        kind: float(np.median([t for r in rs for t in r["epoch_wall_seconds"]]))
        for kind, rs in runs.items()
    }
    overhead = medians["checkpoint"] / medians["no_checkpoint"] - 1
    saves = [s for r in runs["checkpoint"] for s in r["save_call_seconds"]]
    killed = kill_and_resume(base, work, env, work / "checkpoint0")
    result = {
        "what": "tpu101 epoch with and without one async Orbax checkpoint per epoch; "
        "kill -9 during epoch 3 and --resume",
        "epochs": args.epochs,
        "repeats": args.repeats,
        "median_epoch_wall_seconds": medians,
        "checkpoint_overhead": overhead,
        "target_overhead": TARGET_OVERHEAD,
        "median_save_call_seconds": float(np.median(saves)),
        "runs": runs,
        "kill_and_resume": killed,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"epoch wall (median): {medians['no_checkpoint']:.3f} s without checkpoints, "
        f"{medians['checkpoint']:.3f} s with: overhead {overhead:+.1%} "
        f"(target <= {TARGET_OVERHEAD:.0%}); save call blocks {np.median(saves) * 1e3:.0f} ms"
    )
    print(
        f"kill -9 in epoch 3, resume at step {killed['resumed_at_step']}: "
        f"{killed['resume_wall_seconds']:.1f} s wall, restore {killed['restore_seconds']:.2f} s, "
        f"compile {killed['resume_compile_seconds']:.2f} s; params equal to the uninterrupted "
        f"run: {killed['params_equal_uninterrupted']}"
    )
    print(f"load average {load_before} -> {os.getloadavg()}; wrote {args.out}")


if __name__ == "__main__":
    main()
