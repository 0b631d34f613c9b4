"""How long the command line takes to answer when it computes nothing.

`jaxmnist --version`, `jaxmnist --help` and every command's `--help` only parse: they
should answer before JAX (or matplotlib, Optax, Orbax...) would have finished importing.
Each is run `--repeats` times in a fresh interpreter (`python -m jaxmnist ...`, as the
console script runs it), the commands taking turns so that a burst of load spreads over
all of them; reported per invocation: the median wall time (interpreter start included),
the fastest and the slowest, against the goal (`GOAL_SECONDS`, issue #23). The list of
commands is read from the parser of the tree measured.

`--root DIR` measures another copy of the package (a folder holding `jaxmnist/`, e.g. one
unpacked from `git archive HEAD jaxmnist`), so that a change can be timed before and after
side by side; the default is the package this script finds on its path.

Beside them, what every command that computes pays before its first step: importing
the computing stack (`python -c "import jax"` and the rest of `STACK_IMPORTS`), per copy
of the code and its libraries (`--pythonpath DIR`, repeatable: DIR first on PYTHONPATH,
e.g. a folder holding another release of a library), the copies taking turns.

Usage: python benchmarks/startup.py [--root DIR] [--repeats N] [--pythonpath DIR] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/startup/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib.launch import add_code_copies, code_copies, code_env
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

GOAL_SECONDS = 0.3  # issue #23: a command that only parses answers within this
# The libraries a computing command imports before its first step, from the bottom up.
STACK_IMPORTS = {
    "ml_dtypes": "import ml_dtypes",
    "jax": "import jax",
    "jax, optax, orbax": "import jax, optax, orbax.checkpoint",
}

# Prints the command names, in the order `jaxmnist --help` lists them.
LIST_COMMANDS = """
import argparse
from jaxmnist import cli
sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
print(" ".join(sub.choices))
"""


def _env(root: Path | None) -> dict:
    env = dict(os.environ)
    if root is not None:  # first on the path: before the installed (editable) package
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def command_names(python: str, root: Path | None) -> list[str]:
    """The subcommands of the jaxmnist that `python` imports (from `root` when given)."""
    done = subprocess.run(
        [python, "-c", LIST_COMMANDS],
        env=_env(root),
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"could not list the commands: {done.stderr.strip()[-800:]}")
    return done.stdout.split()


def time_once(python: str, root: Path | None, args: list[str]) -> float:
    """Seconds from starting `python -m jaxmnist <args>` to its exit; it must exit 0."""
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "jaxmnist", *args],
        env=_env(root),
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        command = " ".join(["jaxmnist", *args])
        raise SystemExit(f"{command} exited {done.returncode}: {done.stderr[-800:]}")
    return seconds


def measure(python: str, root: Path | None, invocations: list[list[str]], repeats: int) -> dict:
    """{"jaxmnist <args>": {median, min, max seconds, runs}} over `repeats` rounds."""
    times: dict[str, list[float]] = {" ".join(["jaxmnist", *a]): [] for a in invocations}
    for _ in range(repeats):
        for args, sample in zip(invocations, times.values(), strict=True):
            sample.append(time_once(python, root, args))
    return {name: summarise(sample) for name, sample in times.items()}


def summarise(sample: list[float]) -> dict:
    return {
        "median_seconds": statistics.median(sample),
        "min_seconds": min(sample),
        "max_seconds": max(sample),
        "runs": len(sample),
    }


def code_seconds(python: str, code: str, env: dict | None = None) -> float:
    """Seconds from starting `python -c CODE` (with `env`) to its exit; it must exit 0."""
    start = time.perf_counter()
    subprocess.run([python, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def stack_imports(python: str, copies: dict[str, str], imports: dict, repeats: int) -> dict:
    """{copy: {name: summary}}: `python -c IMPORT` in a fresh interpreter with the copy's
    folder first on PYTHONPATH, `repeats` rounds, the copies taking turns."""
    times = {copy: {name: [] for name in imports} for copy in copies}
    for _ in range(repeats):
        for name, code in imports.items():
            for copy, path in copies.items():
                env = code_env(path)
                times[copy][name].append(code_seconds(python, code, env))
    return {copy: {n: summarise(s) for n, s in got.items()} for copy, got in times.items()}


def python_baseline(python: str, repeats: int) -> float:
    """Median seconds of `python -c pass`: the interpreter's own start, in every figure."""
    return statistics.median(code_seconds(python, "pass") for _ in range(repeats))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, help="a folder holding the jaxmnist/ to measure")
    p.add_argument("--python", default=sys.executable, help="the interpreter (default: this one)")
    p.add_argument("--repeats", type=int, default=7, help="runs of each invocation (default 7)")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (one run, two commands)")
    p.add_argument("--out", type=Path, help="default benchmarks/results/startup/")
    add_code_copies(p, "import the computing stack")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    root = args.root.resolve() if args.root else None
    out = args.out or default_out("startup.json", args.smoke)
    repeats = 1 if args.smoke else args.repeats
    load_before = os.getloadavg()
    commands = command_names(args.python, root)
    invocations = [["--version"], ["--help"], *([c, "--help"] for c in commands)]
    if args.smoke:
        invocations = invocations[:3]
    figures = measure(args.python, root, invocations, repeats)
    baseline = python_baseline(args.python, repeats)
    width = max(map(len, figures))
    print(f"{'':{width}}  median     min     max   (goal {GOAL_SECONDS:.2f} s)")
    for name, f in figures.items():
        verdict = "ok" if f["median_seconds"] <= GOAL_SECONDS else "over"
        print(
            f"{name:{width}}  {f['median_seconds']:6.3f}  {f['min_seconds']:6.3f}  "
            f"{f['max_seconds']:6.3f}   {verdict}"
        )
    slowest = max(f["median_seconds"] for f in figures.values())
    print(f"python -c pass: {baseline:.3f} s; slowest median {slowest:.3f} s", flush=True)
    imports = {"ml_dtypes": STACK_IMPORTS["ml_dtypes"]} if args.smoke else STACK_IMPORTS
    stack = stack_imports(args.python, code_copies(args), imports, repeats)
    for copy, got in stack.items():
        line = ", ".join(f"{n} {f['median_seconds']:.3f} s" for n, f in got.items())
        print(f"importing the computing stack ({copy}, medians): {line}")
    result = {
        "goal_seconds": GOAL_SECONDS,
        "root": str(root) if root else None,
        "repeats": repeats,
        "python_start_seconds": baseline,
        "slowest_median_seconds": slowest,
        "within_goal": slowest <= GOAL_SECONDS,
        "invocations": figures,
        "stack_imports": stack,
    }
    print(save_benchmark(out, result, load_before))


if __name__ == "__main__":
    main()
