"""The `jaxmnist` command line: the only module that reads arguments or exits.

Each subcommand parses its arguments into a `Config` (or a path), calls the
importable function that does the work, and prints. A `JaxmnistError` becomes
one line on stderr and its exit code; argument errors exit with 2 before any
work starts.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import logging
import os
import sys
import threading
from pathlib import Path

from jaxmnist import config as config_lib
from jaxmnist.errors import JaxmnistError

# Plain flags for the fields people change most: flag -> (dotted key, type, help).
FLAGS = {
    "--dataset": ("data.dataset", str, "mnist or fashion_mnist"),
    "--data-dir": (
        "data.data_dir",
        str,
        "folder holding <dataset>/... (default: $JAXMNIST_DATA_DIR, cache, system, download)",
    ),
    "--model": ("model.name", str, "model family: mlp or cnn"),
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
    "--seeds": (
        "train.seeds",
        str,
        "train N models (seeds SEED...SEED+N-1) in one program; report mean ± spread",
    ),
    "--target-accuracy": (
        "train.target_accuracy",
        str,
        "stop after the first epoch whose (mean) test accuracy reaches this fraction, e.g. 0.973",
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


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        default="tpu101",
        help=f"starting config: {', '.join(config_lib.PRESETS)} (default tpu101)",
    )
    for flag, (key, _, help_) in FLAGS.items():
        p.add_argument(
            flag, dest=key, metavar=flag.lstrip("-").upper().replace("-", "_"), help=help_
        )
    p.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="turn off JAX's persistent compilation cache",
    )
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


def resolve_config(args: argparse.Namespace) -> tuple[config_lib.Config, str]:
    """Preset, then plain flags, then KEY=VALUE overrides; validated."""
    cfg = config_lib.apply_overrides(config_lib.get_preset(args.preset), _explicit_overrides(args))
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


def _add_process_args(p: argparse.ArgumentParser) -> None:
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


def _start_processes(args, cfg) -> object:
    """Joins the other processes (if any) and builds the mesh: one line and exit 2 for
    an impossible request, before any data is read. Returns the `parallel.Layout`."""
    from jaxmnist.training import parallel
    from jaxmnist.training.loop import layout_for

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
    layout = layout_for(cfg)
    parallel.check_layout(layout, num_models=cfg.train.seeds, batch_size=cfg.train.batch_size)
    return layout


def cmd_train(args) -> int:
    from jaxmnist.reporting import TerminalReporter
    from jaxmnist.runs import rundir
    from jaxmnist.training import parallel
    from jaxmnist.training.preemption import Stopped

    for flag, value in (
        ("--checkpoint-every", args.checkpoint_every),
        ("--keep-checkpoints", args.keep_checkpoints),
    ):
        if value < 1:
            raise config_lib.ConfigError(f"{flag} must be at least 1, got {value}")
    if args.checkpoint_every_steps < 0:
        raise config_lib.ConfigError(
            f"--checkpoint-every-steps must be >= 1 (0: off), got {args.checkpoint_every_steps}"
        )
    if args.resume:
        cfg, workdir, extended = _resume_config(args)
        if (workdir / "summary.json").exists() and not extended:
            print(f"{workdir}: the run already finished; nothing to resume (--epochs N extends it)")
            return 0
    else:
        cfg, preset = resolve_config(args)
        workdir = Path(args.run_dir) if args.run_dir else _default_run_dir(preset, cfg)
    layout = _start_processes(args, cfg)
    main = parallel.is_main_process()
    lock = None
    if main:
        rundir.check_writable(workdir)
        lock = rundir.lock_run_dir(workdir)  # held until this command returns or dies
    try:
        if main:
            if not args.resume:
                rundir.check_reusable(workdir, args.overwrite)
            rundir.write_command(workdir, ["jaxmnist", *args.argv])
        mode = "json" if args.json else "quiet" if args.quiet else "normal"
        reporter = TerminalReporter(mode, workdir) if main else None
        if main and not args.no_report:
            # matplotlib takes ~1 s to import; do it while the device trains, not after.
            threading.Thread(
                target=importlib.import_module, args=("jaxmnist.report.run_report",), daemon=True
            ).start()
        summary = _train_with_checkpoints(args, cfg, workdir, reporter, layout)
    except Stopped as e:  # a signal: checkpoint saved, no summary; not an error
        print(f"jaxmnist train: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        if lock is not None:
            lock.release()
    if not main:  # only process 0 prints; the others say nothing but errors
        return 0
    report = None
    if not args.no_report:
        from jaxmnist.report.run_report import write_run_report

        report = write_run_report(workdir)
        if mode == "normal":
            print(f"report: {report}")
    if args.json:
        print(
            json.dumps(
                {"run_dir": str(workdir), "report": report and str(report), **summary}, indent=2
            )
        )
    _check_target(summary)
    return 0


def _explicit_overrides(args) -> dict:
    """The config fields the command line sets (flags, then KEY=VALUE), without the preset."""
    overrides = {
        key: getattr(args, key) for key, _, _ in FLAGS.values() if getattr(args, key) is not None
    }
    overrides.update(config_lib.parse_override(o) for o in args.overrides)
    if args.no_compile_cache:
        overrides["compile_cache"] = False
    if args.tensorboard:
        overrides["tensorboard"] = True
    return overrides


def _resume_config(args) -> tuple[config_lib.Config, Path, bool]:
    """--resume RUN_DIR: (the saved config with the allowed overrides, RUN_DIR, extended)."""
    from jaxmnist.runs import resume

    workdir = Path(args.resume)
    if args.run_dir and Path(args.run_dir).resolve() != workdir.resolve():
        raise config_lib.ConfigError("--resume RUN_DIR writes into RUN_DIR; drop --run-dir")
    cfg, extended = resume.prepare(workdir, _explicit_overrides(args))
    return cfg, workdir, extended


def _train_with_checkpoints(args, cfg, workdir: Path, reporter, layout) -> dict:
    """Trains with checkpoints (unless --no-checkpoint) and a clean stop on SIGTERM or
    Ctrl-C (`preemption.Stopped`); resumes RUN_DIR with --resume."""
    from jaxmnist.runs.checkpoint import CheckpointOptions
    from jaxmnist.runs.resume import Resumer
    from jaxmnist.training.loop import train_and_evaluate
    from jaxmnist.training.preemption import StopRequest

    options = None
    if not args.no_checkpoint:
        options = CheckpointOptions(
            args.checkpoint_every, args.keep_checkpoints, args.checkpoint_every_steps
        )
    resumer = Resumer(workdir, cfg) if args.resume else None
    stop = StopRequest().install()
    try:
        return train_and_evaluate(
            cfg, workdir, reporter, layout=layout, checkpoints=options, resume=resumer, stop=stop
        )
    finally:
        stop.uninstall()


def _add_checkpoint_args(p: argparse.ArgumentParser) -> None:
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


def _check_target(summary: dict) -> None:
    """Exit 3, after everything was written, when --target-accuracy was not reached."""
    if summary.get("target_reached") is False:
        from jaxmnist.errors import TargetNotReached
        from jaxmnist.reporting import plural

        seeds = len(summary.get("seeds", [0]))
        of = f"mean test accuracy of {seeds} seeds" if seeds > 1 else "test accuracy"
        raise TargetNotReached(
            f"target {of} {summary['target_accuracy']:.2%} not reached: "
            f"{summary['test_accuracy']:.2%} after all {plural(summary['epochs'], 'epoch')}"
        )


def cmd_sweep(args) -> int:
    import shlex

    from jaxmnist import sweep
    from jaxmnist.runs import rundir

    cfg, preset = resolve_config(args)
    axes = sweep.parse_grid(args.grid or [], cfg)
    sweep.expand_grid(cfg, axes)  # every point validated before anything is loaded
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = rundir.check_writable(args.out or Path("runs") / f"sweep-{preset}-{stamp}")
    log = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    result = sweep.run_sweep(cfg, axes, log=log)
    paths = sweep.write_outputs(
        {"preset": preset, **result}, out, shlex.join(["jaxmnist", *args.argv])
    )
    if args.json:
        print(paths["json"].read_text(), end="")
    else:
        print(sweep.format_table(result))
        print(
            f"wrote {paths['json']}, {paths['csv'].name}, {paths['png'].name}, {paths['html'].name}"
        )
    if cfg.train.target_accuracy is not None and not any(
        x["epochs_to_target"] for x in result["results"]
    ):
        from jaxmnist.errors import TargetNotReached

        raise TargetNotReached(
            f"no grid point reached the target test accuracy {cfg.train.target_accuracy:.2%}"
        )
    return 0


def _add_sweep_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        allow_abbrev=False,
        help="train a grid of configs, many models per compiled program; mean ± CI per point",
    )
    _add_config_args(p)
    p.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2,...",
        help="a swept field and its values, repeatable: --grid optimizer.lr=1e-3,3e-3 "
        "--grid optimizer.weight_decay=0,1e-4 (tuple fields: model.hidden=256x128,512)",
    )
    p.add_argument(
        "--out",
        help="folder for sweep.json, sweep.csv, sweep.png, sweep.html "
        "(default runs/sweep-<preset>-<time>)",
    )
    p.add_argument(
        "--json", action="store_true", help="print sweep.json on stdout instead of the table"
    )
    p.set_defaults(func=cmd_sweep)


def cmd_report(args) -> int:
    from jaxmnist.report.run_report import write_run_report

    print(write_run_report(args.run_dir, args.out))
    return 0


def cmd_compare(args) -> int:
    from jaxmnist.report.compare import write_comparison

    print(write_comparison(args.run_dirs, args.out))
    return 0


def cmd_eval(args) -> int:
    from jaxmnist.reporting import print_eval
    from jaxmnist.training.evaluate import evaluate_run

    result = evaluate_run(args.run_dir, data_dir=args.data_dir)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_eval(result)
        if "checkpoint_step" in result:
            print(
                f"evaluated the newest checkpoint of an unfinished run: step "
                f"{result['checkpoint_step']} (epoch {result['checkpoint_epoch']})"
            )
    return 0


def cmd_config(args) -> int:
    cfg, _ = resolve_config(args)
    print(json.dumps(cfg.to_dict(), indent=2))
    return 0


def cmd_devices(args) -> int:
    from jaxmnist import runtime

    cfg, _ = resolve_config(args)
    layout = _start_processes(args, cfg)
    report = {
        "environment": runtime.environment(),
        "placement": runtime.placement_report(layout, cfg),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
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
    return 0


def cmd_data(args) -> int:
    if args.action != "download":
        return _data_action(args)
    # The downloader reports mirrors and retries through logging: shown while it runs,
    # and the logger left as it was (main() may be called again, from a test or a notebook).
    log = logging.getLogger("jaxmnist.data")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        return _data_action(args)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _data_action(args) -> int:
    from jaxmnist import data
    from jaxmnist.reporting import print_data_info, print_verify
    from jaxmnist.runs.rundir import atomic_write

    names = [args.dataset] if args.dataset else list(data.DATASETS)
    for name in names:
        data.get_spec(name)
    if args.out and len(names) > 1:
        raise config_lib.ConfigError("--out needs one DATASET")
    for name in names:
        if args.action == "show":
            from jaxmnist.report.image_grids import dataset_examples_png

            out = Path(args.out or f"{name}_examples.png")
            png = dataset_examples_png(data.load_dataset(name, args.data_dir))
            atomic_write(out, png)
            print(out)
        elif args.action == "download":
            folder = data.download_dataset(name, args.cache_dir)
            print(f"{name}: verified copy in {folder}")
        elif args.action == "verify":
            print_verify(name, data.verify_dataset(name, args.data_dir))
        else:
            print_data_info(data.dataset_info(name, args.data_dir))
    return 0


def cmd_bench(args) -> int:
    import shlex

    from jaxmnist.bench import make_options, run_bench
    from jaxmnist.bench.output import format_table, to_json, write_outputs
    from jaxmnist.runs import rundir

    # Here --devices lists device counts for the scaling table; each run sets its own.
    devices, args.__dict__["parallel.devices"] = getattr(args, "parallel.devices"), None
    cfg, preset = resolve_config(args)
    opts = make_options(
        devices=devices,
        modes=args.modes,
        dtypes=args.dtypes,
        batch_sizes=args.batch_sizes,
        sweep_mode=args.sweep_mode,
        tokens_per_example=args.tokens_per_example,
        synthetic=args.synthetic,
        quick=args.quick,
        variants=args.variants,
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = rundir.check_writable(args.out or Path("runs") / f"bench-{preset}-{stamp}")
    log = None if args.json else (lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    result = run_bench(
        cfg, opts, preset=preset, log=log, command=shlex.join(["jaxmnist", *args.argv])
    )
    paths = write_outputs(result, out)
    if args.json:
        print(to_json(result), end="")
    else:
        print(format_table(result))
        print(f"wrote {paths['json']}, {paths['png'].name}, {paths['html'].name}")
    return 0


def _add_bench_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        allow_abbrev=False,
        help="throughput: dispatch modes, dtypes, batch sizes, FLOP utilisation",
    )
    _add_config_args(p)
    p.add_argument(
        "--modes",
        help=(
            "comma-separated, of: python-dispatch, jit-step-host, jit-step-device, scan-epoch "
            "(default all)"
        ),
    )
    p.add_argument(
        "--dtypes", help="compute dtypes to compare, e.g. float32,bfloat16 (default both)"
    )
    p.add_argument(
        "--batch-sizes",
        help="batch-size sweep, e.g. 64,128,...,8192 (default 64 to 8192, doubling)",
    )
    p.add_argument(
        "--sweep-mode", help="mode for the dtype comparison and batch sweep (default scan-epoch)"
    )
    p.add_argument(
        "--tokens-per-example", help="also show tokens/s, labelled as a projection: examples/s x N"
    )
    p.add_argument(
        "--variants",
        metavar="KEY=V1,V2[,...]",
        help=(
            "compare the values of one config field side by side in the sweep mode, e.g. "
            "model.conv_impl=xla,im2col or train.batch_size=128,256 (a tuple value's elements "
            "separated by spaces); the modes, dtypes and batch sizes are then measured only "
            "when given"
        ),
    )
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="random data of the dataset's shape (no files needed)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds: short epochs, two sweep points (for tests)",
    )
    p.add_argument(
        "--out",
        help="folder for bench.json, bench.png, bench.html (default runs/bench-<preset>-<time>)",
    )
    p.add_argument(
        "--json", action="store_true", help="print bench.json on stdout instead of the table"
    )
    p.set_defaults(func=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxmnist",
        description="Train and benchmark MNIST-family classifiers with JAX and Optax.",
    )
    from jaxmnist import __version__

    parser.add_argument("--version", action="version", version=f"jaxmnist {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a model and write a run directory")
    _add_config_args(p)
    p.add_argument(
        "--run-dir", help="where to write the run (default runs/<preset>-<dataset>-<time>)"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="print only the final result line")
    out.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-report", action="store_true", help="do not write report.html and plots/")
    _add_process_args(p)
    _add_checkpoint_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("report", help="(re)write a run's report.html and plots/")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", help="write the page here instead of RUN_DIR/report.html")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="one HTML page comparing several runs")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--out", default="comparison.html", help="the page to write (default comparison.html)"
    )
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("eval", help="re-evaluate a run's saved parameters")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--data-dir", help="folder holding <dataset>/...")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("config", help="print the resolved config for a preset and overrides")
    _add_config_args(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser(
        "devices", help="backend, devices, the mesh a run would build, and where arrays land"
    )
    _add_config_args(p)
    _add_process_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("data", help="download, verify, describe or show datasets")
    p.add_argument("action", choices=("download", "verify", "info", "show"))
    p.add_argument("dataset", nargs="?", help="mnist or fashion_mnist (default: all)")
    p.add_argument("--data-dir", help="folder holding <dataset>/... to verify or describe")
    p.add_argument("--cache-dir", help="download into this folder instead of the user cache")
    p.add_argument("--out", help="show: the PNG to write (default <dataset>_examples.png)")
    p.set_defaults(func=cmd_data)
    _add_bench_parser(sub)
    _add_sweep_parser(sub)
    _add_use_parsers(sub)
    return parser


def _silence_stdout() -> None:
    """Points stdout at /dev/null, so that Python's flush at exit does not fail again on
    the closed pipe (the recipe in the `signal` module's documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (a test's capture): nothing flushes it at exit


