"""The `jaxmnist` command line: the only module that reads arguments or exits.

Each subcommand parses its arguments into a `Config` (or a path), calls the
importable function that does the work, and prints. A `JaxmnistError` becomes
one line on stderr and its exit code; argument errors exit with 2 before any
work starts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path

from jaxmnist import config as config_lib
from jaxmnist.errors import JaxmnistError

# Plain flags for the fields people change most: flag -> (dotted key, type, help).
FLAGS = {
    "--dataset": ("data.dataset", str, "mnist or fashion_mnist"),
    "--data-dir": ("data.data_dir", str, "folder holding <dataset>/... (default: $JAXMNIST_DATA_DIR, cache, system, download)"),
    "--model": ("model.name", str, "model (mlp)"),
    "--hidden": ("model.hidden", str, "hidden sizes, e.g. 256,128"),
    "--activation": ("model.activation", str, "relu or gelu"),
    "--dtype": ("model.dtype", str, "compute dtype: float32 or bfloat16"),
    "--optimizer": ("optimizer.name", str, "sgd, adam or adamw"),
    "--lr": ("optimizer.lr", str, "peak learning rate"),
    "--weight-decay": ("optimizer.weight_decay", str, "weight decay (adamw, sgd)"),
    "--schedule": ("optimizer.schedule", str, "constant, cosine, warmup_cosine or onecycle"),
    "--batch-size": ("train.batch_size", str, "training batch size"),
    "--epochs": ("train.epochs", str, "number of epochs"),
    "--steps": ("train.steps", str, "number of steps (overrides --epochs)"),
    "--seed": ("train.seed", str, "random seed"),
}


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tpu101", help=f"starting config: {', '.join(config_lib.PRESETS)} (default tpu101)")
    for flag, (key, _, help_) in FLAGS.items():
        p.add_argument(flag, dest=key, metavar=flag.lstrip("-").upper().replace("-", "_"), help=help_)
    p.add_argument("--no-compile-cache", action="store_true", help="turn off JAX's persistent compilation cache")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="any config field, e.g. optimizer.grad_clip=1.0 train.eval_train=false (see `jaxmnist config`)",
    )


def resolve_config(args: argparse.Namespace) -> tuple[config_lib.Config, str]:
    """Preset, then plain flags, then KEY=VALUE overrides; validated."""
    cfg = config_lib.get_preset(args.preset)
    overrides = {key: getattr(args, key) for key, _, _ in FLAGS.values() if getattr(args, key) is not None}
    overrides.update(config_lib.parse_override(o) for o in args.overrides)
    if args.no_compile_cache:
        overrides["compile_cache"] = False
    cfg = config_lib.apply_overrides(cfg, overrides)
    config_lib.validate(cfg)
    return cfg, args.preset


def _default_run_dir(preset: str, cfg: config_lib.Config) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{preset}-{cfg.data.dataset}-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def cmd_train(args) -> int:
    from jaxmnist import rundir
    from jaxmnist.reporting import TerminalReporter
    from jaxmnist.train import train_and_evaluate

    cfg, preset = resolve_config(args)
    workdir = Path(args.run_dir) if args.run_dir else _default_run_dir(preset, cfg)
    rundir.check_writable(workdir)
    mode = "json" if args.json else "quiet" if args.quiet else "normal"
    reporter = TerminalReporter(mode, workdir)
    summary = train_and_evaluate(cfg, workdir, reporter)
    if args.json:
        print(json.dumps({"run_dir": str(workdir), **summary}, indent=2))
    return 0


def cmd_eval(args) -> int:
    from jaxmnist.evaluate import evaluate_run
    from jaxmnist.reporting import print_eval

    result = evaluate_run(args.run_dir, data_dir=args.data_dir)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_eval(result)
    return 0


def cmd_config(args) -> int:
    cfg, _ = resolve_config(args)
    print(json.dumps(cfg.to_dict(), indent=2))
    return 0


def cmd_devices(args) -> int:
    from jaxmnist import runtime

    report = {"environment": runtime.environment(), "placement": runtime.placement_report()}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    env, place = report["environment"], report["placement"]
    print(f"backend      {env['backend']} ({env['device_kind']}), jax {env['jax']}, jaxlib {env['jaxlib']}")
    for d in env["devices"]:
        print(f"device       {d}")
    print(f"default      {place['default_device']}")
    for name, where in place["params"].items():
        print(f"params{name:<8}{', '.join(where)}")
    print(f"batch        {', '.join(place['batch'])}")
    print(f"logits       {', '.join(place['logits'])}")
    print("placement    ok: everything is on the default device" if place["on_default_device"]
          else "placement    WARNING: some arrays are not on the default device")
    return 0


def cmd_data(args) -> int:
    from jaxmnist import data
    from jaxmnist.reporting import print_data_info, print_verify

    if args.action == "download":  # the downloader reports mirrors and retries through logging
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger("jaxmnist.data").addHandler(handler)
        logging.getLogger("jaxmnist.data").setLevel(logging.INFO)
    names = [args.dataset] if args.dataset else list(data.DATASETS)
    for name in names:
        data.get_spec(name)
    for name in names:
        if args.action == "download":
            folder = data.download_dataset(name, args.cache_dir)
            print(f"{name}: verified copy in {folder}")
        elif args.action == "verify":
            print_verify(name, data.verify_dataset(name, args.data_dir))
        else:
            print_data_info(data.dataset_info(name, args.data_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxmnist", description="Train and benchmark MNIST-family classifiers with JAX and Optax."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a model and write a run directory")
    _add_config_args(p)
    p.add_argument("--run-dir", help="where to write the run (default runs/<preset>-<dataset>-<time>)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="print only the final result line")
    out.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="re-evaluate a run's saved parameters")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--data-dir", help="folder holding <dataset>/...")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("config", help="print the resolved config for a preset and overrides")
    _add_config_args(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("devices", help="backend, devices, and where arrays land")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("data", help="download, verify or describe datasets")
    p.add_argument("action", choices=("download", "verify", "info"))
    p.add_argument("dataset", nargs="?", help="mnist or fashion_mnist (default: all)")
    p.add_argument("--data-dir", help="folder holding <dataset>/... to verify or describe")
    p.add_argument("--cache-dir", help="download into this folder instead of the user cache")
    p.set_defaults(func=cmd_data)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except JaxmnistError as e:
        print(f"jaxmnist {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"jaxmnist {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
