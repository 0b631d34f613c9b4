"""`jaxmnist report RUN_DIR`: (re)write a run's report.html and plots/."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="(re)write a run's report.html and plots/")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", help="write the page here instead of RUN_DIR/report.html")
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist.report.run_report import write_run_report  # start-up: matplotlib and jax

    print(write_run_report(args.run_dir, args.out))
    return 0
