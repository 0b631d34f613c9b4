"""What evaluating after every epoch costs against training, per preset (#23).

For each preset a short run (`--epochs`, default 3) trains in this process through
`train_population`, as `jaxmnist train` would, and each epoch's metrics.jsonl record gives
its training time (`epoch_seconds`), its evaluation time (`eval_seconds`: the test set in
full, then the training set) and the training set's part of it (`train_eval_seconds`). The
CNN presets run twice, side by side: evaluating the full training set, and as the preset
does (a fixed subset of `train.eval_train_examples`, or none); `tpu101` keeps the full
set, as the tutorial does. The goal: a preset's evaluation at most 5% of its training time, with the
test set still evaluated in full every epoch.

With `--seeds N` (N > 1) a run also evaluates the ensemble of its members on the test set
every epoch; each preset's own case then runs a third time with the ensemble off, side
by side, so that what the ensemble adds to the test set's evaluation is measured.

From the full-set run the script also derives the largest training subset that would
keep the evaluation within the goal: the test set's seconds, plus the training set's
seconds per example times N, at most 5% of the training seconds (medians over the epochs
after the first, which is a warm-up).

The host allocator is set as `jaxmnist train` sets it (`hostmem.keep_freed_memory`), so
that training and evaluation reuse their working memory as they do in a run.

`--rounds R` then runs each preset's own case again, R times, each in a fresh process,
taking turns between this checkout and every `--pythonpath DIR` (another copy of the
code, e.g. `git archive OLD jaxmnist` unpacked in DIR): the same measurement of two
versions side by side, on the same machine in the same minutes, with each process's
peak resident set.

Needs MNIST and Fashion-MNIST where JAXMNIST_DATA_DIR (or the cache) has them, except
with --smoke. Timings on a loaded machine mean little alone; ratios measured in one run
are what to compare.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/eval_overhead.py
    [--presets cnn,fashion_cnn,speedrun,tpu101] [--epochs 3] [--seeds 1] [--smoke]
    [--rounds R [--pythonpath DIR]]
Prints a table and writes JSON (`--out`, default benchmarks/results/eval_overhead/).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib.launch import add_code_copies, code_copies, code_env
from benchlib.proc import status_kb
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

GOAL = 0.05  # evaluation seconds / training seconds, per epoch
CNN_PRESETS = ("cnn", "fashion_cnn", "speedrun")


def run_case(
    preset: str, overrides: dict, epochs: int, seeds: int, smoke: bool, ensemble: bool = True
) -> dict:
    """Trains `preset` (with `overrides`) for `epochs`, evaluating the ensemble of several
    seeds unless `ensemble` is false; returns its per-epoch timings."""
    from jaxmnist import config as config_lib
    from jaxmnist.training.evaluate import train_eval_facts
    from jaxmnist.training.loop import train_population
    from jaxmnist.training.population import seed_members

    cfg = config_lib.apply_overrides(
        config_lib.get_preset(preset),
        {"train.epochs": epochs, "train.seeds": seeds, "train.target_accuracy": "none"}
        | ({"train.batch_size": 16, "train.eval_batch_size": 32} if smoke else {})
        | overrides,
    )
    dataset = load(cfg.data.dataset, smoke)
    config_lib.validate(cfg, num_train_examples=len(dataset.train_labels))
    result = train_population(cfg, seed_members(cfg), dataset, ensemble=ensemble and seeds > 1)
    epochs_out = [
        {
            "epoch": r["epoch"],
            "train_seconds": r["epoch_seconds"],
            "eval_seconds": r["eval_seconds"],
            "test_eval_seconds": r["eval_seconds"] - r.get("train_eval_seconds", 0.0),
            "train_eval_seconds": r.get("train_eval_seconds", 0.0),
            "eval_fraction": r["eval_seconds"] / r["epoch_seconds"],
        }
        for r in result.records
    ]
    facts = train_eval_facts(cfg.train, len(dataset.train_labels))
    steady = epochs_out[1:] or epochs_out  # the first epoch warms up
    return {
        "preset": preset,
        "overrides": overrides,
        "ensemble": result.ensemble is not None,
        "train_eval_examples": facts.get("train_eval_examples", 0),
        "train_size": len(dataset.train_labels),
        "test_size": len(dataset.test_labels),
        "epochs": epochs_out,
        # Summed over the epochs after the first: what a longer run's evaluation costs.
        "steady_eval_fraction": sum(e["eval_seconds"] for e in steady)
        / sum(e["train_seconds"] for e in steady),
    }


_DATASETS: dict = {}


def load(name: str, smoke: bool):
    if name not in _DATASETS:
        if smoke:
            from jaxmnist.bench.measure import synthetic_dataset

            _DATASETS[name] = synthetic_dataset(name, train_size=96, test_size=40)
        else:
            from jaxmnist.data import load_dataset

            _DATASETS[name] = load_dataset(name, download=False)
    return _DATASETS[name]


def largest_subset(full: dict) -> int:
    """From a full-training-set case: the largest N whose evaluation, with the test set in
    full, stays within GOAL of the training time (0: not even the test set). Medians over
    the epochs after the first (a warm-up), or the one epoch there is."""
    steady = full["epochs"][1:] or full["epochs"]

    def median(key: str) -> float:
        return statistics.median(e[key] for e in steady)

    per_example = median("train_eval_seconds") / full["train_size"]
    room = GOAL * median("train_seconds") - median("test_eval_seconds")
    return max(0, min(full["train_size"], int(room / per_example))) if per_example else 0


def median_test_eval(case: dict) -> float:
    """The median seconds of the test set's evaluation over the epochs after the first."""
    return statistics.median(e["test_eval_seconds"] for e in case["epochs"][1:] or case["epochs"])


