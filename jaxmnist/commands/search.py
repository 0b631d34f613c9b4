"""`jaxmnist search`: a hyperparameter search with Optuna, trials trained in vmapped batches.

Parameters, sampler and budget are checked before anything is loaded; the study lives in
an SQLite file in --out unless --storage names another database, where any number of
workers (`jaxmnist search` with the same --storage and --study) share it. The table
goes to stdout (or search.json with --json), progress to stderr, the files to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import shlex
import sys
import time
from pathlib import Path

from jaxmnist import config as config_lib
from jaxmnist.commands import options
from jaxmnist.errors import ConfigError

SAMPLERS = ("tpe", "random", "grid")  # jaxmnist.search.study's, named here for the parser
# Training's flags that mean nothing to a search, or would harm it: a trial trains its
# epochs (the pruner stops it, never a target), and writes no TensorBoard files.
LEFT_OUT = ("--target-accuracy", "--target-split", "--steps", "--tensorboard")
PRUNERS = ("median", "halving", "hyperband", "none")


_count, _examples = options.whole_number(1), options.whole_number(0)
MAX_SAMPLER_SEED = 2**32 - 1  # NumPy's, which Optuna's samplers seed
EPILOG = """\
Resuming: run the same command again (the same --out, or --storage and --study): the
study's finished trials stay, lost ones are retried with their values, and the rest of
its --trials are drawn anew. A finished search is not extended: its --trials is its
budget; to search further, name another --study (the same --storage keeps both).
Many workers: start the same command on several machines with one --storage (e.g.
postgresql://...) and one --study; they share its trials and its budget, each drawing
values of its own."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "search",
        allow_abbrev=False,
        help="search hyperparameters with Optuna: trials in vmapped batches, pruned, many workers",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_config_args(p, leave_out=LEFT_OUT)
    g = p.add_argument_group("the search")
    g.add_argument(
        "--param",
        action="append",
        metavar="KEY=KIND:...",
        help="a searched field, repeatable: optimizer.lr=log:1e-4:1e-1, "
        "optimizer.momentum=uniform:0.8:0.99, train.batch_size=uniform:32:256:32 "
        "(LOW:HIGH[:STEP]), model.hidden=choice:128x64,256x128",
    )
    g.add_argument("--trials", type=_count, default=20, help="trials in the study (default 20)")
    g.add_argument(
        "--batch",
        type=_count,
        default=8,
        help="most trials asked and trained at once (default 8; fewer when the memory estimate "
        "says fewer fit); each batch's trials of one shape are one vmapped program",
    )
    g.add_argument(
        "--validation",
        type=_examples,
        metavar="N",
        help="training examples held out to rank trials by (default 10000, or data.validation=N"
        "); the test set is reported, never used to choose",
    )
    g.add_argument(
        "--sampler", choices=SAMPLERS, default="tpe", help="Optuna sampler (default tpe)"
    )
    g.add_argument(
        "--sampler-seed",
        type=options.whole_number(0, MAX_SAMPLER_SEED),
        default=0,
        help=f"the sampler's seed, 0 to {MAX_SAMPLER_SEED} (default 0)",
    )
    g.add_argument(
        "--pruner",
        choices=PRUNERS,
        default="median",
        help="Optuna pruner on each epoch's validation accuracy (default median)",
    )
    g.add_argument(
        "--storage",
        type=options.not_empty,
        metavar="URL",
        help="the study's database, any SQLAlchemy URL Optuna takes, e.g. "
        "postgresql://user:pass@host/db (default: sqlite:///OUT/search.db)",
    )
    g.add_argument(
        "--study",
        type=options.not_empty,
        default="search",
        help="the study's name (default search)",
    )
    g.add_argument(
        "--heartbeat",
        type=_count,
        default=60,
        metavar="SECONDS",
        help="a worker's sign of life for its trials (default 60); a trial silent for twice "
        "this is failed and retried",
    )
    g.add_argument(
        "--retries",
        type=options.whole_number(0),
        default=3,
        help="times a lost trial is retried (default 3)",
    )
    p.add_argument(
        "--out",
        help="folder for search.json, search.csv, search.html and the default search.db "
        "(default runs/search-<preset>-<time>)",
    )
    p.add_argument("--json", action="store_true", help="print search.json instead of the table")
    return p


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("optuna") is None:
        raise ConfigError("jaxmnist search needs Optuna: pip install 'jaxmnist[search]'")
    import optuna  # start-up: the search extra

    from jaxmnist.runs import rundir  # start-up: imports jax
    from jaxmnist.search import outputs, space, worker  # start-up: imports jax and optuna
    from jaxmnist.search import study as study_lib  # start-up: imports optuna
    from jaxmnist.search.study import StudyOptions, grid_space  # start-up: imports optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our lines say what it would
    start = time.perf_counter()
    cfg, preset = options.resolve_config(args, LEFT_OUT)
    explicit = options.explicit_overrides(args, LEFT_OUT)
    if "train.target_accuracy" not in explicit:  # a preset's stop rule: trials train on
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, target_accuracy=None))
    if "data.validation" in explicit:
        if args.validation is not None:
            raise ConfigError("give the validation split once: --validation N or data.validation=N")
    else:
        cfg = worker.with_validation(cfg, 10000 if args.validation is None else args.validation)
    config_lib.validate(cfg)
    space.check_rankable(cfg)
    params = space.parse_params(args.param or [], cfg)
    trials = args.trials
    if args.sampler == "grid":
        grid_space(params)  # every parameter finite, or one line
        trials = worker.grid_trials(params, trials)
    out = Path(args.out or options.default_out("search", preset))
    made = not out.exists()
    rundir.check_writable(out)
    opts = StudyOptions(
        name=args.study,
        storage=args.storage or study_lib.sqlite_url(out.absolute() / "search.db"),
        trials=trials,
        sampler=args.sampler,
        seed=args.sampler_seed,
        pruner=args.pruner,
        heartbeat=args.heartbeat,
        grace=2 * args.heartbeat,
        retries=args.retries,
    )
    log = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    again = shlex.join(["jaxmnist", *args.argv])
    try:
        with worker.sigterm_as_ctrl_c():  # SIGTERM stops a search as Ctrl-C does
            study = worker.run_search(cfg, params, opts, batch=args.batch, log=log)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the batch's trials are requeued
        line, code = worker.stopped_line(e, again)
        print(line, file=sys.stderr)
        return code
    except study_lib.STORAGE_ERRORS as e:
        raise worker.storage_failure(e, opts.storage, again) from None
    except BaseException:
        if made and out.is_dir() and not any(out.iterdir()):  # refused before a trial
            out.rmdir()
        raise
    result = outputs.summarize(
        study, params, cfg, opts, preset=preset, wall_seconds=time.perf_counter() - start
    )
    paths = outputs.write_outputs(result, out, shlex.join(["jaxmnist", *args.argv]))
    if args.json:
        print(paths["json"].read_text(), end="")
    else:
        print(outputs.format_table(result))
        print(f"wrote {paths['json']}, {paths['csv'].name}, {paths['html'].name}")
    return 0
