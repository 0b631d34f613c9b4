"""`jaxmnist sweep`: train a grid of configs, many models per compiled program.

Every grid point is expanded and validated before anything is loaded; the table goes to
stdout (or sweep.json with --json), progress to stderr, and the files to --out. Unless
the command line sets `data.validation`, a validation split of 10,000 training examples
is held out (`sweep.default_validation`) and the points are ranked by it, so that the
test set is reported and never used to choose.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from jaxmnist import config as config_lib
from jaxmnist.commands import options
from jaxmnist.data.registry import get_spec
from jaxmnist.errors import TargetNotReached


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep",
        allow_abbrev=False,
        help="train a grid of configs, many models per compiled program; mean ± CI per point",
        description="Train a grid of configs, many models per compiled program, and rank the "
        "points by mean validation accuracy: 10,000 training examples (a sixth of a smaller "
        "training set) are held out and never trained on, unless data.validation=N says "
        "otherwise (0: none, and then the ranking is by test accuracy, which biases the best "
        "point's figures). The test accuracy is reported beside it, never used to choose.",
    )
    options.add_config_args(p)
    p.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2,...",
        help="a swept field and its values, repeatable: --grid optimizer.lr=1e-3,3e-3 "
        "--grid optimizer.weight_decay=0,1e-4 (tuple fields: model.hidden=256x128,512)",
    )
    p.add_argument(
        "--out",
        help="folder for sweep.json, sweep.csv, sweep.png, sweep.html "
        "(default runs/sweep-<preset>-<time>)",
    )
    p.add_argument(
        "--json", action="store_true", help="print sweep.json on stdout instead of the table"
    )
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist.runs import rundir  # start-up: imports jax
    from jaxmnist.search import sweep  # start-up: imports jax

    cfg, preset = options.resolve_config(args)
    given = options.explicit_overrides(args)
    if "data.validation" not in given:  # hold out a validation split to rank by
        held_out = sweep.default_validation(get_spec(cfg.data.dataset).train_size)
        cfg = config_lib.apply_overrides(cfg, {"data.validation": held_out})
        config_lib.validate(cfg)
    axes = sweep.parse_grid(args.grid or [], cfg, given=given)
    sweep.expand_grid(cfg, axes)  # every point validated before anything is loaded
    out = rundir.check_writable(args.out or options.default_out("sweep", preset))
    log = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    if log and "data.validation" not in given:  # said once every point is known to be valid
        log(
            f"holding out {cfg.data.validation:,} training examples as the validation split "
            "the points are ranked by (data.validation=N to change it, 0 for none)"
        )
    result = sweep.run_sweep(cfg, axes, log=log)
    paths = sweep.write_outputs(
        {"preset": preset, **result}, out, shlex.join(["jaxmnist", *args.argv])
    )
    if args.json:
        print(paths["json"].read_text(), end="")
    else:
        print(sweep.format_table(result))
        print(
            f"wrote {paths['json']}, {paths['csv'].name}, {paths['png'].name}, {paths['html'].name}"
        )
    if cfg.train.target_accuracy is not None and not any(
        x["epochs_to_target"] for x in result["results"]
    ):
        split = sweep.SPLIT_NAMES[cfg.train.target_split]
        raise TargetNotReached(
            f"no grid point reached the target {split} accuracy {cfg.train.target_accuracy:.2%}"
        )
    return 0