def cmd_predict(args) -> int:
    from jaxmnist.runs import rundir
    from jaxmnist.use import predict

    model = predict.load_trained(args.run_dir)
    if not 1 <= args.k <= len(model.class_names):
        raise config_lib.ConfigError(f"-k must be within 1..{len(model.class_names)}")
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
    if show:
        written = predict.write_inputs(show, items)
        print(f"wrote {len(written)} model inputs to {show}", file=sys.stderr)
    return 1 if any("error" in r for r in records) else 0


def cmd_export(args) -> int:
    from jaxmnist.use import export, predict

    out = export.check_output(args.out)
    model = predict.load_trained(args.run_dir)
    header = export.export_model(model, out, platforms=args.platforms.split(","))
    print(f"model: {model.describe()}", file=sys.stderr)
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1e6:.1f} MB, platforms {', '.join(header['platforms'])})")
    return 0


def cmd_serve(args) -> int:
    from jaxmnist.use.serve import serve

    return serve(args.run_dir, host=args.host, port=args.port)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)")
    return int(text)


def _add_use_parsers(sub) -> None:
    """predict, export and serve: using a trained run directory."""
    p = sub.add_parser(
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
        help="feed 28x28 images as they are (no inversion, cropping or centring)",
    )
    p.add_argument("--show-input", metavar="DIR", help="write what the model saw as PNGs here")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser(
        "export",
        allow_abbrev=False,
        help="one file (StableHLO + parameters + JSON header) that only needs jax to run",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    p.add_argument(
        "--platforms",
        default="cpu,cuda,tpu",
        help="platforms the file runs on (default cpu,cuda,tpu)",
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="a local web page to draw or upload digits, and a JSON API",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: any free)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    p.set_defaults(func=cmd_serve)


def main(argv: list[str] | None = None) -> int:
    from jaxmnist import hostmem

    hostmem.keep_freed_memory()  # before XLA starts its threads
    parser = build_parser()
    # Overrides may come between options too (`--epochs 3 a=1 --seed 2 b=2`), which
    # argparse's subparsers cannot parse in one pass: what is left must be KEY=VALUE.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded with the run
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers, not at exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return 141  # as a process killed by SIGPIPE: the reader (`| head`) stopped reading
    except JaxmnistError as e:
        print(f"jaxmnist {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"jaxmnist {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # the environment failed us (a full disk, a vanished folder)
        where = f"{e.filename}: " if e.filename else ""
        print(f"jaxmnist {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
