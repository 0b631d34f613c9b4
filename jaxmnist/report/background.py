"""The report of `jaxmnist train`, drawn by a child process that is ready when training ends.

matplotlib takes a while to import, and in the training process its import would hold
the GIL that the training loop needs. `ReportRenderer()` starts `python -m
jaxmnist.report.background` when the run starts: the child imports the report's modules
(matplotlib, no JAX) on its own core and waits for one line on its stdin: the finished
run's directory, sent by `finish()`. It then draws the figures on two cores, as the run
has ended (`draw_in_two`), and `finish()` waits for its answer, one JSON line on its
stdout: the page's path, or the one-line error (`JaxmnistError`) it met, raised here
with the same message and exit code. The page and every PNG are written atomically
(`rundir.atomic_write`), so a child that fails or is killed leaves no half-written
report.html, and the run's other files are never touched.

Nothing is lost when the child fails: if it cannot be started, exits without an answer
(a crash, a bug: its traceback is on stderr) or has not answered within `timeout`
seconds (it is then killed), the report is drawn here instead, as without the child.
What the child would need JAX or a registration made at run time for (the run's model
family's description and first-layer kernel; the datasets, whose display names the page
shows and whose spec reading a CNN's parameters needs) it is told (`describe.MODEL_FACTS`,
and every registered dataset's spec, put in the child's registry).
A child that is never told (the run stopped or failed) is stopped by `close()`, which
runs by itself when the renderer is garbage-collected or this process exits.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

from jaxmnist import errors

MAX_COPIES = 7  # forked drawers at most: a run's report has about as many figures
TIMEOUT_SECONDS = 600.0  # for the drawing, from the moment the child is told


class ReportRenderer:
    """A child process, started now, that writes the report of a run once it is finished.

    argv: the child's command (tests give a failing or hanging one); the default runs
    this module with the interpreter and package this process uses.
    """

    def __init__(self, argv: list[str] | None = None, timeout: float = TIMEOUT_SECONDS):
        self.timeout = timeout
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                argv or [sys.executable, "-m", "jaxmnist.report.background"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # One BLAS thread: the child draws, and `draw_in_two` forks it.
                env={**os.environ, "PYTHONPATH": path, "OPENBLAS_NUM_THREADS": "1"},
                start_new_session=True,  # Ctrl-C reaches the run alone; the run ends it
            )
        except OSError:
            self.proc = None  # drawn here instead
        self._close = weakref.finalize(self, _close, self.proc)

    def finish(self, run_dir: str | os.PathLike) -> Path:
        """Writes plots/ and report.html for the finished run in `run_dir`; returns the
        page's path. Raises what `write_run_report` would raise here."""
        answer = self._ask(Path(run_dir))
        if answer is None:  # no child, or no answer from it: drawn here
            from jaxmnist.report.run_report import write_run_report  # start-up: matplotlib

            return write_run_report(run_dir)
        if "error" in answer:
            kind = getattr(errors, str(answer.get("kind")), None)
            if not (isinstance(kind, type) and issubclass(kind, errors.JaxmnistError)):
                kind = errors.JaxmnistError
            err = kind(answer["error"])
            err.exit_code = int(answer.get("exit_code", 1))
            raise err
        return Path(answer["report"])

    def _ask(self, run_dir: Path) -> dict | None:
        """The child's answer, or None when there is none (no child, a crash, a timeout)."""
        if self.proc is None:
            return None
        from jaxmnist.data import registry  # start-up: loaded by training already

        request = {
            "run_dir": os.fspath(run_dir),
            "cwd": os.getcwd(),
            # Every dataset, those registered at run time (tests, plugins) included, which
            # the child's registry would lack.
            "datasets": {n: registry.spec_to_dict(s) for n, s in registry.DATASETS.items()},
            "model_facts": _model_facts(run_dir),
        }
        out = b""
        try:
            out, _ = self.proc.communicate(f"{json.dumps(request)}\n".encode(), self.timeout)
        except subprocess.TimeoutExpired:
            print(
                f"jaxmnist: the report was not drawn within {self.timeout:g} s; drawing it here",
                file=sys.stderr,
            )
        except OSError:  # it had exited already (a broken pipe)
            pass
        _close(self.proc)
        try:
            answer = json.loads(out.decode().splitlines()[-1])
        except (ValueError, IndexError):
            answer = None
        if isinstance(answer, dict) and answer.keys() & {"report", "error"}:
            return answer
        # Killed mid-write: its temporary files (`rundir.atomic_write` names them with its
        # pid) are all it can have left; the page and the PNGs in place are whole.
        for leftover in (
            *run_dir.glob(f".*.{self.proc.pid}.*.tmp"),
            *run_dir.glob(f"plots/.*.{self.proc.pid}.*.tmp"),
        ):
            leftover.unlink(missing_ok=True)
        return None

    def close(self) -> None:
        """Stops the child without a report (a stopped or failed run); waits for it."""
        self._close()