def label(case: dict) -> str:
    n, size = case["train_eval_examples"], case["train_size"]
    which = "no training set" if not n else "full training set" if n >= size else f"subset {n:,}"
    return f"{case['preset']} ({which}{'' if case['ensemble'] else ', no ensemble'})"


def side_by_side(args) -> dict:
    """Each preset's own case, `args.rounds` times in fresh processes, taking turns between
    the copies of the code: {copy: {preset: {"fractions", "peak_rss_mb", "median"}}}."""
    out: dict = {}
    for _ in range(args.rounds):
        for name, path in code_copies(args).items():
            env = code_env(path)
            for preset in args.presets.split(","):
                command = [sys.executable, __file__, "--child", preset]
                command += ["--epochs", str(args.epochs), "--seeds", str(args.seeds)]
                command += ["--smoke"] * args.smoke
                done = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"{preset} with {name} failed: {done.stderr.strip()[-300:]}")
                case = json.loads(done.stdout.splitlines()[-1])
                got = out.setdefault(name, {}).setdefault(
                    preset, {"fractions": [], "peak_rss_mb": []}
                )
                got["fractions"].append(case["steady_eval_fraction"])
                got["peak_rss_mb"].append(case["peak_rss_mb"])
    for name, presets in out.items():
        for preset, got in presets.items():
            got["median"] = statistics.median(got["fractions"])
            fractions = ", ".join(f"{f:.2%}" for f in got["fractions"])
            peaks = ", ".join(f"{m:.0f}" for m in got["peak_rss_mb"])
            print(
                f"{preset} with {name}: evaluation {fractions} of training time "
                f"(median {got['median']:.2%}); peak RSS {peaks} MB"
            )
    return out


def child(args) -> None:
    """One preset's own case in this (fresh) process, as JSON on stdout's last line."""
    from jaxmnist import hostmem

    hostmem.keep_freed_memory()  # as the CLI does, before XLA starts its threads
    case = run_case(args.child, {}, args.epochs, args.seeds, args.smoke)
    # VmHWM, not getrusage's ru_maxrss: a forked child starts with its parent's.
    case["peak_rss_mb"] = status_kb("VmHWM") / 1024
    print(json.dumps(case))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="cnn,fashion_cnn,speedrun,tpu101")
    p.add_argument("--epochs", type=int, default=3, help="epochs per case (the first warms up)")
    p.add_argument("--seeds", type=int, default=1, help="models trained together per case")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="also each preset's own case in fresh processes, this many times in turn",
    )
    add_code_copies(p, "run the --rounds cases")
    p.add_argument("--child", help=argparse.SUPPRESS)  # one case of PRESET, JSON on stdout
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.smoke:  # a check that runs in other processes (the tests): their allocator stays
        args.presets, args.epochs = "cnn", 1
    else:
        from jaxmnist import hostmem

        hostmem.keep_freed_memory()  # as the CLI does, before XLA starts its threads
    out = args.out or default_out("eval_overhead.json", args.smoke)
    load_before = os.getloadavg()
    cases = []
    for preset in args.presets.split(","):
        variants = [{}]
        if preset in CNN_PRESETS:  # the full training set, side by side with the preset's
            variants.insert(0, {"train.eval_train": "true", "train.eval_train_examples": "none"})
        for overrides in variants:
            if args.smoke and not overrides and preset in CNN_PRESETS:
                overrides = {"train.eval_train_examples": 24}
            cases.append(run_case(preset, overrides, args.epochs, args.seeds, args.smoke))
        if args.seeds > 1:  # the preset's own case again, without the ensemble
            cases.append(run_case(preset, overrides, args.epochs, args.seeds, args.smoke, False))
    print(
        f"{'case':<34} {'epoch':>5} {'train s':>8} {'test eval s':>11} "
        f"{'train eval s':>12} {'eval/train':>10}"
    )
    for case in cases:
        for e in case["epochs"]:
            print(
                f"{label(case):<34} {e['epoch']:>5} {e['train_seconds']:>8.2f} "
                f"{e['test_eval_seconds']:>11.3f} {e['train_eval_seconds']:>12.3f} "
                f"{e['eval_fraction']:>10.1%}"
            )
    for case in cases:
        print(
            f"{label(case)}: evaluation {case['steady_eval_fraction']:.1%} of training time "
            f"(summed over epochs {'2 on' if len(case['epochs']) > 1 else '1'})"
        )
    within = {}
    for case in cases:
        if case["preset"] in CNN_PRESETS and case["train_eval_examples"] >= case["train_size"]:
            within[case["preset"]] = n = largest_subset(case)
            print(
                f"{case['preset']}: the largest training subset within {GOAL:.0%} of training "
                f"time (medians after the first epoch): {n:,} examples"
            )
    ensemble_cost = {}
    for with_, without in itertools.pairwise(cases):
        if with_["ensemble"] and not without["ensemble"]:
            a, b = (median_test_eval(c) for c in (with_, without))
            ensemble_cost[with_["preset"]] = {"test_eval_seconds": [a, b], "ratio": a / b}
            print(
                f"{with_['preset']}: the test set's evaluation {a:.3f} s with the ensemble, "
                f"{b:.3f} s without ({a / b:.2f}x; medians after the first epoch)"
            )
    figures = {
        "goal_eval_fraction": GOAL,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "cases": cases,
        "largest_subset_within_goal": within,
        "ensemble_cost": ensemble_cost,
    }
    if args.rounds:
        figures["side_by_side"] = side_by_side(args)
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
