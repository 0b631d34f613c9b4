"""What checkpointing costs a `tpu101` run, and how long a killed run takes to resume.

1. Overhead: the run `jaxmnist train --preset tpu101` makes, with and without
   checkpoints (one Orbax checkpoint per epoch, asynchronous: the command's
   defaults), alternating which goes first, `--repeats` times each, in this
   process through `train_and_evaluate`. Per run, the wall time from one epoch's
   end to the next (training, evaluation, every callback, the blocking part of the
   save, and whatever the background write takes from the CPU), median over
   epochs 2..E, stamped by a callback of our own; and the seconds each call of
   `Checkpointer.save` blocked. Target: checkpointing adds at most 5% to an epoch.
2. Kill and resume: `jaxmnist train` in a child process, killed with SIGKILL half
   an epoch after its epoch-2 checkpoint is complete, then `jaxmnist train
   --resume` here: its wall time, the seconds `checkpoint.restore_newest` took,
   and whether the final parameters equal the uninterrupted run's (array_equal).

The persistent compilation cache is on (a user's default), in a private folder
warmed by the first run. The machine's load average before and after is saved:
other processes on a shared machine inflate every figure.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/checkpoint_overhead.py
Prints the figures and writes JSON (`--out`, default benchmarks/results/checkpoint_overhead/).
`--smoke` runs part 1 on tiny random data, one repeat of 3 epochs, without the
compilation cache, and skips part 2 (its child process reads the real data).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

from jaxmnist import cli, train_and_evaluate
from jaxmnist import config as config_lib
from jaxmnist.bench.measure import synthetic_dataset
from jaxmnist.runs import checkpoint
from jaxmnist.runs.checkpoint import Checkpointer, CheckpointOptions
from jaxmnist.training.hooks import Callback

from benchlib.launch import require_data_dir
from benchlib.results import SMOKE_HELP, default_out, provenance

TARGET_OVERHEAD = 0.05
STEPS_PER_EPOCH = 468  # tpu101: 60000 examples, batch 128


class EpochStamps(Callback):
    """The wall clock at every epoch's end: the run's callbacks are called in the same
    order every epoch, so the time between two stamps is one whole epoch's cycle."""

    def __init__(self):
        self.times: list[float] = []

    def on_epoch_end(self, end) -> None:
        self.times.append(time.perf_counter())


def timed_run(cfg, run_dir: Path, checkpoints: bool, dataset=None) -> dict:
    """Trains `cfg` into `run_dir` as `jaxmnist train` would; returns the wall seconds
    between epoch ends and the seconds each checkpoint save blocked the loop."""
    stamps, saves = EpochStamps(), []
    save = Checkpointer.save

    def timed_save(self, *args, **kwargs):
        t0 = time.perf_counter()
        save(self, *args, **kwargs)
        saves.append(time.perf_counter() - t0)

    with mock.patch.object(Checkpointer, "save", timed_save):
        train_and_evaluate(
            cfg,
            run_dir,
            [stamps],
            dataset=dataset,
            checkpoints=CheckpointOptions() if checkpoints else None,
        )
    intervals = np.diff(stamps.times)  # epoch 2..E, each from the previous epoch's end
    return {"epoch_wall_seconds": intervals.tolist(), "save_call_seconds": saves}


def same_params(a: Path, b: Path) -> bool:
    with np.load(a / "params.npz") as x, np.load(b / "params.npz") as y:
        return sorted(x.files) == sorted(y.files) and all(
            np.array_equal(x[k], y[k]) for k in x.files
        )


def kill_and_resume(base: list[str], out: Path, env: dict, reference: Path) -> dict:
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
    restore_newest = checkpoint.restore_newest

    def timed_restore(*args, **kwargs):
        t0 = time.perf_counter()
        result = restore_newest(*args, **kwargs)
        restore.append(time.perf_counter() - t0)
        return result

    t0 = time.perf_counter()
    with mock.patch.object(checkpoint, "restore_newest", timed_restore):
        code = cli.main(["train", "--resume", str(run), "--quiet", "--no-report"])
    wall = time.perf_counter() - t0
    assert code == 0
    assert restore, "the resume did not call checkpoint.restore_newest: time it where it moved"
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--out", type=Path, help="default benchmarks/results/checkpoint_overhead/")
    args = parser.parse_args(argv)
    out = args.out or default_out("checkpoint_overhead.json", args.smoke)
    require_data_dir(args.smoke)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    cfg = config_lib.apply_overrides(
        config_lib.get_preset("tpu101"), {"train.epochs": 3 if args.smoke else args.epochs}
    )
    dataset, repeats = None, args.repeats
    if args.smoke:  # tiny data, and no compilation cache: it would outlive this call
        cfg = config_lib.apply_overrides(cfg, {"compile_cache": "false"})
        dataset, repeats = synthetic_dataset("mnist", train_size=512, test_size=64), 1
    else:
        os.environ["XDG_CACHE_HOME"] = str(work / "cache")  # a private compilation cache
    env = dict(os.environ)
    if not args.smoke:
        timed_run(cfg, work / "warm", checkpoints=False)  # fills the cache
    runs = {"checkpoint": [], "no_checkpoint": []}
    for i in range(repeats):
        order = ["no_checkpoint", "checkpoint"] if i % 2 == 0 else ["checkpoint", "no_checkpoint"]
        for kind in order:
            runs[kind].append(
                timed_run(cfg, work / f"{kind}{i}", kind == "checkpoint", dataset=dataset)
            )
    medians = {
        kind: float(np.median([t for r in rs for t in r["epoch_wall_seconds"]]))
        for kind, rs in runs.items()
    }
    overhead = medians["checkpoint"] / medians["no_checkpoint"] - 1
    saves = [s for r in runs["checkpoint"] for s in r["save_call_seconds"]]
    killed = None
    if not args.smoke:
        base = ["train", "--preset", "tpu101", "--epochs", str(args.epochs), "--quiet"]
        killed = kill_and_resume([*base, "--no-report"], work, env, work / "checkpoint0")
    result = {
        "what": "tpu101 epoch with and without one async Orbax checkpoint per epoch; "
        "kill -9 during epoch 3 and --resume",
        "epochs": cfg.train.epochs,
        "repeats": repeats,
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
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "provenance": provenance()}, indent=2) + "\n")
    print(
        f"epoch wall (median): {medians['no_checkpoint']:.3f} s without checkpoints, "
        f"{medians['checkpoint']:.3f} s with: overhead {overhead:+.1%} "
        f"(target <= {TARGET_OVERHEAD:.0%}); save call blocks {np.median(saves) * 1e3:.0f} ms"
    )
    if killed:
        print(
            f"kill -9 in epoch 3, resume at step {killed['resumed_at_step']}: "
            f"{killed['resume_wall_seconds']:.1f} s wall, restore "
            f"{killed['restore_seconds']:.2f} s, compile {killed['resume_compile_seconds']:.2f} s; "
            f"params equal to the uninterrupted run: {killed['params_equal_uninterrupted']}"
        )
    print(f"load average {load_before} -> {os.getloadavg()}; wrote {out}")
    if args.smoke:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
