"""`jaxmnist train`: train a config's seeds and write a run directory (or resume one).

The command resolves and validates the config, checks its own flags, joins the other
processes and builds the mesh once, takes the run directory's lock, and hands all of it
to `train_and_evaluate` with the terminal as a callback. Then, in process 0 only, it
writes the report and says whether the target accuracy was reached (exit 3 when not).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from jaxmnist import config as config_lib
from jaxmnist.commands import options, profile, terminal
from jaxmnist.commands.terminal import TerminalReporter, plural
from jaxmnist.errors import ConfigError, TargetNotReached
from jaxmnist.report.background import ReportRenderer
from jaxmnist.training import supervisor
from jaxmnist.training.preemption import Stopped, StopRequest


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train", help="train a model and write a run directory")
    options.add_config_args(p)
    p.add_argument(
        "--run-dir", help="where to write the run (default runs/<preset>-<dataset>-<time>)"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="print only the final result line")
    out.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-report", action="store_true", help="do not write report.html and plots/")
    profile.add_profile_steps(p)  # traced after training, into the run directory and report
    options.add_process_args(p)
    g = p.add_argument_group(
        "checkpoints and resuming",
        "Orbax checkpoints in RUN_DIR/checkpoints; SIGTERM or Ctrl-C stop within about a "
        "second with a checkpoint, mid-epoch too (exit 143 or 130)",
    )
    g.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue RUN_DIR from its newest intact checkpoint, with its saved config "
        "(--epochs N extends it; fields that change the maths are refused)",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=1,
        metavar="N",
        help="save a checkpoint every N epochs, and after the last (default 1)",
    )
    g.add_argument(
        "--checkpoint-every-steps",
        type=int,
        default=0,
        metavar="K",
        help="also save a checkpoint every K steps, inside epochs (for long epochs; default: "
        "only at epoch ends)",
    )
    g.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        metavar="K",
        help="keep the newest K checkpoints (default 3)",
    )
    g.add_argument("--no-checkpoint", action="store_true", help="save no checkpoints")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="train into a run directory that already holds a run (its checkpoints are removed)",
    )
    return p


def check_checkpoint_flags(args: argparse.Namespace) -> None:
    """One line and exit 2 for a checkpoint flag out of range, before any work."""
    for flag in ("--checkpoint-every", "--keep-checkpoints"):
        if (value := getattr(args, flag[2:].replace("-", "_"))) < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if (steps := args.checkpoint_every_steps) < 0:
        raise ConfigError(f"--checkpoint-every-steps must be >= 1 (0: off), got {steps}")


def run(args: argparse.Namespace) -> int:
    check_checkpoint_flags(args)
    if args.resume:
        cfg, workdir, finished = _resume_config(args)
        if finished:
            print(f"{workdir}: {finished}")
            return 0
    else:
        cfg, preset = options.resolve_config(args)
        workdir = Path(args.run_dir) if args.run_dir else options.default_run_dir(preset, cfg)
    if (code := supervisor.run_watched(args, workdir)) is not None:  # several processes
        return code
    with terminal.stdout_for_json_only(args.json) as out:  # --json: stdout holds it alone
        return _run(args, cfg, workdir, out)


def _run(args: argparse.Namespace, cfg, workdir: Path, out) -> int:
    from jaxmnist.runs import rundir  # start-up: imports jax
    from jaxmnist.training import parallel  # start-up: imports jax

    dataset = options.start_ahead(args, cfg)  # the device opens while the data are read
    layout = options.start_processes(args, cfg)
    main = parallel.is_main_process()
    # Process 0 holds the directory's lock until this command returns or dies; a run
    # refused before it started leaves no directory it made (`rundir.claim`).
    claim = rundir.claim(workdir) if main else contextlib.nullcontext()
    renderer = None
    try:
        with claim:
            if main and not args.resume:
                rundir.check_reusable(workdir, args.overwrite)
            mode = "json" if args.json else "quiet" if args.quiet else "normal"
            # Only process 0 prints; the others say nothing but errors.
            callbacks = [TerminalReporter(mode, workdir)] if main else []
            callbacks += profile.profiler(args, workdir)  # --profile-steps
            if main and not args.no_report:  # a child imports matplotlib while this trains
                renderer = ReportRenderer()
            summary = _train(args, cfg, workdir, callbacks, layout, dataset)
    except Stopped as e:  # a signal: checkpoint saved, no summary; not an error
        print(f"jaxmnist train: {supervisor.stopped_line(e, args, workdir)}", file=sys.stderr)
        return e.exit_code
    if not main:
        return 0
    report = renderer.finish(workdir) if renderer else None  # plots/ and report.html
    if report and mode == "normal":
        print(f"report: {report}")
    if args.json:
        result = {"run_dir": str(workdir), "report": report and str(report), **summary}
        print(json.dumps(result, indent=2), file=out, flush=True)
    _check_target(summary)
    return 0


def _resume_config(args: argparse.Namespace) -> tuple[config_lib.Config, Path, str | None]:
    """--resume RUN_DIR: (its config with the allowed overrides, RUN_DIR, why nothing is left)."""
    from jaxmnist.runs import resume  # start-up: imports jax

    workdir = Path(args.resume)
    if args.run_dir and Path(args.run_dir).resolve() != workdir.resolve():
        raise ConfigError("--resume RUN_DIR writes into RUN_DIR; drop --run-dir")
    if args.overwrite:
        raise ConfigError("--resume continues RUN_DIR and --overwrite replaces it; choose one")
    cfg, extended = resume.prepare(workdir, options.explicit_overrides(args), preset=args.preset)
    if not args.no_report and "--no-report" in resume.saved_command(workdir):
        # Started without a report, resumed so; command.txt keeps it for the next resume.
        args.no_report, args.argv = True, [*args.argv, "--no-report"]
    return cfg, workdir, resume.nothing_to_resume(workdir, cfg, extended)


def _train(args, cfg, workdir: Path, callbacks: list, layout, dataset) -> dict:
    """Trains with checkpoints (unless --no-checkpoint) and a clean stop on SIGTERM or
    Ctrl-C (`preemption.Stopped`); resumes RUN_DIR with --resume."""
    from jaxmnist.runs.checkpoint import CheckpointOptions  # start-up: imports jax
    from jaxmnist.runs.resume import Resumer  # start-up: imports jax
    from jaxmnist.train import train_and_evaluate  # start-up: imports jax

    every = (args.checkpoint_every, args.keep_checkpoints, args.checkpoint_every_steps)
    checkpoints = None if args.no_checkpoint else CheckpointOptions(*every)
    resumer = Resumer(workdir, cfg) if args.resume else None
    stop = StopRequest().install()
    try:
        return train_and_evaluate(
            cfg,
            workdir,
            callbacks,
            dataset=dataset and dataset.result(),
            layout=layout,
            checkpoints=checkpoints,
            resume=resumer,
            stop=stop,
            command=["jaxmnist", *args.argv],
        )
    except Exception as e:  # a lost peer is reported by the supervisor, not here
        supervisor.wait_for_verdict(e, args.process_timeout)
        raise
    finally:
        stop.uninstall()


def _check_target(summary: dict) -> None:
    """Exit 3, after everything was written, when --target-accuracy was not reached."""
    if summary.get("target_reached") is False:
        seeds = len(summary.get("seeds", [0]))
        split = "val" if summary.get("target_split") == "val" else "test"
        name = "validation" if split == "val" else "test"
        of = f"mean {name} accuracy of {seeds} seeds" if seeds > 1 else f"{name} accuracy"
        raise TargetNotReached(
            f"target {of} {summary['target_accuracy']:.2%} not reached: "
            f"{summary[f'{split}_accuracy']:.2%} after all {plural(summary['epochs'], 'epoch')}"
        )
