"""How soon Ctrl-C (or SIGTERM) is honoured inside a long epoch.

The run loop cuts every epoch into calls of about half a second and asks after
each whether a stop was requested; a stop then saves a checkpoint at that step
and exits 130 (Ctrl-C) or 143 (SIGTERM). Measured here in real child processes
on the real data, `--repeats` times per case:

  cnn     `jaxmnist train --preset cnn` (MNIST, a CNN epoch of several seconds on
          a small CPU): the signal comes 2-5 s after compilation, inside epoch 1
  seeds   `--preset tpu101 --seeds N` (default 1000): a population whose every
          step is long; the terminal's up-front estimate of the epoch is kept

For each: seconds from the signal to the process's exit (the call under way,
the checkpoint's write, the exit), the step it stopped at and whether it is
inside an epoch, the exit code, and whether the checkpoint at that step exists.
Target (issue 12): the stop is honoured within about 2 s.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/stop_latency.py [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/stop_latency/).
`--smoke` stops one `cnn` run on a tiny generated dataset (epochs of a few steps, enough
of them to outlast the signal), through the same command line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from jaxmnist.runs.checkpoint import checkpoint_steps

from benchlib.launch import jaxmnist_command, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

TARGET_SECONDS = 2.0


def one_stop(
    launch: list[str], argv: list[str], run: Path, signum: int, delay: float, env: dict
) -> dict:
    """Starts `jaxmnist <argv>` (`launch`: the command that starts jaxmnist), signals it
    `delay` s after compilation; times the exit."""
    with subprocess.Popen(
        [*launch, *argv, "--run-dir", str(run)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:  # its pipes closed, and the process waited for, on the way out
        compiled, lines = threading.Event(), []

        def read() -> None:
            for line in proc.stdout:
                lines.append(line.rstrip())
                if line.startswith("compiled in"):
                    compiled.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if not compiled.wait(timeout=900):
            proc.kill()
            raise SystemExit(
                f"no compilation line from {' '.join(argv)}: {proc.stderr.read()[-800:]}"
            )
        time.sleep(delay)
        sent = time.perf_counter()
        proc.send_signal(signum)
        proc.wait(timeout=900)
        latency = time.perf_counter() - sent
        reader.join(timeout=5)
        err = proc.stderr.read().strip().splitlines()
    last = err[-1] if err else ""
    step = (
        int(last.split("stopped at step ")[1].split(";")[0]) if "stopped at step" in last else None
    )
    saved = checkpoint_steps(run)
    env_json = json.loads((run / "environment.json").read_text())
    per_epoch = env_json["steps_per_epoch"]
    return {
        "signal": signal.Signals(signum).name,
        "signal_after_compile_seconds": delay,
        "seconds_to_exit": latency,
        "exit_code": proc.returncode,
        "stopped_at_step": step,
        "steps_per_epoch": per_epoch,
        "inside_an_epoch": step is not None and step % per_epoch != 0,
        "checkpoint_at_that_step": step in saved,
        "estimate_line": next((x for x in lines if x.startswith("an epoch will take")), None),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="cnn,seeds")
    p.add_argument("--seeds", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default: a new record in results/stop_latency/")
    args = p.parse_args(argv)
    require_data_dir(args.smoke)
    out = args.out or default_out("stop_latency.json", args.smoke)
    epochs = "1000" if args.smoke else "2"  # the smoke's epochs are a few steps each
    cases = {
        "cnn": ["train", "--preset", "cnn", "--epochs", epochs, "--no-report"],
        "seeds": ["train", "--preset", "tpu101", "--seeds", str(args.seeds), "--no-report"],
    }
    names, repeats, delays = args.cases.split(","), args.repeats, (2, 5)
    if args.smoke:
        names, repeats, delays = ["cnn"], 1, (0.2, 0.5)
    load_before = os.getloadavg()
    rng = random.Random(0)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        launch, extra = jaxmnist_command(args.smoke, Path(tmp))
        extra += ["train.batch_size=2", "train.target_accuracy=none"] if args.smoke else []
        for name in names:
            argv = cases[name] + extra
            results[name] = {"command": "jaxmnist " + " ".join(argv), "stops": []}
            for i in range(repeats):
                signum = signal.SIGINT if i % 2 == 0 else signal.SIGTERM
                delay = rng.uniform(*delays)
                r = one_stop(launch, argv, Path(tmp) / f"{name}{i}", signum, delay, env)
                results[name]["stops"].append(r)
                print(
                    f"{name:5} {r['signal']:7} after {r['signal_after_compile_seconds']:.1f} s: "
                    f"exited {r['exit_code']} in {r['seconds_to_exit']:.2f} s at step "
                    f"{r['stopped_at_step']} of {r['steps_per_epoch']}/epoch, checkpoint "
                    f"{'saved' if r['checkpoint_at_that_step'] else 'MISSING'}",
                    flush=True,
                )
            worst = max(s["seconds_to_exit"] for s in results[name]["stops"])
            results[name]["worst_seconds_to_exit"] = worst
            results[name]["meets_target"] = worst <= TARGET_SECONDS
    figures = {"target_seconds": TARGET_SECONDS, "cases": results}
    line = save_benchmark(out, figures, load_before)
    for name, r in results.items():
        print(
            f"{name}: worst {r['worst_seconds_to_exit']:.2f} s from signal to exit "
            f"(target <= {TARGET_SECONDS:.0f} s): {'met' if r['meets_target'] else 'NOT met'}"
        )
    print(line)


if __name__ == "__main__":
    main()
