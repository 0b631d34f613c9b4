"""How many steps the run loop's next call runs.

One compiled call per epoch is fastest, but a call cannot be interrupted: a long
epoch run as one call would hold Ctrl-C, SIGTERM, progress and checkpoints until
it ends. The loop therefore runs each epoch in calls of about `target_seconds`
(`population.Population.train_steps`; the result is the same however an epoch is
cut). The first call of a run is one step, to measure; each later call runs as
many steps as the last measured speed fits in the target, and a short epoch runs
as one call. Calls also end where a checkpoint or a progress report is due
(every `every` global steps), so that those land on exact steps.

The epoch's duration is estimated (`settled`) only from a call past the warm-up:
the run's first steps are slower than the rest (caches, allocator and thread pools
still filling), the first call's step by far but the second step too, so the
second call, one or two steps when the first was slow, would announce a steady
epoch as several times longer than it takes.
"""

from __future__ import annotations

TARGET_SECONDS = 0.5  # per call: a stop is honoured within about two of these
SETTLED_STEPS = 4  # a call of this many steps outweighs the one warm-up step it may hold
SLOW_SECONDS = 2.0  # a call this long is timed well enough, and the user is waiting


class Pacer:
    """`next_stop` chooses a call's last step; `record` says how long it took."""

    def __init__(self, every: tuple[int, ...] = (), target_seconds: float | None = None):
        self.every = tuple(k for k in every if k)
        self.target = TARGET_SECONDS if target_seconds is None else target_seconds
        self.seconds_per_step: float | None = None
        self.calls = 0  # calls recorded
        self.last_steps, self.last_seconds = 0, 0.0

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
        self.calls += 1
        self.last_steps, self.last_seconds = steps, seconds
        if steps > 0:
            self.seconds_per_step = seconds / steps

    def settled(self) -> bool:
        """Whether the last measured speed is the run's steady one, not its warm-up's: a
        call after the first that ran several steps, or the third call (two warm-up
        steps behind, when steps are too slow for several in a call), or any call slow
        enough that waiting longer for a better figure would leave the user guessing."""
        if self.last_seconds >= SLOW_SECONDS:
            return True
        return self.calls >= 3 or (self.calls == 2 and self.last_steps >= SETTLED_STEPS)

    def epoch_seconds(self, num_steps: int) -> float | None:
        """The time an epoch of `num_steps` would take at the last measured speed."""
        return None if self.seconds_per_step is None else self.seconds_per_step * num_steps
