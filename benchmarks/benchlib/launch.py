"""How a benchmark starts `jaxmnist` in a child process, on the real data or, for
`--smoke`, on a tiny generated dataset the child registers first (as "tiny", written
under a folder the caller names), so that a smoke run exercises the same command line;
and which copies of the code it runs side by side (`--pythonpath DIR`).
"""

from __future__ import annotations

import argparse
import os
import sys
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
