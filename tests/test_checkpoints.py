"""Runs that die or are stopped, in real processes: kill -9, SIGTERM, Ctrl-C, the run lock.

Each interrupted run is resumed and must end with parameters identical
(array_equal) to the same run left alone. The tiny dataset makes an epoch a few
milliseconds, so a kill lands at whatever point of the next epochs the process
has reached (training, evaluating, or writing a checkpoint): every one of them
must be recoverable. Every process shares one compilation cache, so that only
the first of each program compiles.
"""

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import made_once

from jaxmnist import config as config_lib
from jaxmnist.cli import main
from jaxmnist.data import registry, synthetic
from jaxmnist.runs import checkpoint, rundir
from jaxmnist.runs.checkpoint import CheckpointOptions
from jaxmnist.runs.reader import read_config
from jaxmnist.runs.resume import Resumer
from jaxmnist.train import train_and_evaluate
from jaxmnist.training import memory
from jaxmnist.training.hooks import Callback
from jaxmnist.training.preemption import Stopped, StopRequest

RUNNER = Path(__file__).parent / "run_tiny_cli.py"
EPOCHS = "6"
QUIET = ("--quiet", "--no-report")


@pytest.fixture(scope="session")
def cli(tmp_path_factory, tiny_arrays, tiny_spec):
    """(start(argv) -> Popen, run(argv) -> CompletedProcess, train_argv(run_dir, *extra)).
    The processes of every test process (pytest-xdist's workers) share one cache folder."""
    root = tmp_path_factory.mktemp("preemption")
    data = root / "data"
    synthetic.write_idx_folder(data / tiny_spec.folder, tiny_arrays, tiny_spec)
    session = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        session = session.parent  # the session's own folder, above each worker's
    env = {**os.environ, "XDG_CACHE_HOME": str(session / "preemption-cache")}

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


@pytest.fixture(autouse=True)
def _tiny_registered(monkeypatch, tiny_spec):
    """In-process commands (those that refuse before training) know dataset `tiny` too."""
    monkeypatch.setitem(registry.DATASETS, "tiny", tiny_spec)


@pytest.fixture(scope="session")
def alone(cli, tmp_path_factory):
    """The run directory of an uninterrupted run with these extra arguments (run once in
    the session, by the first test process that asks for it: `made_once`)."""
    _, run, train_argv = cli
    made, folders = [], {}

    def train(extra, folder):
        result = run(train_argv(folder / "run", *extra))
        assert result.returncode == 0, result.stderr

    def get(*extra):
        if extra not in folders:
            name = "-".join(["alone", *extra])
            made.append(made_once(tmp_path_factory, name, lambda f: train(extra, f)))
            folders[extra] = next(made[-1]) / "run"
        return folders[extra]

    yield get
    for each in made:
        for _ in each:  # its check that the run is still as it was made
            pass


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


# One seed is the default: that run is the uninterrupted run the other tests compare with.
@pytest.mark.parametrize("seeds", [(), ("--seeds", "4")], ids=["1", "4"])
@pytest.mark.slow
def test_kill_9_then_resume_is_bit_for_bit(cli, alone, tmp_path, seeds):
    start, _, train_argv = cli
    killed = tmp_path / "killed"
    proc = start(train_argv(killed, *seeds))
    wait_for_epochs(killed, proc, 2, saved=True)  # then kill it during epoch 3 or so
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL and not (killed / "summary.json").exists()
    resume(cli, killed)
    assert_same_params(killed, alone(*seeds))
    assert_metrics_continuous(killed, int(EPOCHS))


@pytest.mark.slow
def test_kill_9_then_resume_from_inside_an_epoch_is_bit_for_bit(cli, alone, tmp_path):
    """--checkpoint-every-steps 7 saves inside epochs (20 steps each); the run is
    killed, and everything after its checkpoint at step 49 (epoch 3, step 9 of 20) is
    thrown away, as if it had died right after writing it."""
    start, _, train_argv = cli
    run = tmp_path / "run"
    proc = start(train_argv(run, "--checkpoint-every-steps", "7", "--keep-checkpoints", "100"))
    wait_for_epochs(run, proc, 3, saved=True)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    steps = checkpoint.checkpoint_steps(run)
    assert {7, 14, 20, 21, 28, 35, 40, 42, 49} <= set(steps)
    for step in steps:
        if step > 49:
            shutil.rmtree(run / "checkpoints" / str(step))
    progress = json.loads((run / "checkpoints" / "49" / "progress" / "metadata").read_text())
    assert (progress["epoch"], progress["epoch_step"]) == (2, 9)
    resume(cli, run)
    assert_same_params(run, alone())
    assert_metrics_continuous(run, int(EPOCHS))


