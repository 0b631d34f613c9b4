"""One run over many devices and processes equals the same run on one device.

Runs with 8 fake CPU devices (see conftest.py). The same global batch sequence
is used whatever the mesh, so data parallelism changes only the order of float
sums (the gradient all-reduce), seed parallelism nothing at all.
"""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist.cli import main
from jaxmnist.models import model_config
from jaxmnist.runs import checkpoint
from jaxmnist.timing import compile_count
from jaxmnist.training import memory, parallel, population
from jaxmnist.training.hooks import Callback
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members

RUNNER = Path(__file__).parents[1] / "run_tiny_cli.py"


def small_cfg(optimizer="adam", lr=1e-3, **train):
    cfg = config_lib.get_preset("tpu101")
    train = {"batch_size": 32, "steps": 50, "eval_batch_size": 64, **train}
    return dataclasses.replace(
        cfg,
        optimizer=dataclasses.replace(cfg.optimizer, name=optimizer, lr=lr),
        train=dataclasses.replace(cfg.train, **train),
        compile_cache=False,
    )


def trained(cfg, dataset, layout):
    result = train_population(cfg, seed_members(cfg), dataset, layout=layout)
    return result, result.population.params(result.states)


def assert_trees_close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, **tol)


@pytest.fixture(scope="module")
def sgd_one_device(tiny_dataset):
    return trained(small_cfg("sgd", 0.05), tiny_dataset, parallel.build_layout(1))


@pytest.mark.parametrize("devices", [2, 8])
def test_data_parallel_equals_one_device(tiny_dataset, sgd_one_device, devices):
    result, params = trained(small_cfg("sgd", 0.05), tiny_dataset, parallel.build_layout(devices))
    assert result.info["mesh"] == {"members": 1, "data": devices}
    assert_trees_close(sgd_one_device[1], params, rtol=1e-5, atol=1e-7)
    assert result.test.accuracy[0] == sgd_one_device[0].test.accuracy[0]


def test_data_parallel_adam_agrees_to_its_rounding_noise(tiny_dataset):
    """Adam divides by the gradient's running RMS, so a weight whose gradient is at
    the rounding level moves by its sign noise: 50 steps agree to ~3e-5, not 1e-7."""
    one, p1 = trained(small_cfg(), tiny_dataset, parallel.build_layout(1))
    four, p4 = trained(small_cfg(), tiny_dataset, parallel.build_layout(4))
    assert_trees_close(p1, p4, rtol=1e-5, atol=1e-4)
    assert four.test.accuracy[0] == one.test.accuracy[0]


@pytest.mark.slow
def test_batch_norm_over_a_data_axis_normalises_by_the_whole_global_batch(tiny_dataset):
    """Each device holds a quarter of every batch; the statistics must still be the
    global batch's (a per-device normalisation would train a different model)."""
    cfg = small_cfg("sgd", 0.05, steps=20)
    model = model_config("cnn", channels=(4, 8), hidden=(16,), batch_norm=True)
    cfg = dataclasses.replace(cfg, model=model)
    _, p1 = trained(cfg, tiny_dataset, parallel.build_layout(1))
    _, p4 = trained(cfg, tiny_dataset, parallel.build_layout(4))
    assert_trees_close(p1, p4, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_seed_parallel_and_mixed_mesh_equal_one_device(tiny_dataset):
    cfg = small_cfg(seeds=8, steps=20)
    _, p1 = trained(cfg, tiny_dataset, parallel.build_layout(1))
    spread, p8 = trained(cfg, tiny_dataset, parallel.build_layout(8, num_models=8))
    assert spread.info["mesh"] == {"members": 8, "data": 1}
    assert_trees_close(p1, p8, rtol=1e-5, atol=1e-6)  # no communication: the same sums
    # The same 8 members on a mixed mesh (4 a member group, each batch over 4 devices),
    # against the same one-device run.
    mixed, p24 = trained(cfg, tiny_dataset, parallel.build_layout(None, {"members": 2, "data": 4}))
    assert mixed.info["mesh"] == {"members": 2, "data": 4}
    assert_trees_close(p1, p24, rtol=1e-5, atol=1e-4)


def test_staged_batches_drawn_on_the_host_train_the_same_models_on_a_mixed_mesh(
    tiny_dataset, monkeypatch
):
    """Each epoch's batches gathered by the host's CPU as it draws the plan (as on a TPU),
    then split over the `data` axis by the steps, train what the steps' own gather does."""
    cfg = small_cfg(seeds=2, steps=12)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, augment=True))
    layout = parallel.build_layout(None, {"members": 2, "data": 2})
    host = jax.local_devices(backend="cpu")[0]
    monkeypatch.setattr(population, "plan_device", lambda backend=None: host)
    params = {}
    for staged in (False, True):
        monkeypatch.setattr(memory, "stages_batches", lambda *a, staged=staged, **k: staged)
        result, params[staged] = trained(cfg, tiny_dataset, layout)
        assert result.population.staged is staged
    assert_trees_close(params[False], params[True], rtol=0, atol=0)


