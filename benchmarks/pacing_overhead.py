"""What cutting epochs into paced calls costs, against one call per epoch.

The run loop runs each epoch as compiled calls of about half a second
(`jaxmnist.training.pacing`), so that Ctrl-C, checkpoints and progress can come between
them; a short epoch stays one call. Here the same compiled program
(`Population.train_steps`) trains the same population on the real data both
ways, alternating which goes first, `--rounds` times: one call for the whole
epoch, and the loop's pacing (one `Pacer` for all its epochs, as in a run).
Reported per preset: the median epoch time each way, their ratio, and the calls
per paced epoch. The results are bit-for-bit the same either way (a unit test
pins that); only the time may differ.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/pacing_overhead.py [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/pacing_overhead/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import jax

from jaxmnist import config as config_lib
from jaxmnist.bench.measure import synthetic_dataset
from jaxmnist.data import load_dataset
from jaxmnist.training.loop import setup_run
from jaxmnist.training.pacing import Pacer
from jaxmnist.training.population import seed_members

from benchlib.results import SMOKE_HELP, default_out, save_benchmark


def measure(preset: str, rounds: int, smoke: bool = False) -> dict:
    """Epoch times of `preset` one call per epoch and paced (`smoke`: tiny random data)."""
    cfg = config_lib.get_preset(preset)
    cfg = config_lib.apply_overrides(cfg, {"train.epochs": 2 * rounds + 1})
    if smoke:
        cfg = config_lib.apply_overrides(cfg, {"train.batch_size": "16"})
        dataset = synthetic_dataset(cfg.data.dataset, train_size=64, test_size=32)
    else:
        dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=False)
    run = setup_run(cfg, seed_members(cfg), dataset)
    pop, S = run.population, run.plan.steps_per_epoch
    pop.compile(S, run.train_data, {})
    states, pacer = run.states, Pacer()
    times: dict = {"one call": [], "paced": []}
    calls = []
    epoch = 0

    def one_epoch(mode: str) -> float:
        nonlocal states, epoch
        plans, metrics = pop.plan_epoch(epoch), pop.new_metrics()
        jax.block_until_ready((plans, metrics))
        epoch += 1
        t0 = time.perf_counter()
        if mode == "one call":
            states, metrics = pop.train_steps(states, metrics, plans, run.train_data, 0, S)
            jax.block_until_ready(metrics)
            return time.perf_counter() - t0
        done, n = 0, 0
        while done < S:
            stop = pacer.next_stop(done, S, done)
            t = time.perf_counter()
            states, metrics = pop.train_steps(states, metrics, plans, run.train_data, done, stop)
            jax.block_until_ready(metrics)
            pacer.record(stop - done, time.perf_counter() - t)
            done, n = stop, n + 1
        calls.append(n)
        return time.perf_counter() - t0

    one_epoch("paced")  # warm-up (and the pacer's first timing)
    for i in range(rounds):
        for mode in ("one call", "paced") if i % 2 == 0 else ("paced", "one call"):
            times[mode].append(one_epoch(mode))
    one, paced = (statistics.median(times[m]) for m in ("one call", "paced"))
    return {
        "steps_per_epoch": S,
        "epoch_seconds": times,
        "median_one_call_seconds": one,
        "median_paced_seconds": paced,
        "paced_over_one_call": paced / one,
        "calls_per_paced_epoch": calls,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tpu101,cnn")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (one round)")
    p.add_argument("--out", type=Path, help="default benchmarks/results/pacing_overhead/")
    args = p.parse_args(argv)
    out = args.out or default_out("pacing_overhead.json", args.smoke)
    rounds = 1 if args.smoke else args.rounds
    load_before = os.getloadavg()
    results = {}
    for preset in args.presets.split(","):
        r = results[preset] = measure(preset, rounds, args.smoke)
        print(
            f"{preset}: one call {r['median_one_call_seconds']:.3f} s, paced "
            f"{r['median_paced_seconds']:.3f} s per epoch ({r['paced_over_one_call']:.3f}x, "
            f"{statistics.median(r['calls_per_paced_epoch']):.0f} calls of "
            f"{r['steps_per_epoch']} steps)",
            flush=True,
        )
    print(save_benchmark(out, {"presets": results}, load_before))


if __name__ == "__main__":
    main()
