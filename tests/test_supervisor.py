"""The supervisor of a multi-process `train`: what it reads in the coordination
service's fatal messages, and how it passes the child's stderr on. (The processes
themselves are killed in tests/multidevice/test_sharding.py.)"""

import argparse
import os
import sys
import time

from jaxmnist.training import supervisor

# What process 0 prints when process 1 stops sending heartbeats (jax 0.10, abridged).
HEARTBEAT = b"""E1201 15:44:25.122802   30959 coordination_service.cc:1520] [1] Shutdown barrier in coordination service has failed:
INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 1 heartbeat timeout. This indicates that the remote task has failed
E1201 15:44:25.122920   30959 coordination_service.cc:1549] [1] Use error polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1, 3
The tasks have crashed.
F1201 15:44:25.123471   30970 client.h:80] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died
*** Check failure stack trace: ***
    @     0x7f268ec58634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
"""  # noqa: E501
# What process 1 prints when process 0, the coordinator, is gone.
COORDINATOR = b"""E1201 15:46:16.357240    1438 coordination_service_agent.cc:289] Polled an error from coordination service (this can be an error from this or another task).
F1201 15:46:16.357249    1438 client.h:80] Terminating process because the JAX distributed service detected fatal errors. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted
"""  # noqa: E501


def test_the_lost_processes_are_named():
    assert supervisor.peer_lost(HEARTBEAT, 0).startswith("processes 1 and 3 stopped answering")
    assert supervisor.peer_lost(HEARTBEAT, 3).startswith("process 1 stopped answering")
    assert supervisor.peer_lost(COORDINATOR, 1).startswith("process 0 (the coordinator) is gone")
    # Process 0 is never told that it is itself gone.
    assert not supervisor.peer_lost(COORDINATOR, 0).startswith("process 0")
    fatal = b"F1201" + HEARTBEAT.split(b"F1201")[1]  # the fatal line alone names nobody
    assert supervisor.peer_lost(fatal, 0).startswith("another process of the run")
    # ... except in a run of two processes, where the other one is the lost one.
    assert supervisor.peer_lost(fatal, 0, 2).startswith("process 1 stopped answering")
    assert supervisor.peer_lost(fatal, 1, 2).startswith("process 0 stopped answering")
    assert supervisor.peer_lost(fatal, 0, 3).startswith("another process of the run")
    # The barrier's and the task's own names for a task, when nothing else names one.
    for named in (b"Barrier Id: save::0, Task: 2", b"/job:jax_worker/replica:0/task:2 left"):
        assert supervisor.peer_lost(named + b"\n" + fatal, 0, 4).startswith("process 2 stopped")
    assert supervisor.peer_lost(b"Task: 0\n" + fatal, 0, 2).startswith("another process")


def test_an_end_that_is_not_a_lost_peer_is_not_called_one():
    assert supervisor.peer_lost(HEARTBEAT.replace(b"detected fatal errors", b"x"), 0) is None
    assert supervisor.peer_lost(b"Traceback ...\nValueError: bad\n", 0) is None


def test_log_blocks_are_held_until_quiet_and_other_lines_pass_at_once(monkeypatch, capfd):
    read, write = os.pipe()
    os.write(write, b"jaxmnist: a warning\n" + COORDINATOR.splitlines(True)[0] + b"more\n")
    os.close(write)
    with os.fdopen(read, "rb") as stream:
        relay = supervisor._StderrRelay(stream)
        relay.read()
    assert capfd.readouterr().err == "jaxmnist: a warning\n"  # the log block is held
    assert relay.held.endswith(b"more\n")
    relay.flush_if_quiet()
    assert capfd.readouterr().err == ""  # not quiet long enough yet
    monkeypatch.setattr(supervisor, "HOLD_SECONDS", 0.0)
    time.sleep(0.01)
    relay.flush_if_quiet()
    assert capfd.readouterr().err == COORDINATOR.splitlines(True)[0].decode() + "more\n"


def _args(**kw):
    base = {"coordinator": None, "distributed": False, "argv": sys.argv[1:], "resume": None}
    return argparse.Namespace(**{**base, **kw})