@pytest.mark.parametrize("mesh", [{"members": 2, "data": 2}, {"members": 1, "data": 4}])
def test_batches_augmented_ahead_train_the_same_models_on_a_mesh(tiny_dataset, monkeypatch, mesh):
    """Each epoch's batches augmented by a program of their own as it starts (as several
    models' are on a TPU), held split over the `data` axis, train what the steps'
    own augmentation does."""
    cfg = small_cfg(seeds=2, steps=12)
    data = dataclasses.replace(cfg.data, augment=True, max_shift=2, flip=True)
    cfg = dataclasses.replace(cfg, data=data)
    layout = parallel.build_layout(None, mesh)
    params = {}
    for ahead in (False, True):
        monkeypatch.setattr(population, "augments_ahead", lambda *a, ahead=ahead: ahead)
        result, params[ahead] = trained(cfg, tiny_dataset, layout)
        assert result.info["augmented_ahead"] is ahead and result.info["mesh"] == mesh
        if ahead:  # each step's batch split over the data axis, as the steps split it
            images = result.population.augment_fns[2].output_shardings[0]
            assert images.spec == jax.sharding.PartitionSpec("members", None, "data")
    assert_trees_close(params[False], params[True], rtol=0, atol=0)


class CompileWatch(Callback):
    """Counts JAX compiles from the end of compilation to the end of the last epoch."""

    def on_compiled(self, seconds):
        self.start = compile_count()

    def on_epoch_end(self, end):
        self.during_epochs = compile_count() - self.start


