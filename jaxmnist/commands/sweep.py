"""`jaxmnist sweep`: train a grid of configs, many models per compiled program.

Every grid point is expanded and validated before anything is loaded; the table goes to
stdout (or sweep.json with --json), progress to stderr, and the files to --out.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from jaxmnist.commands import options
from jaxmnist.errors import TargetNotReached


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep",
        allow_abbrev=False,
        help="train a grid of configs, many models per compiled program; mean ± CI per point",
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
    from jaxmnist import sweep  # start-up: imports jax
    from jaxmnist.runs import rundir  # start-up: imports jax

    cfg, preset = options.resolve_config(args)
    axes = sweep.parse_grid(args.grid or [], cfg, given=options.explicit_overrides(args))
    sweep.expand_grid(cfg, axes)  # every point validated before anything is loaded
    out = rundir.check_writable(args.out or options.default_out("sweep", preset))
    log = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
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
        raise TargetNotReached(
            f"no grid point reached the target test accuracy {cfg.train.target_accuracy:.2%}"
        )
    return 0
