"""Runs the `jaxmnist` command line in a fresh process with the tests' tiny dataset.

Tests that need a real separate process (several processes of one distributed
run, a process killed with SIGKILL) run `python tests/run_tiny_cli.py ARGS...`:
the dataset `tiny` (tests/conftest.py's learnable arrays, deterministic) is
registered before `jaxmnist.cli.main(ARGS)` runs, so `--dataset tiny --data-dir
DIR` finds the files a fixture wrote to DIR.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import learnable_arrays

from jaxmnist.cli import main
from jaxmnist.data import registry, synthetic

if __name__ == "__main__":
    registry.DATASETS["tiny"] = synthetic.tiny_spec(learnable_arrays(), name="tiny")
    sys.exit(main(sys.argv[1:]))