def _close(proc: subprocess.Popen | None) -> None:
    """Ends the child if it still runs: SIGTERM (it removes its temporary files), then
    SIGKILL if it has not exited within seconds."""
    if proc is None or proc.returncode is not None:
        return
    for signal_it in (proc.terminate, proc.kill):
        signal_it()
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass


def main() -> int:
    """The child: import, wait for the run directory, write the report, answer in JSON."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # atomic writes clean up
    try:
        # start-up: matplotlib, in the child while the run trains
        from jaxmnist.data import registry
        from jaxmnist.report import describe
        from jaxmnist.report.run_report import write_run_report
    except Exception:  # noqa: BLE001  the parent draws the report and shows the error
        return 0
    line = sys.stdin.readline()
    if not line:  # never told: the run stopped or failed
        return 0
    request = json.loads(line)
    os.chdir(request["cwd"])  # the run directory as the parent names it
    for name, spec in request["datasets"].items():
        registry.DATASETS[name] = registry.spec_from_dict(spec)
    describe.MODEL_FACTS.update(request["model_facts"])
    try:
        # As many drawers as the cores allow, all but one core to the copies.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        copies = max(1, min((cores or 2) - 1, MAX_COPIES))
        draw = functools.partial(draw_in_two, copies=copies)
        answer = {"report": str(write_run_report(request["run_dir"], draw=draw))}
    except errors.JaxmnistError as e:
        answer = {"error": str(e), "kind": type(e).__name__, "exit_code": e.exit_code}
    print(json.dumps(answer), flush=True)
    return 0


def draw_in_two(makers: dict, copies: int = 1) -> dict[str, bytes]:
    """{name: PNG bytes} of `makers` ({name: (figure maker, alt)}, `run_report`), drawn
    by this process and `copies` forked copies of it at once (one: "in two"): the run
    has ended, so that the machine's cores are free. They take the figures one at a time
    from a shared queue (a pipe holding their indices), so that one costly figure (a
    confusion matrix) does not leave one of them idle while another draws the rest of
    its share. What a copy does not deliver (it could not be forked, failed: its
    traceback is on stderr) is drawn here; so is everything once JAX is loaded, as it
    cannot be forked."""
    import pickle
    import traceback

    from jaxmnist.report.plots import to_png  # start-up: matplotlib, loaded by the child

    names = list(makers)
    pngs: dict[str, bytes] = {}

    def draw(name: str) -> None:
        pngs[name] = to_png(makers[name][0]())

    queue = None
    forked: list[tuple[int, int]] = []  # (pid, the pipe its figures come back on)
    try:
        if "jax" in sys.modules or len(names) > 255:  # JAX's threads make a fork unsafe
            raise OSError
        queue, fill = os.pipe()
        os.write(fill, bytes(range(len(names))))  # one byte per figure, far below a pipe's size
        os.close(fill)  # before the forks: the queue ends where its last index is taken
        for _ in range(max(0, min(copies, len(names) - 1))):
            r, w = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(r)
                os.close(w)
                break
            if pid == 0:  # a copy: draws what it takes, sends it, and never returns
                code = 1
                try:
                    os.close(r)
                    for _, other in forked:  # the pipes of the copies before it
                        os.close(other)
                    try:
                        _take_from(queue, names, draw)
                        code = 0
                    except BaseException:  # noqa: BLE001  the rest is drawn by the parent
                        traceback.print_exc()
                    with os.fdopen(w, "wb") as f:
                        pickle.dump(pngs, f)
                finally:
                    os._exit(code)
            os.close(w)
            forked.append((pid, r))
    except OSError:
        pass  # no copy: this process takes every index itself
    data = []
    try:
        if queue is not None:
            _take_from(queue, names, draw)
    finally:  # even when drawing here failed: the copies are waited for, never left behind
        if queue is not None:
            os.close(queue)
        for pid, r in forked:
            with os.fdopen(r, "rb") as f:
                data.append(f.read())
            os.waitpid(pid, 0)
    for part in data:
        try:
            pngs.update(pickle.loads(part) if part else {})  # from our own copies
        except (pickle.UnpicklingError, EOFError, ValueError):
            pass
    for n in names:
        if n not in pngs:
            draw(n)
    return {n: pngs[n] for n in names}


def _take_from(queue: int, names: list[str], draw) -> None:
    """Calls `draw(name)` for each figure whose index this process reads from the pipe
    `queue`, one at a time, until the pipe is empty (a read of one byte is atomic)."""
    while token := os.read(queue, 1):
        draw(names[token[0]])


def _model_facts(run_dir: Path) -> dict:
    """`describe.MODEL_FACTS` for the model section of the run's config.json, drawn here
    where its family is loaded; none if it cannot be read (the child then says what is
    wrong with it)."""
    from jaxmnist.report import describe  # start-up: numpy and the registries

    try:
        model = json.loads((run_dir / "config.json").read_text())["model"]
        return {describe.model_key(model): describe.model_facts(model)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


if __name__ == "__main__":
    code = main()
    # The answer is the child's last act, and the run waits for the child to exit: skip
    # the interpreter's teardown of matplotlib's modules (docs/results.md, "Around training").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
