"""`jaxmnist export RUN_DIR --out FILE`: one file that runs the trained model with only jax
(and flatbuffers, which jax.export's deserialisation needs).

The file holds StableHLO for each platform asked for, the parameters and a JSON header
(a run of several seeds: the ensemble of its members, one function, unless --member);
the output path is checked before the run is read.
"""

from __future__ import annotations

import argparse
import sys

from jaxmnist.use.members import add_member_option


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export",
        allow_abbrev=False,
        help="one file (StableHLO + parameters + JSON header) that needs only jax and "
        "flatbuffers to run",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    required = p.add_argument_group("required")
    required.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    p.add_argument(
        "--platforms",
        default="cpu,cuda,tpu",
        help="platforms the file runs on (default cpu,cuda,tpu)",
    )
    add_member_option(p)
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist.use import export, predict  # start-up: imports jax

    out = export.check_output(args.out)
    model = predict.load_trained(args.run_dir, args.member, args.memory_budget_mb)
    header = export.export_model(model, out, platforms=args.platforms.split(","))
    print(f"model: {model.describe()}", file=sys.stderr)
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1e6:.1f} MB, platforms {', '.join(header['platforms'])})")
    return 0
