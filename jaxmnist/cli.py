"""The `jaxmnist` command line: the only module that reads arguments or exits.

Each command is a module of `jaxmnist.commands` with its parser and its `run`; this
module assembles the parsers, dispatches, and turns what a command raises into an exit
status: a `JaxmnistError` becomes one line on stderr and its exit code; argument errors
exit with 2 before any work starts.

Parsing comes first and is quick: a command module imports at its top only what its
parser needs (never jax, numpy, matplotlib, Optax, Orbax or PIL), and its `run` imports
the rest, so `--help`, `--version` and a mistyped flag answer without loading them
(tests/test_cli.py pins it; benchmarks/startup.py times it). The modules are named in
`COMMANDS` and imported by name when the parser is built.

The `jaxmnist` command is `run`: `main`, then an exit that skips the interpreter's own
teardown, in which, after a command that loaded JAX, Python collects JAX's cyclic garbage
module by module while the user waits (docs/results.md, "Around training").
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import threading
from typing import NoReturn

from jaxmnist import __version__, hostmem
from jaxmnist.errors import JaxmnistError

# The modules of jaxmnist.commands, in the order `jaxmnist --help` lists their commands.
COMMANDS = (
    "train",
    "report",
    "compare",
    "evaluate",
    "config",
    "devices",
    "data",
    "bench",
    "profile",
    "sweep",
    "search",
    "predict",
    "export",
    "serve",
)


def command_modules() -> list:
    """The command modules of `COMMANDS`, imported (each is light: see above)."""
    return [importlib.import_module(f"jaxmnist.commands.{name}") for name in COMMANDS]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxmnist",
        description="Train and benchmark MNIST-family classifiers with JAX and Optax.",
    )
    parser.add_argument("--version", action="version", version=f"jaxmnist {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in command_modules():
        command.add_parser(sub).set_defaults(run=command.run)
    return parser


def _silence_stdout() -> None:
    """Points stdout at /dev/null, so that Python's flush at exit does not fail again on
    the closed pipe (the recipe in the `signal` module's documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (a test's capture): nothing flushes it at exit


def main(argv: list[str] | None = None) -> int:
    hostmem.keep_freed_memory()  # before XLA starts its threads
    hostmem.size_tpu_transfer_buffer()  # before a TPU opens; `train` grows it for its data
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
        code = args.run(args)
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


def run() -> None:
    """The `jaxmnist` command: `main`, then `end_process`. A program that calls `main()`
    keeps Python's usual exit."""
    end_process(main())


def end_process(code: int) -> NoReturn:
    """Ends the process with exit `code` as Python's exit would, less its teardown.

    Everything Python's exit does for the program is done here, in its order: threads
    still running are waited for, the atexit handlers run (logging's, JAX's, a
    distributed run's shutdown), stdout and stderr are flushed. What is skipped is the
    teardown of the interpreter itself (its modules and the garbage they hold), which no
    file and no other process ever sees, and where a runtime that held a TPU can hang
    (seen on a TPU v5e VM)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what Python runs at exit; not otherwise exposed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach its reader
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
