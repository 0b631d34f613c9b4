"""`jaxmnist data ACTION [DATASET]`: download, verify, describe or show datasets.

The datasets are the registry's (`jaxmnist.data.DATASETS`); without a DATASET an action
covers them all. `download` shows the downloader's mirrors and retries while it runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from jaxmnist import data as data_lib
from jaxmnist.commands.options import one_of
from jaxmnist.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("data", help="download, verify, describe or show datasets")
    p.add_argument("action", choices=("download", "verify", "info", "show"))
    p.add_argument("dataset", nargs="?", help=f"{one_of(data_lib.DATASETS)} (default: all)")
    p.add_argument("--data-dir", help="folder holding <dataset>/... to verify or describe")
    p.add_argument("--cache-dir", help="download into this folder instead of the user cache")
    p.add_argument("--out", help="show: the PNG to write (default <dataset>_examples.png)")
    return p


def run(args: argparse.Namespace) -> int:
    if args.action != "download":
        return _run_action(args)
    # The downloader reports mirrors and retries through logging: shown while it runs,
    # and the logger left as it was (main() may be called again, from a test or a notebook).
    log = logging.getLogger("jaxmnist.data")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        return _run_action(args)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _run_action(args: argparse.Namespace) -> int:
    names = [args.dataset] if args.dataset else list(data_lib.DATASETS)
    for name in names:
        data_lib.get_spec(name)
    if args.out and len(names) > 1:
        raise ConfigError("--out needs one DATASET")
    for name in names:
        if args.action == "show":
            from jaxmnist.report.image_grids import dataset_examples_png  # start-up: matplotlib
            from jaxmnist.runs.rundir import atomic_write  # start-up: imports jax

            out = Path(args.out or f"{name}_examples.png")
            png = dataset_examples_png(data_lib.load_dataset(name, args.data_dir))
            atomic_write(out, png)
            print(out)
        elif args.action == "download":
            folder = data_lib.download_dataset(name, args.cache_dir)
            print(f"{name}: verified copy in {folder}")
        elif args.action == "verify":
            print_verify(name, data_lib.verify_dataset(name, args.data_dir))
        else:
            print_data_info(data_lib.dataset_info(name, args.data_dir))
    return 0


def print_verify(name: str, reports) -> None:
    for r in reports:
        print(f"{name}: {r}")
    print(f"{name}: {len(reports)} arrays verified")


def print_data_info(info: dict) -> None:
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "search_path":
            value = " -> ".join(f"{p['place']} ({p['folder']})" for p in value)
        elif key == "files":
            value = ", ".join(value)
        elif isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value))
        elif value is None:  # for people, not Python's repr
            value = "none"
        print(f"{key:<{width}}  {value}")
