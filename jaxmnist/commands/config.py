"""`jaxmnist config`: print the config a preset, flags and overrides resolve to, as JSON."""

from __future__ import annotations

import argparse
import json

from jaxmnist.commands import options


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("config", help="print the resolved config for a preset and overrides")
    options.add_config_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    cfg, _ = options.resolve_config(args)
    print(json.dumps(cfg.to_dict(), indent=2))
    return 0