@pytest.mark.accelerator
def test_a_resumed_run_that_had_reached_its_target_trains_no_further(tiny_dataset, tmp_path):
    """It reached --target-accuracy at epoch 1 of 4 and died before summary.json: resuming
    finishes it there, as the run itself would have."""
    base = config_lib.get_preset("tpu101")
    train = dataclasses.replace(base.train, batch_size=32, epochs=4, target_accuracy=0.2)
    cfg = dataclasses.replace(base, compile_cache=False, train=train)
    run = tmp_path / "run"
    first = train_and_evaluate(cfg, run, dataset=tiny_dataset, checkpoints=CheckpointOptions())
    assert first["epochs_to_target"] == 1 and first["steps"] == 20
    (run / "summary.json").unlink()
    again = train_and_evaluate(cfg, run, dataset=tiny_dataset, resume=Resumer(run, cfg))
    assert (again["epochs"], again["steps"], again["epochs_to_target"]) == (1, 20, 1)
    assert again["test_accuracy"] == first["test_accuracy"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1


def test_resuming_a_run_that_reached_its_target_says_so_or_trains_to_a_new_one(
    tiny_data_dir, tmp_path, capsys
):
    """Stopped by its target at epoch 1 of 5: a longer plan alone changes nothing (and
    rewrites nothing); dropping the target trains the epochs left."""
    run = tmp_path / "run"
    argv = ["train", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--run-dir"]
    argv += [str(run), "--batch-size", "32", "--epochs", "5", "--target-accuracy", "0.3"]
    assert main([*argv, "--no-compile-cache", *QUIET]) == 0
    assert json.loads((run / "summary.json").read_text())["epochs"] == 1
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "6", *QUIET]) == 0
    assert capsys.readouterr().out == (
        f"{run}: the run reached its target test accuracy of 30.00% at epoch 1; nothing to "
        "resume (a higher target, or train.target_accuracy=none, trains further)\n"
    )
    assert snapshot(run) == before
    assert main(["train", "--resume", str(run), "train.target_accuracy=none", *QUIET]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 5 and "target_reached" not in summary


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_stop_with_a_checkpoint(cli, alone, tmp_path, signum, code):
    start, _, train_argv = cli
    run = tmp_path / "run"
    proc = start(train_argv(run, "--checkpoint-every", "1000"))  # only the stop saves
    wait_for_epochs(run, proc, 1)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    (step,) = checkpoint.checkpoint_steps(run)  # the stop saved the epoch it ended at
    assert err.strip().splitlines()[-1] == (
        f"jaxmnist train: stopped at step {step}; resume with: jaxmnist train --resume {run}"
    )
    assert step < 20 * int(EPOCHS) and not (run / "summary.json").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == step // 20  # 20 steps/epoch
    resume(cli, run, "--keep-checkpoints", "2")
    assert checkpoint.checkpoint_steps(run) == [100, 120]  # every epoch, the newest 2 kept
    assert_same_params(run, alone())
    assert_metrics_continuous(run, int(EPOCHS))


@pytest.mark.slow
def test_a_closed_stdout_does_not_cost_the_run(cli, tmp_path):
    """`train | head -2`: the reader goes away after the first lines, before the epochs'
    lines; the run goes on without printing and finishes."""
    run = tmp_path / "run"
    argv = cli[2](run)  # the programs `alone` compiled; its epochs come after the reader went
    proc = cli[0]([a for a in argv if a != "--quiet"])
    lines = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert lines[1].startswith("compiled in")
    note = "jaxmnist: stdout was closed; training goes on without printing"
    assert err == f"{note} (run directory: {run})\n"
    assert json.loads((run / "summary.json").read_text())["epochs"] == int(EPOCHS)


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


def test_one_writer_per_run_directory(cli, tmp_path, capsys):
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


@pytest.fixture(scope="session")
def finished(cli, tmp_path_factory):
    """A finished 3-epoch run, with checkpoints at steps 20, 40 and 60, trained once in the
    session (`made_once`; copy it to change it)."""

    def train(folder):
        result = cli[1](cli[2](folder / "run", "--epochs", "3"))
        assert result.returncode == 0, result.stderr

    for folder in made_once(tmp_path_factory, "finished", train):
        assert checkpoint.checkpoint_steps(folder / "run") == [20, 40, 60]
        yield folder / "run"


def snapshot(path: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def damage(step_dir: Path, how: str) -> None:
    """Flips one bit in (or removes) the largest array file of a checkpoint."""
    big = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=os.path.getsize)
    if how == "removed":
        big.unlink()
        return
    data = bytearray(big.read_bytes())
    data[len(data) // 2] ^= 1
    big.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbled", "removed"])
def test_a_damaged_checkpoint_is_skipped_for_the_one_before(cli, alone, finished, tmp_path, how):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    damage(run / "checkpoints" / "60", how)
    result = resume(cli, run, "--epochs", EPOCHS)  # extended from 3 epochs, resumed at 2
    warning = result.stderr.strip().splitlines()[0]
    assert warning.startswith(f"jaxmnist: warning: checkpoint {run / 'checkpoints' / '60'} is ")
    assert warning.endswith("damaged; trying an earlier one") or "damaged (" in warning
    assert_same_params(run, alone())
    assert_metrics_continuous(run, int(EPOCHS))
    assert json.loads((run / "summary.json").read_text())["epochs"] == int(EPOCHS)


def test_no_intact_checkpoint_is_one_error_and_exit_1(cli, finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()  # as if it had died after its last checkpoint
    for step in (20, 40, 60):
        damage(run / "checkpoints" / str(step), "garbled")
    result = cli[1](["train", "--resume", str(run), *QUIET])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"jaxmnist train: error: {run / 'checkpoints'}: no intact checkpoint (all 3 are damaged)"
    )


def test_an_empty_manifest_is_one_warning_line_and_nothing_else(cli, tmp_path):
    """A damaged checkpoint fails while its other arrays' reads are in flight: their
    callbacks into the closed event loop must not reach the terminal. A wide model
    has enough arrays that some always are."""
    run = tmp_path / "run"
    result = cli[1](cli[2](run, "--epochs", "2", "--hidden", "512,512,512"))
    assert result.returncode == 0, result.stderr
    (run / "summary.json").unlink()  # as if it had died after its last checkpoint
    (run / "checkpoints" / "40" / "state" / "manifest.ocdbt").write_bytes(b"")
    result = cli[1](["eval", str(run)])
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"jaxmnist: warning: checkpoint {run / 'checkpoints' / '40'} is damaged (Error decoding"
        + " manifest: Encoded length (0) is less than minimum length (16)); trying an earlier one"
    ]
    assert "step 20 (epoch 1)" in result.stdout


@pytest.mark.parametrize(
    "flags, field",
    [
        (["--lr", "0.01"], "optimizer.lr"),
        (["--batch-size", "64"], "train.batch_size"),
        (["--seed", "1"], "train.seed"),
        (["--hidden", "32"], "model.hidden"),
        (["--epochs", "2"], "train.epochs"),
    ],
)
def test_resume_refuses_what_changes_the_maths(finished, flags, field, capsys):
    before = snapshot(finished)
    assert main(["train", "--resume", str(finished), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
    assert snapshot(finished) == before


@pytest.mark.parametrize(
    "flags, field, change",
    [
        (["--preset", "codelab"], "data.dataset", "'tiny' -> 'fashion_mnist'"),
        (["--preset", "codelab", "--dataset", "tiny"], "model.activation", "'relu' -> 'gelu'"),
        (
            ["--preset", "cnn", "--dataset", "tiny", "data.augment=false"],
            "model.name",
            "'mlp' -> 'cnn'",
        ),
        (["--preset", "tpu101", "--dataset", "tiny"], "train.batch_size", "32 -> 128"),
    ],
)
def test_resume_refuses_a_preset_that_changes_the_maths(finished, flags, field, change, capsys):
    """A preset given with --resume is a changed config like any other: its fields, with
    the command line's on top, must be the run's (outside what a resume may change)."""
    before = snapshot(finished)
    assert main(["train", "--resume", str(finished), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--resume: {field} would change the run ({change}); it cannot change" in err
    assert f"from --preset {flags[1]}" in err
    assert snapshot(finished) == before


def test_resume_accepts_the_preset_the_run_was_trained_with(finished, capsys):
    before = snapshot(finished)
    flags = ["--preset", "tpu101", "--dataset", "tiny", "--batch-size", "32", "--devices", "1"]
    assert main(["train", "--resume", str(finished), *flags]) == 0  # epochs: the run's, not 5
    assert "already finished" in capsys.readouterr().out
    assert snapshot(finished) == before


def test_resuming_a_finished_run_says_so(finished, capsys):
    before = snapshot(finished)
    assert main(["train", "--resume", str(finished), "--devices", "1"]) == 0
    assert "already finished" in capsys.readouterr().out
    assert snapshot(finished) == before


def test_a_used_run_directory_needs_overwrite(cli, finished, tmp_path, capsys):
    before = snapshot(finished)
    assert main(cli[2](finished)) == 2
    assert capsys.readouterr().err.strip() == (
        f"jaxmnist train: error: {finished} already holds a finished run; --overwrite replaces it"
    )
    assert snapshot(finished) == before
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    assert main(cli[2](run, "--overwrite", "--epochs", "1", "--no-compile-cache")) == 0
    assert checkpoint.checkpoint_steps(run) == [20]  # the old run's checkpoints went with it


def test_overwrite_leaves_nothing_a_reader_could_take_for_the_new_run(
    finished, tiny_dataset, tmp_path, capsys
):
    """`train --overwrite` over a finished run, stopped inside its first epoch before any
    checkpoint: eval, predict and export find no model, not the old run's."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    rundir.check_reusable(run, overwrite=True)  # what `train --overwrite` does first
    cfg = read_config(run)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, progress_every=5))
    stop = StopRequest()
    with pytest.raises(Stopped, match="stopped at step 5;"):
        train_and_evaluate(cfg, run, SignalAt(stop, 1), dataset=tiny_dataset, stop=stop)
    left = {p.name for p in run.iterdir()}
    assert not left & {"params.npz", "confusion_matrix.json", "summary.json", "checkpoints"}
    assert not left & {"test_predictions.npz", "report.html", "diverged.json"}
    capsys.readouterr()
    png = tmp_path / "x.png"
    png.write_bytes(b"not read")
    for argv in (["eval", str(run)], ["predict", str(run), str(png)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "no params.npz and no checkpoint" in err and len(err.splitlines()) == 1


def test_eval_of_an_unfinished_run_uses_its_newest_checkpoint(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()  # as if it had died during epoch 3, before its checkpoint
    shutil.rmtree(run / "checkpoints" / "60")
    assert main(["eval", str(run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["checkpoint_step"], result["checkpoint_epoch"]) == (40, 2)
    epoch_2 = json.loads((run / "metrics.jsonl").read_text().splitlines()[1])
    assert result["test_accuracy"] == epoch_2["test_accuracy"]
    assert result["test_loss"] == pytest.approx(epoch_2["test_loss"], rel=1e-5)
    assert main(["eval", str(run)]) == 0
    assert "newest checkpoint of an unfinished run: step 40 (epoch 2)" in capsys.readouterr().out


def test_after_a_non_finite_loss_resume_may_lower_the_rate(cli, finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "60")  # as if epoch 3 had gone non-finite
    (run / "diverged.json").write_text('{"error": "training loss became non-finite"}')
    result = resume(cli, run, "--lr", "0.0002")
    assert "continuing a diverged run with optimizer.lr=0.0002" in result.stderr
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rates = [json.loads(x)["learning_rate"] for x in lines]
    assert rates == [pytest.approx(1e-3), pytest.approx(1e-3), pytest.approx(2e-4)]
    assert not (run / "diverged.json").exists()


def test_a_non_finite_loss_marks_the_run_and_keeps_no_bad_checkpoint(cli, tmp_path):
    run = tmp_path / "run"
    result = cli[1](cli[2](run, "--optimizer", "sgd", "--lr", "1e9"))
    assert result.returncode == 1 and "non-finite" in result.stderr
    assert (run / "diverged.json").exists() and checkpoint.checkpoint_steps(run) == []


def test_eval_finds_the_data_where_training_found_it(tiny_data_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("JAXMNIST_DATA_DIR", str(tiny_data_dir))
    argv = ["train", "--dataset", "tiny", "--run-dir", str(run), "--batch-size", "32"]
    assert main([*argv, "--epochs", "1", "--no-compile-cache", "--no-checkpoint", *QUIET]) == 0
    monkeypatch.delenv("JAXMNIST_DATA_DIR")  # a new shell
    assert main(["eval", str(run), "--json"]) == 0


def test_resume_finds_the_data_where_training_found_it(tiny_data_dir, tmp_path, monkeypatch):
    """The tiny dataset has no download source: a resume that looked anywhere but where
    training found it would fail."""
    run = tmp_path / "run"
    monkeypatch.setenv("JAXMNIST_DATA_DIR", str(tiny_data_dir))
    argv = ["train", "--dataset", "tiny", "--run-dir", str(run), "--batch-size", "32"]
    assert main([*argv, "--epochs", "1", "--no-compile-cache", *QUIET]) == 0
    monkeypatch.delenv("JAXMNIST_DATA_DIR")  # a new shell
    assert main(["train", "--resume", str(run), "--epochs", "2", *QUIET]) == 0
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2


def test_a_resume_says_where_it_continues_and_keeps_no_report(tiny_data_dir, tmp_path, capsys):
    """A run started with --no-report gets no report.html when resumed without the flag,
    the next resume neither (command.txt, rewritten by each resume, keeps the choice)."""
    run = tmp_path / "run"
    argv = ["train", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--run-dir"]
    argv += [str(run), "--batch-size", "32", "--epochs", "2", "--no-compile-cache"]
    assert main([*argv, "--no-report", "--quiet"]) == 0
    capsys.readouterr()
    for epochs in (3, 4):
        assert main(["train", "--resume", str(run), "--epochs", str(epochs)]) == 0
        out = capsys.readouterr().out
        step = 20 * (epochs - 1)
        assert out.count("resumed from") == 1
        assert f"resumed from step {step} (epoch {epochs - 1})\n" in out
        assert "report:" not in out and not (run / "report.html").exists()
        assert "--no-report" in (run / "command.txt").read_text()


def test_tensorboard_events_continue_without_gaps_or_repeats(cli, finished, tmp_path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "60")  # resumes after epoch 2
    resume(cli, run, "--tensorboard")
    events = accumulator.EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("loss/test")] == [20, 40, 60]
    assert [e.step for e in events.Scalars("loss/train_step")] == list(range(1, 61))
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e.value for e in events.Scalars("loss/test")] == pytest.approx(
        [r["test_loss"] for r in records], rel=1e-6
    )


class SignalAt(Callback):
    """As if SIGTERM came to `stop` once the run had passed `step`."""

    def __init__(self, stop: StopRequest, step: int):
        self.stop, self.step = stop, step

    def on_steps(self, end):
        if end.step >= self.step:
            self.stop.signum = signal.SIGTERM


@pytest.mark.accelerator
@pytest.mark.slow
def test_members_in_memory_chunks_resume_bit_for_bit_or_regrouped(
    tiny_dataset, tmp_path, monkeypatch, paced_by_steps
):
    """Checkpoints hold the members concatenated, whatever chunks trained them: resumed in
    the same chunks the result is identical; in one chunk, equal to float tolerance.
    The stop comes inside epoch 2 (calls end every 7 steps: the signal at step 21 is
    seen after the call to 28), so the checkpoint holds that epoch's accumulators."""
    base = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(
        base, compile_cache=False, train=dataclasses.replace(base.train, batch_size=32, epochs=4)
    )
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seeds=4))
    # Two chunks of two for the config that sets memory_budget_mb (as a budget with room
    # for two at a time gives them); one chunk when it is unset.
    real_chunks_for = memory.chunks_for

    def chunks_for(c, *args):
        return ((2, 2), {"chunks": [2, 2]}) if c.memory_budget_mb else real_chunks_for(c, *args)

    monkeypatch.setattr(memory, "chunks_for", chunks_for)
    chunked = dataclasses.replace(cfg, memory_budget_mb=1)
    stopped, alone = tmp_path / "stopped", tmp_path / "alone"
    stop = StopRequest()
    with pytest.raises(Stopped, match="stopped at step 28;"):
        train_and_evaluate(
            chunked, stopped, SignalAt(stop, 21), dataset=tiny_dataset,
            checkpoints=CheckpointOptions(every_steps=7), stop=stop,
        )  # fmt: skip
    assert json.loads((stopped / "environment.json").read_text())["chunks"] == [2, 2]
    assert checkpoint.checkpoint_steps(stopped) == [20, 21, 28]  # 7, 14, 20, 21, 28: newest 3
    assert len((stopped / "metrics.jsonl").read_text().splitlines()) == 1
    shutil.copytree(stopped, tmp_path / "regrouped")
    reference = train_and_evaluate(chunked, alone, dataset=tiny_dataset)
    again = train_and_evaluate(
        chunked, stopped, dataset=tiny_dataset, resume=Resumer(stopped, chunked)
    )
    assert again["chunks"] == reference["chunks"] == [2, 2]
    assert_same_params(stopped, alone)
    whole = dataclasses.replace(chunked, memory_budget_mb=None)
    regrouped = tmp_path / "regrouped"
    result = train_and_evaluate(
        whole, regrouped, dataset=tiny_dataset, resume=Resumer(regrouped, whole)
    )
    assert result["chunks"] == [4]
    with np.load(regrouped / "params.npz") as a, np.load(alone / "params.npz") as b:
        for k in a.files:  # vmapped over 4 members or 2: the same maths, other float sums
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_predict_on_an_unfinished_run_uses_its_newest_checkpoint(
    finished, tiny_arrays, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    for name in ("summary.json", "params.npz"):  # as if it had died during epoch 3
        (run / name).unlink()
    shutil.rmtree(run / "checkpoints" / "60")
    images = tmp_path / "test.npy"
    np.save(images, tiny_arrays["test_images"])
    assert main(["predict", str(run), str(images), "--json", "-k", "1"]) == 0
    captured = capsys.readouterr()
    assert "using its checkpoint of step 40 (epoch 2)" in captured.err
    top = [json.loads(line)["top"][0]["class"] for line in captured.out.splitlines()]
    accuracy = np.mean(np.asarray(top, int) == tiny_arrays["test_labels"])
    epoch_2 = json.loads((run / "metrics.jsonl").read_text().splitlines()[1])
    assert accuracy == pytest.approx(epoch_2["test_accuracy"])  # the step-40 model's answers


def test_a_checkpoint_holding_another_steps_plausible_arrays_is_caught_by_the_fingerprint(
    cli, alone, finished, tmp_path
):
    """Damage only the fingerprint can see: checkpoint 60's arrays replaced by the (intact,
    finite, trained) arrays of checkpoint 40. Orbax reads them back without complaint and
    the loss stays finite; only the fingerprint saved with step 60 tells them apart."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    newest, older = run / "checkpoints" / "60" / "state", run / "checkpoints" / "40" / "state"
    shutil.rmtree(newest)
    shutil.copytree(older, newest)
    result = resume(cli, run, "--epochs", EPOCHS)
    assert result.stderr.strip().splitlines()[:1] == [
        (
            f"jaxmnist: warning: checkpoint {run / 'checkpoints' / '60'} is damaged (its arrays"
            " do not match the fingerprint saved with them); trying an earlier one"
        )
    ]
    assert_same_params(run, alone())
    assert_metrics_continuous(run, int(EPOCHS))


def test_an_interrupted_saves_temporary_folder_is_removed_when_the_run_goes_on(
    cli, finished, tmp_path
):
    """A save killed mid-write leaves `<step>.orbax-checkpoint-tmp` (Orbax's name while it
    writes): the resumed run removes it, and every other leftover of that kind, and saves
    its own checkpoints as usual."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    folder = run / "checkpoints"
    leftovers = [folder / "80.orbax-checkpoint-tmp", folder / "100.orbax-checkpoint-tmp-17"]
    for left in leftovers:
        (left / "state").mkdir(parents=True)
        (left / "state" / "half_written").write_bytes(b"\0" * 100)
    resume(cli, run, "--epochs", "4")
    assert not any(p.exists() for p in leftovers)
    assert sorted(p.name for p in folder.iterdir()) == ["40", "60", "80"]
    assert checkpoint.remove_unfinished(folder) == []


def test_after_a_failed_restore_asyncio_keeps_quiet_only_about_orbax_tasks(caplog):
    """Orbax's sibling reads of a damaged checkpoint fail the same way, unawaited: asyncio
    would log each when it is collected, after the one-line warning said it all."""
    checkpoint._quiet_abandoned_writes()
    log = logging.getLogger("asyncio")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        log.error(
            "Task exception was never retrieved\nfuture: <Task finished coro=<async_deserialize()"
            " done, defined at /venv/site-packages/orbax/checkpoint/_src/serialization.py:394>>"
        )
        log.error("Task exception was never retrieved\nfuture: <Task finished coro=<mine()>>")
    assert [r.getMessage().split("coro=")[1] for r in caplog.records] == ["<mine()>>"]