@pytest.mark.parametrize("mesh", [{"members": 1, "data": 4}, {"members": 4, "data": 2}])
def test_no_compile_after_compilation_and_exact_evaluation(tiny_dataset, mesh):
    """Evaluation batches are rounded up to a multiple of the data axis and masked: the
    150 test examples count exactly once (eval batch 50 -> 52 on 4 devices)."""
    cfg = small_cfg(seeds=mesh["members"], steps=None, epochs=3, eval_batch_size=50)
    watch = CompileWatch()
    layout = parallel.build_layout(None, mesh)
    result = train_population(cfg, seed_members(cfg), tiny_dataset, watch, layout=layout)
    assert watch.during_epochs == 0 and len(result.records) == 3
    assert result.test.count == 150
    one = train_population(cfg, seed_members(cfg), tiny_dataset, layout=parallel.build_layout(1))
    np.testing.assert_allclose(result.test.loss, one.test.loss, rtol=1e-4)
    np.testing.assert_array_equal(result.test.confusion.sum(axis=(1, 2)), [150] * mesh["members"])
    if mesh["members"] > 1:  # the ensemble, its members split over the mesh: the same figures
        assert result.ensemble.confusion.sum() == 150
        assert result.ensemble.accuracy == pytest.approx(one.ensemble.accuracy, abs=1e-9)
        assert result.ensemble.loss == pytest.approx(one.ensemble.loss, rel=1e-4)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--devices", "4", "--mesh", "members=2,data=1"], "uses 2 devices but --devices says 4"),
        (["--devices", "16"], "only 8 cpu device"),
        (["--devices", "3"], "batch size 32 is not divisible by the data axis (3 devices)"),
        (["--seeds", "3", "--mesh", "members=2"], "3 model(s) do not split"),
    ],
)
def test_impossible_meshes_are_one_line_and_exit_2(train_argv, tmp_path, capsys, extra, message):
    run = tmp_path / "run"
    assert main(train_argv(run, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (run / "config.json").exists()  # refused before any data was read


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes(tiny_data_dir, run_dir, count, *extra, port=None, ids=None, totals=None):
    """`count` processes of one 2-process run (ids 0, 1, ... and --num-processes 2
    unless `ids` and `totals` say otherwise, one value per process)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    args = [
        "train", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--batch-size", "32",
        "--no-compile-cache", "--no-report", "--devices", "all", "--run-dir", str(run_dir),
        "--coordinator", f"127.0.0.1:{port or _free_port()}", *extra,
    ]  # fmt: skip
    ids = ids or range(count)
    totals = totals or [2] * count
    return [
        subprocess.Popen(
            [sys.executable, str(RUNNER), *args, "--num-processes", str(n), "--process-id", str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, n in zip(ids, totals, strict=True)
    ]


def _listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


def _wait_listening(port: int, proc, seconds: float = 30) -> list[str]:
    deadline = time.monotonic() + seconds
    while not (found := _listening(port)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    return found


def test_the_coordinator_listens_only_on_the_host_it_was_given(tiny_data_dir, tmp_path):
    """127.0.0.1 binds the loopback address alone, as IPv4 or as IPv4 mapped into IPv6
    (jax's default, [::]:PORT, listens on every interface)."""
    port = _free_port()
    (alone,) = _processes(tiny_data_dir, tmp_path / "run", 1, "--process-timeout", "20", port=port)
    try:
        found = _wait_listening(port, alone)
    finally:
        alone.kill()
        alone.communicate()
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
    assert found and set(found) <= loopback, found


def test_processes_that_disagree_on_the_count_stop_with_one_line(tiny_data_dir, tmp_path):
    procs = _processes(tiny_data_dir, tmp_path / "run", 2, "--steps", "5", totals=[2, 3])
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs
    for _, err in outs:
        (line,) = err.strip().splitlines()
        assert "disagree on --num-processes" in line and "with 2" in line and "with 3" in line
    assert not (tmp_path / "run" / "summary.json").exists()


def test_two_processes_equal_one_process_with_four_devices_and_a_second_process_0_is_refused(
    tiny_data_dir, train_argv, tmp_path
):
    """Process 0 starts alone; a second process 0 on its port is refused in one line and
    the first goes on (gRPC shares a port (SO_REUSEPORT): a second coordinator on it
    used to take part of the connections, abort the first in C++ and time out itself).
    Process 1 joins, and the two processes train what one process with their 4 devices
    trains."""
    port, multi = _free_port(), tmp_path / "multi"
    (first,) = _processes(tiny_data_dir, multi, 1, "--steps", "30", port=port, ids=[0])
    try:
        _wait_listening(port, first)
        (second,) = _processes(tiny_data_dir, multi, 1, "--steps", "30", port=port, ids=[0])
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert "another process already started with --process-id 0" in err
        (peer,) = _processes(tiny_data_dir, multi, 1, "--steps", "30", port=port, ids=[1])
        procs = [first, peer]
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        first.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    # Only process 0 prints. Gloo's C++ start-up messages aside: it writes them
    # itself, from several threads, so two of them can interleave mid-line.
    gloo = r"\[Gloo\] Rank |\d+ is connected to \d+ peer ranks\. [^\n]*?: \d+"
    quiet = re.sub(gloo, "", outs[1][0])
    assert "test accuracy" in outs[0][0] and quiet.split() == []
    assert outs[1][0] == ""  # not even gloo's lines: process 1 says nothing
    assert main(train_argv(tmp_path / "one", "--steps", "30", "--devices", "4", "--no-report")) == 0
    with (
        np.load(tmp_path / "one" / "params.npz") as a,
        np.load(tmp_path / "multi" / "params.npz") as b,
    ):
        assert sorted(a.files) == sorted(b.files)
        assert_trees_close([a[k] for k in a.files], [b[k] for k in a.files], rtol=1e-5, atol=1e-4)
    summary = json.loads((tmp_path / "multi" / "summary.json").read_text())
    assert summary["devices"] == 4 and summary["mesh"] == {"members": 1, "data": 4}


def test_a_missing_process_is_one_line_within_the_timeout(tiny_data_dir, tmp_path):
    start = time.monotonic()
    (alone,) = _processes(tiny_data_dir, tmp_path / "run", 1, "--process-timeout", "3")
    _, err = alone.communicate(timeout=60)
    assert alone.returncode == 1 and time.monotonic() - start < 40
    assert (
        err.strip().splitlines()[-1].startswith("jaxmnist: error: the 2 processes did not all join")
    )


def _wait_for_epochs(run: Path, procs, epochs: int) -> None:
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= epochs):
        assert time.monotonic() < deadline and procs[0].poll() is None
        time.sleep(0.05)


def _trainer(proc) -> int:
    """The pid of the child that trains for `jaxmnist train` process `proc` (several
    processes run under a supervisor: jaxmnist/training/supervisor.py)."""
    (child,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(child)


@pytest.mark.slow
def test_a_lost_process_is_one_line_that_says_which_and_how_to_resume(tiny_data_dir, tmp_path):
    """kill -9 of process 1's training (its host lost): process 0 ends within the
    heartbeat bound with one line naming process 1 and the command that resumes it,
    not the coordination service's C++ abort; that command, run by every process,
    finishes the run."""
    run = tmp_path / "run"
    procs = _processes(tiny_data_dir, run, 2, "--epochs", "10", "--process-timeout", "5")
    _wait_for_epochs(run, procs, 2)
    os.kill(_trainer(procs[1]), signal.SIGKILL)
    killed = time.monotonic()
    _, err = procs[0].communicate(timeout=60)
    _, err1 = procs[1].communicate(timeout=60)
    assert procs[0].returncode == 1 and time.monotonic() - killed < 30
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("jaxmnist train: error: process 1 stopped answering"), err
    assert "ended by SIGKILL" in err1 and procs[1].returncode == 1  # its supervisor says so
    resume = re.search(r"here: (jaxmnist train --resume .*)$", err.strip()).group(1).split()
    assert resume[:4] == ["jaxmnist", "train", "--resume", str(run)]
    pid_at = resume.index("--process-id") + 1
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    again = [
        subprocess.Popen(
            [sys.executable, str(RUNNER), *resume[1:pid_at], str(i), *resume[pid_at + 1 :]],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]  # fmt: skip
    outs = [p.communicate(timeout=180) for p in again]
    assert [p.returncode for p in again] == [0, 0], outs
    assert json.loads((run / "summary.json").read_text())["epochs"] == 10


def test_killing_a_process_s_supervisor_stops_the_run_with_a_checkpoint(tiny_data_dir, tmp_path):
    """kill -9 of the process a user started (the supervisor) ends its training with
    SIGTERM (PR_SET_PDEATHSIG): every process stops at one step with a checkpoint."""
    run = tmp_path / "run"
    procs = _processes(tiny_data_dir, run, 2, "--epochs", "200", "train.progress_every=7")
    _wait_for_epochs(run, procs, 2)
    trainer = _trainer(procs[1])
    procs[1].send_signal(signal.SIGKILL)
    _, err = procs[0].communicate(timeout=120)
    procs[1].communicate()
    assert procs[0].returncode == 143, err
    assert "stopped at step" in err.strip().splitlines()[-1]
    assert checkpoint.checkpoint_steps(run)
    status = Path(f"/proc/{trainer}/status")  # gone, or a zombie nobody reaped here
    assert not status.exists() or "State:\tZ" in status.read_text()


def test_a_signal_to_one_process_stops_every_process_at_the_same_step(tiny_data_dir, tmp_path):
    """SIGTERM reaches only process 1 (as when one host of a job is preempted): the
    processes agree after every call, so both stop at one step, save one checkpoint
    there together and exit 143; neither hangs waiting for the other."""
    run = tmp_path / "run"
    procs = _processes(tiny_data_dir, run, 2, "--epochs", "200", "train.progress_every=7")
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and procs[0].poll() is None
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outs
    lines = [err.strip().splitlines()[-1] for _, err in outs]
    (step,) = checkpoint.checkpoint_steps(run)[-1:]
    # Both stopped at one step; each says the command that resumes it, its own process
    # flags included, as the lost-peer line does.
    for i, line in enumerate(lines):
        assert line.startswith(f"jaxmnist train: stopped at step {step}; start every process")
        assert f"--resume {run}" in line and line.endswith(f"--process-id {i}")
    assert lines[0].replace("--process-id 0", "--process-id 1") == lines[1]
    assert step < 200 * 20 and not (run / "summary.json").exists()


@pytest.mark.slow
def test_bench_scaling_table_over_devices(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--synthetic", "--modes", "scan-epoch", "--dtypes", "float32"]
    argv += ["--batch-sizes", "128", "--devices", "1,2,4", "--out", str(out)]
    assert main(argv) == 0
    scaling = json.loads((out / "bench.json").read_text())["scaling"]
    assert [r["devices"] for r in scaling["rows"]] == [1, 2, 4] and scaling["fake_devices"]
    first, *rest = scaling["rows"]
    assert first["data_parallel_efficiency"] == first["seed_parallel_efficiency"] == 1.0
    assert first["allreduce_bytes_per_step"] == 0
    assert all(r["allreduce_bytes_per_step"] == 4 * 203_530 for r in rest)
    assert "cost of splitting" in capsys.readouterr().out


def test_auto_convolution_on_a_cpu_mesh_is_plain_xla():
    """oneDNN's custom calls are opaque to the partitioner (it would gather a sharded
    batch before each), so with several devices `auto` keeps the shardable im2col."""
    from jaxmnist.models import conv

    assert jax.device_count() > 1
    assert conv.resolve("auto", "cpu") == conv.CPU_FASTEST_XLA == "im2col"