def test_only_a_command_line_of_several_processes_is_supervised(monkeypatch):
    monkeypatch.delenv(supervisor.ENV, raising=False)
    ran = []
    monkeypatch.setattr(supervisor, "supervise", lambda args, workdir: ran.append(args) or 7)
    assert supervisor.run_watched(_args(), "run") is None  # one process
    assert supervisor.run_watched(_args(coordinator="h:1", argv=["x"]), "run") is None  # library
    assert supervisor.run_watched(_args(coordinator="h:1"), "run") == 7 and len(ran) == 1
    assert supervisor.run_watched(_args(distributed=True), "run") == 7


def test_the_resume_hint_repeats_the_process_flags():
    args = _args(coordinator="10.0.0.5:1234", num_processes=4, process_id=2, process_timeout=60)
    hint = supervisor.resume_hint(args, "runs/a b")
    assert hint.endswith(
        "jaxmnist train --resume 'runs/a b' --coordinator 10.0.0.5:1234 --num-processes 4 "
        "--process-id 2"
    )
    hint = supervisor.resume_hint(_args(distributed=True, process_timeout=9), "r")
    assert hint.endswith("jaxmnist train --resume r --distributed --process-timeout 9")


def test_a_stop_of_several_processes_says_the_command_that_names_them():
    """Process 0's line after a stop repeats the process flags, as the lost-peer line does
    (it said `jaxmnist train --resume RUN` alone)."""
    from jaxmnist.training.preemption import Stopped

    stop = Stopped("stopped at step 7; resume with: jaxmnist train --resume r", 143, 7)
    args = _args(coordinator="127.0.0.1:1234", num_processes=2, process_id=0, process_timeout=60)
    line = supervisor.stopped_line(stop, args, "r")
    assert line.startswith("stopped at step 7; ")
    assert line.endswith(
        "jaxmnist train --resume r --coordinator 127.0.0.1:1234 --num-processes 2 --process-id 0"
    )
    assert supervisor.stopped_line(stop, _args(), "r") == str(stop)  # one process: as it was


def test_a_communication_error_waits_for_the_verdict_only_in_a_child(monkeypatch):
    waited = []
    monkeypatch.setattr(supervisor.time, "sleep", waited.append)
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: len(waited))
    supervisor.wait_for_verdict(RuntimeError("gloo: Connection reset by peer"), 5)
    assert waited == []  # not a supervised child: reported at once
    monkeypatch.setenv(supervisor.ENV, "1")
    supervisor.wait_for_verdict(ValueError("disk full"), 5)
    assert waited == []  # not a lost peer: reported at once
    supervisor.wait_for_verdict(RuntimeError("gloo: Connection reset by peer"), 5)
    assert len(waited) == 20  # the heartbeat timeout and 15 s of slack, in steps of 0.5 s
    # A peer killed while a checkpoint's asynchronous write ends never reaches its barrier.
    waited.clear()
    barrier = "Timed out while waiting for async_write_complete barrier."
    supervisor.wait_for_verdict(RuntimeError(barrier), 5)
    assert len(waited) == 20
    # Our one-line checkpoint error keeps only the tail of the coordination service's
    # message (as CI once printed it); the error it was raised while handling says why.
    waited.clear()
    service = (
        "INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 1 "
        "heartbeat timeout. [type.googleapis.com/tensorflow.CoordinationServiceError='']. "
        "Barrier Id: ThreadSaveMultiHostValueHolder:set_value_start::2::0, Task: 1"
    )
    tail = "cannot write a checkpoint in run: ThreadSaveMultiHostValueHolder:set_value_start::2"
    try:
        try:
            raise RuntimeError(service)
        except RuntimeError:
            raise OSError(tail) from None
    except OSError as e:
        supervisor.wait_for_verdict(e, 5)
    assert len(waited) == 20


def test_the_childs_stderr_outlives_its_parent():
    """Writing to the pipe of a parent that is gone goes nowhere instead of raising
    BrokenPipeError wherever the writer was (the stop line of a signal handler)."""
    import subprocess

    code = """
import os, sys
from jaxmnist.training.supervisor import _ParentStderr
read, write = os.pipe()
os.dup2(write, 2)
sys.stderr = _ParentStderr(os.fdopen(2, "w", buffering=1))
os.close(read)  # the parent is gone
print("stopping after the steps under way", file=sys.stderr, flush=True)
print("and again", file=sys.stderr, flush=True)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
