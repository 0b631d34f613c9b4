"""How many steps the run loop's next call runs.

One compiled call per epoch is fastest, but a call cannot be interrupted: a long
epoch run as one call would hold Ctrl-C, SIGTERM, progress and checkpoints until
it ends. The loop therefore runs each epoch in calls of about `target_seconds`
(`population.Population.train_steps`; the result is the same however an epoch is
cut). The first call of a run is one step, to measure; each later call runs as
many steps as the last measured speed fits in the target, and a short epoch runs
as one call. Calls also end where a checkpoint or a progress report is due
(every `every` global steps), so that those land on exact steps.
"""

from __future__ import annotations

TARGET_SECONDS = 0.5  # per call: a stop is honoured within about two of these


class Pacer:
    """`next_stop` chooses a call's last step; `record` says how long it took."""

    def __init__(self, every: tuple[int, ...] = (), target_seconds: float | None = None):
        self.every = tuple(k for k in every if k)
        self.target = TARGET_SECONDS if target_seconds is None else target_seconds
        self.seconds_per_step: float | None = None

    def next_stop(self, epoch_step: int, num_steps: int, global_step: int) -> int:
        """The in-epoch step (exclusive) the next call runs to, from `epoch_step` of an
        epoch of `num_steps`, `global_step` steps into the run."""
        remaining = num_steps - epoch_step
        if self.seconds_per_step is None:
            n = 1  # nothing measured yet
        else:
            n = max(1, int(self.target / max(self.seconds_per_step, 1e-9)))
            if remaining - n <= n // 4:  # no sliver of a call at the end of the epoch
                n = remaining
        for k in self.every:
            n = min(n, k - global_step % k)
        return epoch_step + min(n, remaining)

    def record(self, steps: int, seconds: float) -> None:
        if steps > 0:
            self.seconds_per_step = seconds / steps

    def epoch_seconds(self, num_steps: int) -> float | None:
        """The time an epoch of `num_steps` would take at the last measured speed."""
        return None if self.seconds_per_step is None else self.seconds_per_step * num_steps
