"""What several commands share: the config flags, the process flags, default output folders.

A command that trains (train, sweep, bench, config, devices) takes a `--preset`, the
plain flags of `FLAGS` and KEY=VALUE overrides, and `resolve_config` turns them into one
validated `Config`, in that order of precedence. Commands that may run as one of several
processes add `add_process_args` and call `start_processes` once, before reading data.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from jaxmnist import config as config_lib
from jaxmnist.data.registry import DATASETS
from jaxmnist.models import MODELS  # the registry alone: no family's jax code


def one_of(names) -> str:
    """`a`, `a or b`, `a, b or c`."""
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


# Plain flags for the fields people change most: flag -> (dotted key, type, help).
FLAGS = {
    "--dataset": ("data.dataset", str, one_of(DATASETS)),
    "--data-dir": (
        "data.data_dir",
        str,
        "folder holding <dataset>/... (default: $JAXMNIST_DATA_DIR, cache, system, download)",
    ),
    "--model": ("model.name", str, f"model family: {one_of(MODELS)}"),
    "--hidden": ("model.hidden", str, "hidden sizes, e.g. 256,128 ('': none, a linear model)"),
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
    "--seeds": (
        "train.seeds",
        str,
        "train N models (seeds SEED...SEED+N-1) in one program; report mean ± spread",
    ),
    "--target-accuracy": (
        "train.target_accuracy",
        str,
        (
            "stop after the first epoch whose (mean) test accuracy reaches this fraction, "
            "e.g. 0.973 (--target-split val: the validation split's)"
        ),
    ),
    "--target-split": (
        "train.target_split",
        str,
        (
            "the split --target-accuracy watches: test (the default, as speedruns do) or val "
            "(the examples data.validation=N holds out)"
        ),
    ),
    "--devices": (
        "parallel.devices",
        str,
        (
            "devices to train on: N or all (default 1; on a CPU, fake devices share the same cores "
            "and only cost)"
        ),
    ),
    "--mesh": (
        "parallel.mesh",
        str,
        (
            "members=M,data=D: models of a population split over M devices, each batch over D "
            "(default: all members when several models train, else all data)"
        ),
    ),
}


DEFAULT_PRESET = "tpu101"


def preset_name(args: argparse.Namespace) -> str:
    """The preset the command line names, or the default one."""
    return args.preset if args.preset is not None else DEFAULT_PRESET


def whole_number(low: int, high: int | None = None):
    """An argparse `type`: a whole number from `low` to `high` (None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            word = "0 or more" if low == 0 else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {word}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    return parse


def not_empty(text: str) -> str:
    """An argparse `type`: any text but an empty or blank one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def add_config_args(p: argparse.ArgumentParser, leave_out: tuple[str, ...] = ()) -> None:
    """--preset, the flags of `FLAGS`, the compile cache and TensorBoard switches, KEY=VALUE;
    without the flags named in `leave_out` (those that mean nothing to a command)."""
    p.add_argument(
        "--preset",
        # None, not tpu101: `train --resume` must tell a preset given from none (see
        # `preset_name`, where None becomes the default).
        default=None,
        help=f"starting config: {', '.join(config_lib.PRESETS)} (default {DEFAULT_PRESET})",
    )
    for flag, (key, _, help_) in FLAGS.items():
        if flag not in leave_out:
            p.add_argument(
                flag, dest=key, metavar=flag.lstrip("-").upper().replace("-", "_"), help=help_
            )
    p.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="turn off JAX's persistent compilation cache",
    )
    if "--tensorboard" not in leave_out:
        p.add_argument(
            "--tensorboard",
            action="store_true",
            help="write TensorBoard event files in the run directory",
        )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help=(
            "any config field, e.g. optimizer.grad_clip=1.0 train.eval_train=false "
            "(see `jaxmnist config`)"
        ),
    )


def explicit_overrides(args: argparse.Namespace, leave_out: tuple[str, ...] = ()) -> dict:
    """The config fields the command line sets (flags, then KEY=VALUE), without the preset.

    leave_out: flags of `FLAGS` (e.g. "--devices") a command reads for itself.
    """
    overrides = {
        key: getattr(args, key)
        for flag, (key, _, _) in FLAGS.items()
        if flag not in leave_out and getattr(args, key, None) is not None
    }
    overrides.update(config_lib.parse_override(o) for o in args.overrides)
    if args.no_compile_cache:
        overrides["compile_cache"] = False
    if getattr(args, "tensorboard", False):
        overrides["tensorboard"] = True
    return overrides


def resolve_config(
    args: argparse.Namespace, leave_out: tuple[str, ...] = ()
) -> tuple[config_lib.Config, str]:
    """Preset, then plain flags, then KEY=VALUE overrides; validated. Returns (cfg, preset)."""
    overrides = explicit_overrides(args, leave_out)
    preset = preset_name(args)
    cfg = config_lib.apply_overrides(config_lib.get_preset(preset), overrides)
    config_lib.validate(cfg)
    return cfg, preset


def add_process_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "several processes (hosts)",
        "every process runs the same command; on Cloud TPU, SLURM, Open MPI or Kubernetes "
        "--distributed finds the others by itself",
    )
    g.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address")
    g.add_argument("--num-processes", type=int, metavar="P", help="how many processes")
    g.add_argument("--process-id", type=int, metavar="I", help="this process, 0..P-1")
    g.add_argument(
        "--distributed", action="store_true", help="join a cluster jax.distributed detects"
    )
    g.add_argument(
        "--process-timeout",
        type=int,
        default=60,
        metavar="S",
        help="seconds to wait for the other processes, at start and when one stops "
        "answering during the run (default 60)",
    )


def start_ahead(args: argparse.Namespace, cfg: config_lib.Config):
    """Starts on threads what a run waits for before it trains: in a process that joins
    no other, the device opens (`parallel.open_devices_ahead`) while the trainer's
    modules are imported here and, for a new run, its data are read. Returns the data's
    Future (`data.load_dataset_ahead`), or None for a resumed run, which reads the data
    its run directory names."""
    from jaxmnist import hostmem, runtime  # start-up: imports jax
    from jaxmnist.data import load_dataset_ahead  # start-up: imports numpy
    from jaxmnist.training import parallel

    # Only a TPU reads the buffer's size; a resumed run's config is read later (the floor
    # `cli.main` set stays).
    if hostmem.tpu_installed() and not args.resume:
        largest = runtime.largest_copy_bytes(cfg.data.dataset, cfg.model, cfg.train.seeds)
        hostmem.size_tpu_transfer_buffer(largest)
    parallel.open_devices_ahead(args.coordinator, args.distributed)
    from jaxmnist import train  # noqa: F401  start-up: the trainer's imports

    if args.resume:
        return None
    d = cfg.data
    return load_dataset_ahead(d.dataset, d.data_dir, download=d.download)


def start_processes(args: argparse.Namespace, cfg: config_lib.Config):
    """Joins the other processes (if any) and builds the mesh: one line and exit 2 for
    an impossible request, before any data is read. Returns the `parallel.Layout`."""
    from jaxmnist.training import parallel  # start-up: jax loads only when a command runs

    parallel.check_process_args(args.coordinator, args.num_processes, args.process_id)
    if args.process_timeout < 1:
        raise config_lib.ConfigError(
            f"--process-timeout must be at least 1 s, got {args.process_timeout}"
        )
    parallel.initialize_distributed(
        args.coordinator,
        args.num_processes,
        args.process_id,
        auto=args.distributed,
        timeout_seconds=args.process_timeout,
    )
    t = cfg.train  # the mesh, checked for the seeds and the batch size
    return parallel.layout_for(cfg.parallel, num_models=t.seeds, batch_size=t.batch_size)


def timestamp() -> str:
    """The local time, for default folder names: 20250131-142501."""
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def default_run_dir(preset: str, cfg: config_lib.Config) -> Path:
    """runs/<preset>-<dataset>-<time>, with -2, -3, ... when that exists already."""
    base = Path("runs") / f"{preset}-{cfg.data.dataset}-{timestamp()}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def default_out(kind: str, preset: str) -> Path:
    """runs/<kind>-<preset>-<time>: where a sweep or a benchmark writes by default."""
    return Path("runs") / f"{kind}-{preset}-{timestamp()}"
