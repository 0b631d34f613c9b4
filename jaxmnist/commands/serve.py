"""`jaxmnist serve RUN_DIR`: a local web page to draw or upload images, and a JSON API.

The server lives in `jaxmnist.use.serve`, an optional extra; the port is checked here,
as the argument is parsed.
"""

from __future__ import annotations

import argparse

from jaxmnist.use.members import add_member_option


def port(text: str) -> int:
    """argparse type: a TCP port number, 0 (any free port) to 65535."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)")
    return int(text)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        allow_abbrev=False,
        help="a local web page to draw or upload images, and a JSON API",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--port", type=port, default=8000, help="port (default 8000; 0: any free)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    add_member_option(p)
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist.use.serve import serve  # optional extra (serve), and start-up: imports jax

    return serve(
        args.run_dir,
        host=args.host,
        port=args.port,
        member=args.member,
        memory_budget_mb=args.memory_budget_mb,
    )
