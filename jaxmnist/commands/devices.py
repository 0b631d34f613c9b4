"""`jaxmnist devices`: the backend, its devices, the mesh a run would build, where arrays land.

It resolves the config and starts the processes exactly as `train` does, so what it
prints is what a run of the same command line would get.
"""

from __future__ import annotations

import argparse
import json

from jaxmnist.commands import options


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "devices", help="backend, devices, the mesh a run would build, and where arrays land"
    )
    options.add_config_args(p)
    options.add_process_args(p)
    p.add_argument("--json", action="store_true", help="print all of it as one JSON object")
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist import runtime  # start-up: imports jax

    cfg, _ = options.resolve_config(args)
    layout = options.start_processes(args, cfg)
    report = {
        "environment": runtime.environment(),
        "placement": runtime.placement_report(layout, cfg),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_devices(report)
    return 0


def print_devices(report: dict) -> None:
    env, place = report["environment"], report["placement"]
    print(
        f"backend      {env['backend']} ({env['device_kind']}), jax {env['jax']}, "
        f"jaxlib {env['jaxlib']}, {env['process_count']} process(es)"
    )
    print(f"devices      {', '.join(env['devices'])}")
    mesh = place["mesh"]
    print(
        f"mesh         members={mesh['members']} x data={mesh['data']} over "
        f"{', '.join(place['devices'])}"
    )
    rows = [(f"params {name}", where) for name, where in place["params"].items()]
    rows += [
        (name.replace("_", " "), place[name])
        for name in ("batch", "train_set", "eval_batches", "logits")
    ]
    width = max(len(name) for name, _ in rows) + 2
    for name, where in rows:
        shape = "x".join(map(str, where["shape"]))
        print(f"{name:<{width}} {shape:<14} {where['spec']:<24} {', '.join(where['devices'])}")
