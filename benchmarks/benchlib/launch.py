"""How a benchmark starts `jaxmnist` in a child process, on the real data or, for
`--smoke`, on a tiny generated dataset the child registers first (as "tiny", written
under a folder the caller names), so that a smoke run exercises the same command line;
and which copies of the code it runs side by side (`--pythonpath DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SMOKE_LAUNCH = """\
import sys
from pathlib import Path
from jaxmnist.cli import main
from jaxmnist.data import registry, synthetic
arrays = synthetic.tiny_arrays()
registry.DATASETS["tiny"] = spec = synthetic.tiny_spec(arrays, name="tiny")
synthetic.write_idx_folder(Path(sys.argv[1]) / spec.folder, arrays, spec)
sys.exit(main(sys.argv[2:]))
"""


def jaxmnist_command(smoke: bool, work: Path) -> tuple[list[str], list[str]]:
    """(the command that starts jaxmnist, arguments every `train` of a smoke run adds):
    `python -m jaxmnist` and none, or the tiny dataset's launcher and its flags."""
    if not smoke:
        return [sys.executable, "-m", "jaxmnist"], []
    data = str(work / "data")
    return [sys.executable, "-c", SMOKE_LAUNCH, data], ["--dataset", "tiny", "--data-dir", data]


def add_code_copies(parser: argparse.ArgumentParser, what: str) -> None:
    """`--pythonpath DIR` (repeatable): also `what` with the code in DIR, side by side
    (e.g. `git archive OLD jaxmnist` unpacked in DIR)."""
    parser.add_argument(
        "--pythonpath",
        action="append",
        default=[],
        metavar="DIR",
        help=f"also {what} with the code in DIR (put first on PYTHONPATH), side by side; "
        "repeatable",
    )


def code_copies(args: argparse.Namespace) -> dict[str, str]:
    """{name: folder to put first on PYTHONPATH}: this checkout ("this"), then each
    `--pythonpath` folder ("pythonpath:DIR")."""
    here = str(Path(__file__).resolve().parents[2])
    return {"this": here, **{f"pythonpath:{d}": str(Path(d).resolve()) for d in args.pythonpath}}


def code_env(path: str, env: dict | None = None) -> dict:
    """`env` (default this process's) with the code copy at `path` first on PYTHONPATH,
    ahead of what PYTHONPATH held: where the dependencies may live (`pip install
    --target DIR` on a machine whose Python cannot be written to)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    return env


def require_data_dir(smoke: bool, holding: str = "mnist/") -> None:
    """Exits with one line unless this is a `smoke` run or JAXMNIST_DATA_DIR says where
    the real data is (`holding`): a benchmark never downloads it."""
    if not (smoke or os.environ.get("JAXMNIST_DATA_DIR")):
        sys.exit(f"set JAXMNIST_DATA_DIR to the folder holding {holding} (no download here)")


# A patched run's launcher after its patch: the CLI with the remaining arguments.
PATCHED_MAIN = "from jaxmnist.cli import main\nsys.exit(main(sys.argv[1:]))\n"
# Every cache off, nothing written beyond the run's own files.
PATCHED_FLAGS = ["--quiet", "--no-report", "--no-checkpoint", "--no-compile-cache"]


def patched_train(patch: str, arm: str, args: list[str], smoke: bool) -> tuple[dict, dict]:
    """One whole `jaxmnist train ARGS` in a child process that first runs `patch`, Python
    which reads the arm's name from `sys.argv.pop(1)` (and imports `sys`), with every
    cache off: (its figures: compile, each program's compile, steady epoch, every epoch,
    test accuracy; its environment.json)."""
    with tempfile.TemporaryDirectory() as work:
        run = Path(work) / "run"
        launch, tiny = jaxmnist_command(smoke, Path(work))
        code = patch + (launch[2] if smoke else PATCHED_MAIN)
        argv = [sys.executable, "-c", code, arm, *launch[3:], "train", *args, *tiny]
        subprocess.run([*argv, *PATCHED_FLAGS, "--run-dir", str(run)], check=True, timeout=600)
        s = json.loads((run / "summary.json").read_text())
        environment = json.loads((run / "environment.json").read_text())
        epochs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    figures = {
        "compile_seconds": s["compile_seconds"],
        "compile_programs": s["compile_programs"],
        "steady_epoch_seconds": s.get("steady_epoch_seconds"),
        "epoch_seconds": [e["epoch_seconds"] for e in epochs],
        "test_accuracy": s["test_accuracy"],
    }
    return figures, environment
