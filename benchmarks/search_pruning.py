"""What pruning saves a search: the time to the same best validation accuracy, with and without.

The same search runs twice in this process, side by side, through `run_search` (what
`jaxmnist search` calls): the same space, trials, batch size and sampler seed (TPE), once
with `--pruner none` and once with a pruner (`--pruner`, default median), each in a fresh
SQLite study. Every trial's finishing time comes from the study (Optuna's
`datetime_complete`) measured from the search's start; compile time is included, as a
user waits for it. The target is the best validation accuracy that both searches reach
(the lower of their two bests); the figure is each search's time until a finished trial
first reaches it, and their ratio. Also: the epochs each trained (trials × seeds × epochs
run) and the trials pruned. Pruning stops a vmapped batch's program only when all its
trials are pruned, so what it saves depends on the batch size: `--batch` sets it.

Needs MNIST where JAXMNIST_DATA_DIR (or the cache) has it, except with --smoke.
Timings on a loaded machine mean little alone; the ratio measured in one run is what to
compare.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/search_pruning.py
    [--trials 24] [--batch 4] [--epochs 6] [--pruner median] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/search_pruning/).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchlib.results import SMOKE_HELP, default_out, save_benchmark

PARAMS = [
    "optimizer.lr=log:1e-4:1e-1",
    "optimizer.weight_decay=log:1e-6:1e-2",
    "model.hidden=choice:128x64,256x128",
]
SMOKE_PARAMS = ["optimizer.lr=log:1e-4:1e-1", "model.hidden=choice:8,16"]


def run_one(pruner: str, args, dataset) -> dict:
    """One search in a fresh study; its trials' finishing times and epochs."""
    from optuna.trial import TrialState

    from jaxmnist import config as config_lib
    from jaxmnist.search import space, worker
    from jaxmnist.search.study import StudyOptions

    overrides = {"train.epochs": args.epochs, "optimizer.name": "adamw", "compile_cache": False}
    if args.smoke:
        overrides |= {
            "data.dataset": dataset.spec.name,
            "train.batch_size": 16,
            "model.hidden": "8",
        }
    cfg = config_lib.apply_overrides(config_lib.get_preset("tpu101"), overrides)
    cfg = worker.with_validation(cfg, args.validation)
    params = space.parse_params(SMOKE_PARAMS if args.smoke else PARAMS, cfg)
    with tempfile.TemporaryDirectory() as where:
        opts = StudyOptions(
            name=f"pruning-{pruner}", storage=f"sqlite:///{Path(where) / 'search.db'}",
            trials=args.trials, pruner=pruner, seed=args.seed,
        )  # fmt: skip
        start, t0 = time.time(), time.perf_counter()
        study = worker.run_search(cfg, params, opts, batch=args.batch, dataset=dataset)
        wall = time.perf_counter() - t0
        trials = study.get_trials(deepcopy=False)
    done = sorted(
        (t.datetime_complete.timestamp() - start, t.value)
        for t in trials
        if t.state == TrialState.COMPLETE
    )
    epochs = sum(
        (t.user_attrs.get("epochs") or 0) * len(t.user_attrs.get("seeds") or [1]) for t in trials
    )
    return {
        "pruner": pruner,
        "wall_seconds": wall,
        "finished": [{"seconds": s, "val_accuracy": v} for s, v in done],
        "best_val_accuracy": max((v for _, v in done), default=None),
        "pruned": sum(t.state == TrialState.PRUNED for t in trials),
        "epochs_trained": epochs,
    }


def time_to(run: dict, target: float) -> float | None:
    """Seconds from the search's start until a finished trial reached `target`."""
    return next((f["seconds"] for f in run["finished"] if f["val_accuracy"] >= target), None)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--batch", type=int, default=4, help="most trials per batch")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--pruner", default="median", help="median, halving or hyperband")
    p.add_argument("--validation", type=int, default=10000, help="held-out training examples")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed, in both searches")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.smoke:
        args.trials, args.batch, args.epochs, args.validation = 2, 2, 2, 24  # one batch each
    out = args.out or default_out("search_pruning.json", args.smoke)
    load_before = os.getloadavg()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the table says what it would
    if args.smoke:
        from jaxmnist.bench.measure import synthetic_dataset

        dataset = synthetic_dataset("mnist", train_size=96, test_size=40)
    else:
        from jaxmnist.data import load_dataset

        dataset = load_dataset("mnist", download=False)
    runs = [run_one("none", args, dataset), run_one(args.pruner, args, dataset)]
    bests = [r["best_val_accuracy"] for r in runs]
    target = min(bests) if None not in bests else None
    times = [time_to(r, target) if target is not None else None for r in runs]
    print(
        f"{'pruner':<10} {'wall s':>8} {'best val':>9} {'to target s':>12} "
        f"{'pruned':>7} {'epochs':>7}"
    )
    for r, t in zip(runs, times):
        print(
            f"{r['pruner']:<10} {r['wall_seconds']:>8.1f} "
            f"{100 * (r['best_val_accuracy'] or 0):>8.2f}% "
            f"{t if t is None else round(t, 1)!s:>12} {r['pruned']:>7} {r['epochs_trained']:>7}"
        )
    ratio = times[1] / times[0] if None not in times and times[0] else None
    if ratio is not None:
        print(f"time to {100 * target:.2f}% validation accuracy: pruned / unpruned = {ratio:.2f}")
    figures = {
        "trials": args.trials, "batch": args.batch, "epochs": args.epochs,
        "pruner": args.pruner, "sampler_seed": args.seed, "smoke": args.smoke,
        "target_val_accuracy": target,
        "time_to_target_seconds": dict(zip(("none", args.pruner), times)),
        "time_to_target_ratio": ratio, "runs": runs,
    }  # fmt: skip
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
