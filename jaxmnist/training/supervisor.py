"""A process of a multi-process run, watched from outside: one line when a peer is lost.

When a peer process dies (killed, preempted, its host gone), jax's coordination
service ends the others from a C++ thread: a fatal log message, a stack trace and
SIGABRT. Nothing in Python can intercept that (jaxlib's `missed_heartbeat_callback`
cannot be a Python function, and an abort is not an exception), so `jaxmnist train`
with several processes runs the training in a child process and watches it:

    parent      forwards SIGINT, SIGTERM and SIGHUP to the child (once each), passes
                stdout through untouched and stderr line by line, holding back the
                coordination service's C++ log blocks for a moment
    child       the same command line with JAXMNIST_SUPERVISED set: trains as before

If the child ends because a peer was lost, the parent drops those log blocks and
says in one line which process was lost and how to go on (exit 1). Otherwise the
held lines are passed on and the child's exit status becomes the parent's. A
communication error the child itself sees first (gloo's "Connection reset by peer"
in a collective) is not printed: the child waits for the coordination service's
verdict, which names the lost process.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

ENV = "JAXMNIST_SUPERVISED"
EXIT_PEER_LOST = 1
HOLD_SECONDS = 2.0  # a C++ log block that is followed by this much quiet was not fatal

# glog's prefix: severity, MMDD, time, thread id, file:line]
_LOG_LINE = re.compile(rb"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
_FATAL = b"JAX distributed service detected fatal errors"
_HEARTBEAT_TASK = re.compile(rb"Task (\d+) heartbeat timeout")
_UNHEALTHY = re.compile(rb"stopped sending heartbeats\):\s*\n([\d, ]+)")
# Other ways its messages name a task: "Barrier Id: X, Task: 1", "/job:jax_worker/replica:0/task:1".
_TASK_NAMED = re.compile(rb"\bTask:? (\d+)\b|/task:(\d+)\b")
_COORDINATOR_GONE = b"Failed to send RPC to coordination service"
# What a collective or the coordination client raises when the other side vanished: its
# connection dropped, or it never reached a barrier every process waits at (Orbax's, as a
# checkpoint's asynchronous write ends; JAX's own).
_COMMUNICATION = (
    "Connection reset by peer",
    "Connection closed by peer",
    "gloo",
    "UNAVAILABLE",
    "barrier",
    "Barrier",
)


def is_child() -> bool:
    return bool(os.environ.get(ENV))


def run_watched(args, workdir) -> int | None:
    """For `train` with several processes: the exit status of the watched child that
    trained, or None when this process should train itself: it is the child, or one
    process alone, or `cli.main(argv)` was called as a library (the command line is
    what is run again)."""
    if is_child():
        _end_with_parent()
        return None
    several = args.coordinator is not None or args.distributed
    if not several or list(args.argv) != sys.argv[1:]:
        return None
    return supervise(args, workdir)


def supervise(args, workdir) -> int:
    """Runs this `train` command again in a watched child (with `--run-dir` made
    explicit, so both name one directory) and returns the exit status this process
    should end with."""
    argv = list(args.argv)
    if not args.resume and not args.run_dir:
        argv += ["--run-dir", str(workdir)]
    prefix = sys.orig_argv[: len(sys.orig_argv) - (len(sys.argv) - 1)]  # interpreter, script
    child = subprocess.Popen(
        [sys.executable, *prefix[1:], *argv],
        env={**os.environ, ENV: str(os.getpid())},
        stderr=subprocess.PIPE,
        process_group=0,  # the terminal's Ctrl-C reaches this process, which passes it on once
    )
    previous = {s: signal.signal(s, lambda signum, _: child.send_signal(signum)) for s in _SIGNALS}
    relay = _StderrRelay(child.stderr)
    try:
        reader = threading.Thread(target=relay.read, daemon=True)
        reader.start()
        while child.poll() is None:
            relay.flush_if_quiet()
            time.sleep(0.2)
        reader.join()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    code = child.returncode
    processes = args.num_processes if args.coordinator is not None else None
    lost = peer_lost(relay.held, args.process_id, processes) if code != 0 else None
    if lost is None:
        relay.flush()
        if code >= 0 or -code in (signal.SIGINT, signal.SIGTERM):
            return code if code >= 0 else 128 - code
        lost = f"this process's training (pid {child.pid}) ended by {signal.Signals(-code).name}"
    sys.stderr.write(f"jaxmnist train: error: {lost}; {resume_hint(args, workdir)}\n")
    sys.stderr.flush()
    return EXIT_PEER_LOST


def resume_hint(args, workdir) -> str:
    """How to go on: the same processes, each resuming the run."""
    flags = ["--distributed"] if args.distributed else []
    if args.coordinator is not None:
        flags = ["--coordinator", args.coordinator, "--num-processes", str(args.num_processes)]
        flags += ["--process-id", str(args.process_id)]
    if args.process_timeout != 60:
        flags += ["--process-timeout", str(args.process_timeout)]
    command = shlex.join(["jaxmnist", "train", "--resume", str(workdir), *flags])
    return f"start every process again to go on from the last checkpoint, here: {command}"


def stopped_line(e, args, workdir) -> str:
    """What a stop (`preemption.Stopped` `e`) says: where it stopped, and the command that
    resumes it, which for a run of several processes names them as `resume_hint` does."""
    several = args.coordinator is not None or args.distributed
    if several and e.step is not None:
        return f"stopped at step {e.step}; {resume_hint(args, workdir)}"
    return str(e)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _ParentStderr:
    """The child's sys.stderr, the parent's pipe: once the parent is gone, what is written
    goes nowhere instead of raising BrokenPipeError wherever the writer was (a signal
    handler's line, mid-step), so the stop that follows still saves its checkpoint."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self._divert()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._divert()

    def _divert(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # C++ logging too
        os.close(devnull)
        self._stream = open(os.devnull, "w")  # noqa: SIM115 -- for the process's lifetime

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _end_with_parent() -> None:
    """In the child: SIGTERM (a clean stop with a checkpoint, in every process) when
    the parent dies; at once if it is gone already."""
    sys.stderr = _ParentStderr(sys.stderr)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the child outlives a killed parent
        return
    if str(os.getppid()) != os.environ[ENV]:
        os.kill(os.getpid(), signal.SIGTERM)


def peer_lost(stderr: bytes, process_id: int | None, processes: int | None = None) -> str | None:
    """What the coordination service's fatal message says was lost, in words, or None
    when the child did not end that way. `processes`: how many the run has, where known;
    of two, the lost one is the other when the messages name no task at all."""
    if _FATAL not in stderr:
        return None
    ids = {int(m) for m in _HEARTBEAT_TASK.findall(stderr)}
    for group in _UNHEALTHY.findall(stderr):
        ids.update(int(x) for x in re.split(rb"[,\s]+", group.strip()) if x)
    if not ids:
        ids = {int(a or b) for a, b in _TASK_NAMED.findall(stderr)}
    if not ids and processes == 2 and process_id in (0, 1):
        ids = {1 - process_id}
    ids.discard(process_id)
    if ids:
        *rest, last = map(str, sorted(ids))
        named = f"processes {', '.join(rest)} and {last}" if rest else f"process {last}"
        return f"{named} stopped answering (killed, preempted or host lost)"
    if _COORDINATOR_GONE in stderr and process_id != 0:
        return "process 0 (the coordinator) is gone (killed, preempted or its host lost)"
    return "another process of the run stopped answering (killed, preempted or its host lost)"


def looks_like_lost_peer(error: BaseException) -> bool:
    """Whether `error`, or any error it was raised from or while handling, is what a
    vanished peer causes. The whole chain is read: a one-line error of ours (a
    checkpoint that could not be written) keeps only the tail of Orbax's message, and
    the word that says "barrier" may be in the part it left out."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if any(s in str(error) for s in _COMMUNICATION):
            return True
        error = error.__cause__ or error.__context__
    return False


def wait_for_verdict(error: BaseException, timeout_seconds: float) -> None:
    """In a supervised child, after `error`: when it looks like a lost peer, says nothing
    and waits for the coordination service to end this process (its message names the
    peer, and the parent reports it). Returns when the error was something else, or
    when no verdict came, so that the error is reported as usual."""
    if not is_child() or not looks_like_lost_peer(error):
        return
    deadline = time.monotonic() + timeout_seconds + 15  # the heartbeat timeout, and slack
    while time.monotonic() < deadline:
        time.sleep(0.5)


class _StderrRelay:
    """Passes the child's stderr on line by line, holding back C++ log blocks until
    they are followed by `HOLD_SECONDS` of quiet (or the child's end decides)."""

    def __init__(self, stream):
        self.stream = stream
        self.lock = threading.Lock()
        self.pending: list[bytes] = []
        self.held = b""  # everything that was ever held back: what `peer_lost` reads
        self.last = 0.0

    def read(self) -> None:
        for line in iter(self.stream.readline, b""):
            with self.lock:
                if self.pending or _LOG_LINE.match(line):
                    self.pending.append(line)
                    self.held += line
                    self.last = time.monotonic()
                else:
                    _write(line)

    def flush_if_quiet(self) -> None:
        with self.lock:
            if self.pending and time.monotonic() - self.last > HOLD_SECONDS:
                self._flush()

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        for line in self.pending:
            _write(line)
        self.pending.clear()


def _write(line: bytes) -> None:
    sys.stderr.buffer.write(line)
    sys.stderr.flush()
