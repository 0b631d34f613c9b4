"""Runs that die or are stopped, in real processes: kill -9, SIGTERM, Ctrl-C, the run lock.

Each interrupted run is resumed and must end with parameters identical
(array_equal) to the same run left alone. The tiny dataset makes an epoch a few
milliseconds, so a kill lands at whatever point of the next epochs the process
has reached (training, evaluating, or writing a checkpoint): every one of them
must be recoverable. Every process shares one compilation cache, so that only
the first of each program compiles.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxmnist import checkpoint, rundir
from jaxmnist.cli import main
from jaxmnist.data import registry, synthetic

RUNNER = Path(__file__).parent / "run_tiny_cli.py"
EPOCHS = "6"
QUIET = ("--quiet", "--no-report")


@pytest.fixture(scope="module")
def cli(tmp_path_factory, tiny_arrays, tiny_spec):
    """(start(argv) -> Popen, run(argv) -> CompletedProcess, train_argv(run_dir, *extra))."""
    root = tmp_path_factory.mktemp("preemption")
    data = root / "data"
    synthetic.write_idx_folder(data / tiny_spec.folder, tiny_arrays, tiny_spec)
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache")}

    def start(argv, stderr=subprocess.PIPE):
        return subprocess.Popen(
            [sys.executable, str(RUNNER), *argv],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )

    def run(argv):
        proc = start(argv)
        out, err = proc.communicate(timeout=300)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def train_argv(run_dir, *extra):
        return [
            "train", "--dataset", "tiny", "--data-dir", str(data), "--run-dir", str(run_dir),
            "--batch-size", "32", "--epochs", EPOCHS, *QUIET, *extra,
        ]  # fmt: skip

    return start, run, train_argv


@pytest.fixture(scope="module")
def alone(cli, tmp_path_factory):
    """The run directory of an uninterrupted run with these extra arguments (run once)."""
    _, run, train_argv = cli
    done = {}

    def get(*extra):
        if extra not in done:
            path = tmp_path_factory.mktemp("alone")
            result = run(train_argv(path, *extra))
            assert result.returncode == 0, result.stderr
            done[extra] = path
        return done[extra]

    return get


def resume(cli, run_dir, *extra):
    result = cli[1](["train", "--resume", str(run_dir), *QUIET, *extra])
    assert result.returncode == 0, result.stderr
    return result


def wait_for_epochs(run: Path, proc, count: int, timeout: float = 120, saved=False) -> None:
    """Until `count` epochs are in metrics.jsonl (with `saved`: and checkpointed)."""
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + timeout
    committed = run / "checkpoints" / str(20 * count)  # 20 steps per epoch
    while not (
        metrics.exists()
        and metrics.read_text().count("\n") >= count
        and (committed.exists() or not saved)
    ):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run did not reach its epochs in time"
        time.sleep(0.005)


def assert_same_params(a: Path, b: Path) -> None:
    with np.load(a / "params.npz") as x, np.load(b / "params.npz") as y:
        assert sorted(x.files) == sorted(y.files)
        for k in x.files:
            assert np.array_equal(x[k], y[k]), k


def assert_metrics_continuous(run: Path, epochs: int) -> None:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    steps = [int(r.split(",")[0]) for r in (run / "step_loss.csv").read_text().splitlines()[1:]]
    assert steps == list(range(1, records[-1]["step"] + 1))


@pytest.mark.parametrize("seeds", ["1", "4"])
def test_kill_9_then_resume_is_bit_for_bit(cli, alone, tmp_path, seeds):
    start, _, train_argv = cli
    killed = tmp_path / "killed"
    proc = start(train_argv(killed, "--seeds", seeds))
    wait_for_epochs(killed, proc, 2, saved=True)  # then kill it during epoch 3 or so
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL and not (killed / "summary.json").exists()
    resume(cli, killed)
    assert_same_params(killed, alone("--seeds", seeds))
    assert_metrics_continuous(killed, int(EPOCHS))


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_stop_with_a_checkpoint(cli, alone, tmp_path, signum, code):
    start, _, train_argv = cli
    run = tmp_path / "run"
    proc = start(train_argv(run))
    wait_for_epochs(run, proc, 1)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    step = checkpoint.checkpoint_steps(run)[-1]  # the stop saved the epoch it ended at
    assert err.strip().splitlines()[-1] == (
        f"jaxmnist train: stopped at step {step}; resume with: jaxmnist train --resume {run}"
    )
    assert step < 20 * int(EPOCHS) and not (run / "summary.json").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == step // 20  # 20 steps/epoch
    resume(cli, run)
    assert_same_params(run, alone())
    assert_metrics_continuous(run, int(EPOCHS))


def test_second_ctrl_c_aborts_at_once_and_earlier_checkpoints_survive(cli, alone, tmp_path):
    start, _, train_argv = cli
    run, log = tmp_path / "run", tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = start(train_argv(run), stderr=err)
        wait_for_epochs(run, proc, 1)
        proc.send_signal(signal.SIGINT)
        while "Ctrl-C again aborts" not in log.read_text():
            assert proc.poll() is None
            time.sleep(0.001)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT  # the OS default: no clean stop, no summary
    resume(cli, run)
    assert_same_params(run, alone())


def test_one_writer_per_run_directory(cli, tmp_path, capsys, monkeypatch, tiny_spec):
    monkeypatch.setitem(registry.DATASETS, "tiny", tiny_spec)
    start, _, train_argv = cli
    run = tmp_path / "run"
    proc = start(train_argv(run, "--epochs", "100000"))
    try:
        wait_for_epochs(run, proc, 1)
        before = (run / "command.txt").read_text()
        for argv in (train_argv(run, "--overwrite"), ["train", "--resume", str(run)]):
            assert main(argv) == 2
            assert capsys.readouterr().err.strip() == (
                f"jaxmnist train: error: run directory {str(run)!r} is in use by another "
                "jaxmnist process"
            )
        assert (run / "command.txt").read_text() == before
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    rundir.lock_run_dir(run).release()  # the dead process's lock went with it


def test_a_run_killed_before_its_first_checkpoint_starts_over(cli, alone, tmp_path):
    start, _, train_argv = cli
    run = tmp_path / "run"
    proc = start(train_argv(run, "--no-checkpoint"))
    wait_for_epochs(run, proc, 1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    result = resume(cli, run)
    assert "has no complete checkpoint; starting from the beginning" in result.stderr
    assert_same_params(run, alone())
    assert_metrics_continuous(run, int(EPOCHS))
