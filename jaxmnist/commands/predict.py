"""`jaxmnist predict RUN_DIR INPUT...`: top classes for people's images or arrays.

A run of several seeds predicts as the ensemble of its members unless --member picks
one. Images are preprocessed the way the run's dataset asks (unless --no-preprocess); one
unreadable input is reported on stderr and makes the exit status 1, the others still
get their predictions.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxmnist.errors import ConfigError
from jaxmnist.use.members import add_member_option


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "predict",
        allow_abbrev=False,
        help="top classes for your own images (PNG, JPEG, ...) or .npy/.npz arrays",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="image files or .npy/.npz arrays")
    p.add_argument("-k", type=int, default=3, help="how many top classes to show (default 3)")
    p.add_argument("--json", action="store_true", help="one JSON object per input on stdout")
    p.add_argument(
        "--no-preprocess",
        action="store_true",
        help="feed images of the dataset's image size as they are (no inversion, cropping or "
        "centring)",
    )
    p.add_argument("--show-input", metavar="DIR", help="write what the model saw as PNGs here")
    add_member_option(p)
    return p


def check_k(k: int, num_classes: int) -> None:
    """-k is checked against the run's classes, so only once the run is read."""
    if not 1 <= k <= num_classes:
        raise ConfigError(f"-k must be within 1..{num_classes}")


def run(args: argparse.Namespace) -> int:
    from jaxmnist.runs import rundir  # start-up: imports jax
    from jaxmnist.use import predict  # start-up: imports jax

    model = predict.load_trained(args.run_dir, args.member, args.memory_budget_mb)
    check_k(args.k, len(model.class_names))
    show = rundir.check_writable(args.show_input) if args.show_input else None
    print(f"model: {model.describe()}", file=sys.stderr)
    items = predict.read_inputs(args.inputs, not args.no_preprocess, model.dataset)
    records = predict.predict_items(model, items, args.k)
    if args.json:
        for r in records:
            print(json.dumps(r))
    elif table := predict.format_table(records):
        print(table)
    for r in records:
        if "error" in r:
            print(f"jaxmnist predict: error: {r['error']}", file=sys.stderr)
        elif "warning" in r:  # predicted all the same, but the guess reads nothing
            print(f"jaxmnist predict: warning: {r['input']}: {r['warning']}", file=sys.stderr)
    if show:
        written = predict.write_inputs(show, items)
        print(f"wrote {len(written)} model inputs to {show}", file=sys.stderr)
    return 1 if any("error" in r for r in records) else 0
