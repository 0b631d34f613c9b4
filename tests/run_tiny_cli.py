"""Runs the `jaxmnist` command line in a fresh process with the tests' tiny dataset.

Tests that need a real separate process (several processes of one distributed
run, a process killed with SIGKILL) run `python tests/run_tiny_cli.py ARGS...`:
the dataset `tiny` (tests/conftest.py's learnable arrays, deterministic) is
registered before the command runs, so `--dataset tiny --data-dir DIR` finds the
files a fixture wrote to DIR. It ends as the `jaxmnist` command does (`cli.run`:
no interpreter teardown), so what these tests see at the end of a process is what
users get.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import learnable_arrays

from jaxmnist import cli
from jaxmnist.data import registry, synthetic

if __name__ == "__main__":
    registry.DATASETS["tiny"] = synthetic.tiny_spec(learnable_arrays(), name="tiny")
    cli.run()  # main(sys.argv[1:]), then the command's own exit
