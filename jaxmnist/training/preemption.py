"""Stopping cleanly when asked to: SIGTERM (cloud VMs, SLURM) and the first Ctrl-C.

A `StopRequest` installs signal handlers that only set a flag; the run loop asks
it after every compiled call (calls last about half a second, `jaxmnist.training.pacing`),
and the checkpointer saves there, mid-epoch or not, whatever `--checkpoint-every`
says. In a run of several processes, a signal to any of them stops them all at
the same step. The run then ends without summary.json and the command line exits
143 (SIGTERM) or 130 (Ctrl-C). A second Ctrl-C falls through to the operating
system's default and kills the process at once; the checkpoints already
committed are untouched (Orbax renames a checkpoint into place only when it is
complete).
"""

from __future__ import annotations

import signal
import sys

from jaxmnist.errors import JaxmnistError

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + signal number, as shells do


class Stopped(JaxmnistError):
    """The run stopped on a signal after saving a checkpoint; `exit_code` says which."""

    def __init__(self, message: str, exit_code: int, step: int | None = None):
        super().__init__(message)
        self.exit_code, self.step = exit_code, step


class StopRequest:
    """A flag set by SIGTERM or SIGINT, which the run loop asks (`requested`)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        """130 after Ctrl-C, 143 after SIGTERM, here or (no signal here) in another process."""
        return EXIT_CODES.get(self.signum, 143)

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            # The next Ctrl-C is the OS default: the process ends at once, even in device code.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        if self.signum is None:
            self.signum = signum
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            print(
                f"\njaxmnist: {name}: stopping after the steps under way, to save a checkpoint"
                + (" (Ctrl-C again aborts at once)" if signum == signal.SIGINT else ""),
                file=sys.stderr,
                flush=True,
            )

    def install(self) -> StopRequest:
        for signum in EXIT_CODES:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
