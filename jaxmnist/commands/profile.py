"""`jaxmnist profile`: a `jax.profiler` trace of N steady training steps, and where a
step's time goes.

The config is resolved as `train` resolves it; its population is compiled and warmed
up by the run loop (N steps), then N more steps are traced into the output folder
(`profiling.recipe.profile_config`), which TensorBoard's profile plugin and Perfetto open.
Without `--profile-steps` it warms up 20 steps and traces as many as one of a run's
calls holds (`profiling.trace.call_steps`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from jaxmnist.commands import options
from jaxmnist.errors import ConfigError

DEFAULT_STEPS = "as many as one of a run's calls holds (at most an epoch), and at least 20"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile",
        allow_abbrev=False,
        help="trace N steady training steps; where a step's time goes, by kind of operation",
    )
    options.add_config_args(p)
    add_profile_steps(p, default=DEFAULT_STEPS)
    p.add_argument(
        "--out",
        help="folder for the trace and profile.json (default runs/profile-<preset>-<time>)",
    )
    p.add_argument(
        "--peak-size",
        type=int,
        metavar="N",
        help="side of the square matmul whose FLOP/s is the peak (default by backend, as bench)",
    )
    p.add_argument(
        "--json", action="store_true", help="print profile.json on stdout instead of the table"
    )
    return p


def add_profile_steps(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """--profile-steps N, shared by profile, train and bench; `default` says in the help
    what no N means (None: no profile)."""
    what = f"(default: {default})" if default else "(default: no profile)"
    p.add_argument(
        "--profile-steps",
        type=int,
        default=None,
        metavar="N",
        help=f"trace N steady training steps (after compilation and warm-up) {what}",
    )


# Steps one trace may hold: each is recorded event by event, so a trace grows with the
# steps (and so does the time to write and read it); a few epochs of any preset fit.
MAX_PROFILE_STEPS = 10_000


def check_profile_steps(value: int | None) -> None:
    """One line and exit 2 for a step count below 1 or above `MAX_PROFILE_STEPS`."""
    if value is not None and value < 1:
        raise ConfigError(f"--profile-steps must be at least 1, got {value}")
    if value is not None and value > MAX_PROFILE_STEPS:
        raise ConfigError(
            f"--profile-steps is at most {MAX_PROFILE_STEPS:,} (a trace records every event "
            f"of every step), got {value:,}"
        )


def profiler(args: argparse.Namespace, workdir) -> list:
    """train's `--profile-steps N`: [the callback that traces N steps after the run into
    `workdir`] (every process runs the steps; process 0 writes), or [] without the flag;
    one line and exit 2 for a bad N (inside the run directory's claim: nothing is left)."""
    check_profile_steps(args.profile_steps)
    if not args.profile_steps:
        return []
    from jaxmnist.profiling.callback import ProfileSteps  # start-up: imports jax

    log = None if (args.json or args.quiet) else print
    return [ProfileSteps(workdir, args.profile_steps, log)]


def progress(line: str) -> None:
    """A phase's line on stderr, at once (the table goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    # start-up: jax and the training layer load only when the command runs
    from jaxmnist import runtime
    from jaxmnist.data import load_dataset
    from jaxmnist.profiling.breakdown import PROFILE_JSON, format_table
    from jaxmnist.profiling.recipe import profile_config
    from jaxmnist.runs import rundir
    from jaxmnist.training import parallel

    check_profile_steps(args.profile_steps)
    if args.peak_size is not None and args.peak_size < 1:
        raise ConfigError(f"--peak-size must be at least 1, got {args.peak_size}")
    cfg, preset = options.resolve_config(args)
    t = cfg.train
    layout = parallel.layout_for(cfg.parallel, num_models=t.seeds, batch_size=t.batch_size)
    out = Path(args.out or options.default_out("profile", preset))
    if any((out / name).exists() for name in (rundir.CONFIG_FILE, rundir.SUMMARY_FILE)):
        raise ConfigError(
            f"{out} holds a training run, whose profile.json belongs to it; give --out a "
            f"folder of its own (`train --profile-steps N` profiles a run into its directory)"
        )
    out = rundir.check_writable(out)
    if cfg.compile_cache:
        runtime.enable_compilation_cache()
    dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=cfg.data.download)
    if not args.json:
        steps = f"{args.profile_steps} steps" if args.profile_steps else "a run's call of steps"
        warm = "as many" if args.profile_steps else "20"
        progress(
            f"profile: {steps} of {preset} ({cfg.model.name}, batch {t.batch_size}) on "
            f"{layout.describe().get('devices', ['?'])[0]}, after {warm} to compile and warm up"
        )
    table = profile_config(
        cfg,
        dataset,
        steps=args.profile_steps,
        out_dir=out,
        layout=layout,
        peak_size=args.peak_size,
        log=None if args.json else progress,
    )
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    print(format_table(table))
    print(f"wrote {Path(out) / PROFILE_JSON} and the trace {Path(out) / table['trace']}")
    logdir = shlex.quote(str(out))  # a command to copy: a path with spaces stays one word
    print(f"open it: tensorboard --logdir {logdir}  (pip install tensorboard-plugin-profile)")
    if table.get("perfetto"):
        print(f"or load {Path(out) / table['perfetto']} at https://ui.perfetto.dev")
    return 0
