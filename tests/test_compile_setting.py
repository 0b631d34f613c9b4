"""The XLA setting CI's main suite compiles with (the Makefile's TEST_XLA_FLAGS) trains the
same models as XLA's defaults, bit for bit: what the suite pins holds for a run with
neither."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parent.parent
RUNNER = Path(__file__).parent / "run_tiny_cli.py"


def suite_flags() -> str:
    """TEST_XLA_FLAGS as the Makefile sets it."""
    makefile = (ROOT / "Makefile").read_text()
    (flags,) = re.findall(r"^TEST_XLA_FLAGS := (.+)$", makefile, re.MULTILINE)
    return flags.strip()


@pytest.mark.slow
def test_the_suites_xla_setting_trains_the_same_models_as_the_default(tiny_data_dir, tmp_path):
    """A population of two CNNs (convolutions, pooling, dense layers, Adam, under vmap),
    trained once under XLA's defaults and once under the suite's setting, in processes
    of their own (XLA reads its flags once, as it starts)."""
    flags = suite_flags()
    assert flags.startswith("--xla_cpu_"), flags  # a CPU compile option, nothing else
    params = {}
    for name, xla_flags in (("default", ""), ("suite", flags)):
        run = tmp_path / name
        argv = ["train", "--preset", "speedrun", "--seeds", "2", "--dataset", "tiny",
                "--data-dir", str(tiny_data_dir), "--run-dir", str(run), "--epochs", "1",
                "train.steps=3", "train.batch_size=2", "train.target_accuracy=null",
                "--no-report", "--no-compile-cache", "--quiet"]  # fmt: skip
        env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
        done = subprocess.run(
            [sys.executable, str(RUNNER), *argv],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        with np.load(run / "params.npz") as saved:
            params[name] = dict(saved)
    default, suite = params["default"], params["suite"]
    assert sorted(default) == sorted(suite) and len(default) >= 4
    for key in default:
        assert default[key].dtype == suite[key].dtype
        np.testing.assert_array_equal(default[key], suite[key], err_msg=key)
