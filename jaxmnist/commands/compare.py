"""`jaxmnist compare RUN_DIR...`: one HTML page comparing several runs, and in the terminal
whether their test accuracies differ by more than the seeds' noise."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare",
        help="one HTML page comparing several runs; prints whether their accuracies differ "
        "significantly",
        description="One HTML page comparing several runs of one dataset, and in the "
        "terminal whether their test accuracies differ by more than their seeds' noise: "
        "Welch's t-test on the per-seed accuracies, two-sided, 5%, Holm-corrected over the "
        "pairs tested (every pair up to a few runs, else each against the best); a run of "
        "one seed has no spread, so no test.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--out", default="comparison.html", help="the page to write (default comparison.html)"
    )
    return p


def run(args: argparse.Namespace) -> int:
    # start-up: matplotlib and jax
    from jaxmnist.report.compare import load_runs, significance_lines, write_comparison

    runs = load_runs(args.run_dirs)
    path = write_comparison(runs, args.out)
    for line in significance_lines(runs):
        print(line)
    print(path)
    return 0
