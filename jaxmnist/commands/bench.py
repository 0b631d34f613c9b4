"""`jaxmnist bench`: throughput of the dispatch modes, dtypes and batch sizes, and FLOP use.

Here `--devices` lists device counts for the scaling table rather than the devices of
one run, so it is kept out of the config (each measured run sets its own).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from jaxmnist.commands import options
from jaxmnist.commands.profile import add_profile_steps, check_profile_steps


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        allow_abbrev=False,
        help="throughput: dispatch modes, dtypes, batch sizes, FLOP utilisation",
    )
    options.add_config_args(p)
    p.add_argument(
        "--modes",
        help=(
            "comma-separated, of: python-dispatch, jit-step-host, jit-step-device, scan-epoch "
            "(default all)"
        ),
    )
    p.add_argument(
        "--dtypes", help="compute dtypes to compare, e.g. float32,bfloat16 (default both)"
    )
    p.add_argument(
        "--batch-sizes",
        help="batch-size sweep, e.g. 64,128,...,8192 (default 64 to 8192, doubling)",
    )
    p.add_argument(
        "--sweep-mode", help="mode for the dtype comparison and batch sweep (default scan-epoch)"
    )
    p.add_argument(
        "--tokens-per-example", help="also show tokens/s, labelled as a projection: examples/s x N"
    )
    p.add_argument(
        "--variants",
        metavar="KEY=V1,V2[,...]",
        help=(
            "compare the values of one config field side by side in the sweep mode, e.g. "
            "model.conv_impl=xla,im2col or train.batch_size=128,256 (a tuple value's elements "
            "separated by spaces); the modes, dtypes and batch sizes are then measured only "
            "when given"
        ),
    )
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="random data of the dataset's shape (no files needed)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds: short epochs, two sweep points (for tests)",
    )
    p.add_argument(
        "--out",
        help="folder for bench.json, bench.png, bench.html (default runs/bench-<preset>-<time>)",
    )
    p.add_argument(
        "--json", action="store_true", help="print bench.json on stdout instead of the table"
    )
    add_profile_steps(p)  # after the measurements, into OUT, bench.json and bench.html
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist.bench import make_options, run_bench  # start-up: imports jax
    from jaxmnist.bench.output import format_table, to_json, write_outputs  # start-up: jax
    from jaxmnist.runs import rundir  # start-up: imports jax

    check_profile_steps(args.profile_steps)
    cfg, preset = options.resolve_config(args, leave_out=("--devices",))
    opts = make_options(
        devices=getattr(args, "parallel.devices"),
        modes=args.modes,
        dtypes=args.dtypes,
        batch_sizes=args.batch_sizes,
        sweep_mode=args.sweep_mode,
        tokens_per_example=args.tokens_per_example,
        synthetic=args.synthetic,
        quick=args.quick,
        variants=args.variants,
    )
    out = rundir.check_writable(args.out or options.default_out("bench", preset))
    log = None if args.json else (lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    result = run_bench(
        cfg, opts, preset=preset, log=log, command=shlex.join(["jaxmnist", *args.argv])
    )
    if args.profile_steps:
        from jaxmnist.bench.measure import profile_bench_config  # start-up: imports jax

        result["profile"] = profile_bench_config(cfg, opts, result, args.profile_steps, out)
    paths = write_outputs(result, out)
    if args.json:
        print(to_json(result), end="")
    else:
        print(format_table(result))
        if args.profile_steps:
            from jaxmnist.profiling import breakdown  # start-up: only when asked

            print(breakdown.format_table(result["profile"]))
        print(f"wrote {paths['json']}, {paths['png'].name}, {paths['html'].name}")
    return 0
