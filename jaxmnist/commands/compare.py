"""`jaxmnist compare RUN_DIR...`: one HTML page comparing several runs."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("compare", help="one HTML page comparing several runs")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--out", default="comparison.html", help="the page to write (default comparison.html)"
    )
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist.report.compare import write_comparison  # start-up: matplotlib and jax

    print(write_comparison(args.run_dirs, args.out))
    return 0
