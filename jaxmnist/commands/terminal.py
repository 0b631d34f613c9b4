"""The terminal during `jaxmnist train`: per-epoch lines, a progress bar and the summary.

`TerminalReporter` is a run-loop callback like the run directory's writer and the
checkpointer; the train command hands it to `train_and_evaluate` in process 0 only.
The progress bar moves between the run loop's calls (about every half second,
`jaxmnist.training.pacing`); it is shown only on an interactive terminal. When an epoch
will be long, the time it will take is said once, as soon as the first steps
have been timed.
"""

from __future__ import annotations

import contextlib
import os
import sys

from jaxmnist.training.hooks import Callback, EpochEnd, RunEnd, RunStart, StepsEnd

LONG_EPOCH_SECONDS = 30.0  # an epoch longer than this gets an estimate up front
SEEDS_LISTED = 20  # seeds named one by one in a run's last lines; the rest in summary.json


class TerminalReporter(Callback):
    """mode: "normal" (lines and a bar), "quiet" (one result line) or "json" (nothing)."""

    def __init__(self, mode: str = "normal", workdir=None, stream=None):
        self.mode = mode
        self.workdir = workdir
        self.out = stream or sys.stdout
        self.wants_progress = mode == "normal" and sys.stderr.isatty()
        self._bar = None
        self._first_step = 0
        self._val = False  # the run holds out a validation split: its columns are shown
        self._info: dict = {}  # the run's facts, from `on_start`
        self.closed = False  # stdout's reader went away (`train | head`)

    def _print(self, text: str) -> None:
        if self.mode == "normal":
            self._write(text)

    def _write(self, text: str) -> None:
        """One line on stdout. A reader that stops reading (`| head -2`) must not cost the
        run: the run goes on without printing and finishes, its files complete (stopping
        instead would leave a half run for a pipe nobody reads). Said once on stderr."""
        if self.closed:
            return
        try:
            print(text, file=self.out, flush=True)
        except BrokenPipeError:
            self.closed = True
            try:  # what is still buffered, and the command's last lines, go nowhere
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.out.fileno())
            except (OSError, ValueError, AttributeError):
                pass  # not a real file (a test's capture): nothing flushes it at exit
            where = f" (run directory: {self.workdir})" if self.workdir is not None else ""
            print(
                f"jaxmnist: stdout was closed; training goes on without printing{where}",
                file=sys.stderr,
                flush=True,
            )

    def on_start(self, start: RunStart) -> None:
        # start-up: the loop imports jax and optax, which building train's parser does not need
        from jaxmnist.training.loop import devices_text, run_length

        info = self._info = start.info
        self._print(
            f"{info['dataset']} from {info['source']} | {info['num_params']:,} parameters | "
            f"{run_length(info)} | {info['backend']}: {devices_text(info)}"
        )
        if "train_eval_subset_seed" in info:  # train acc is not the full training set's
            self._print(
                f"train acc: train subset of {info['train_eval_examples']:,} examples "
                f"(stratified, seed {info['train_eval_subset_seed']}, the same every epoch)"
            )
        self._val = "validation_examples" in info
        if self._val:
            self._print(
                f"val: {info['validation_examples']:,} training examples held out, never "
                f"trained on (stratified, seed {info['validation_seed']})"
            )
        p = start.progress
        if p.step:  # a resumed run: where it continues, once
            more = f" + {plural(p.epoch_step, 'step')}" if p.epoch_step else ""
            self._print(f"resumed from step {p.step:,} (epoch {p.epoch}{more})")
        if "models" in info:
            seeds, chunks = info["seeds"], info["chunks"]
            split = (
                f"in {len(chunks)} chunks ({' + '.join(map(str, chunks))})"
                if len(chunks) > 1
                else "at once"
            )
            budget = ""
            if info["memory_budget_mb"]:
                budget = f" of {info['memory_budget_mb']:,} MB ({info['memory_budget_source']})"
            self._print(
                f"{info['models']} models, seeds {seeds[0]}-{seeds[-1]}, "
                f"vmapped in one program, {split} | "
                f"memory estimate {info['memory_estimate_mb']:,.0f} MB{budget}"
            )

    def on_compiled(self, seconds: float) -> None:
        self._print(f"compiled in {seconds:.2f} s{compile_detail(self._info)}")
        self._print(
            f"{'epoch':>5} {'step':>6} {'train loss':>10} {'train acc':>9} "
            + f"{'val loss':>9} {'val acc':>8} " * self._val
            + f"{'test loss':>9} {'test acc':>8} {'time s':>7}"
        )

    def on_epoch_start(self, epoch: int, num_steps: int, first_step: int) -> None:
        if self.wants_progress:
            from tqdm import tqdm

            self._first_step = first_step
            self._bar = tqdm(
                total=num_steps, desc=f"epoch {epoch}", leave=False, file=sys.stderr, unit="step"
            )

    def on_estimate(self, epoch_seconds: float, seconds_per_step: float) -> None:
        if epoch_seconds >= LONG_EPOCH_SECONDS:
            self._print(
                f"an epoch will take about {duration(epoch_seconds)} "
                f"({seconds_per_step * 1e3:,.0f} ms per step, as timed so far)"
            )

    def on_steps(self, end: StepsEnd) -> None:
        if self._bar is not None:
            self._bar.update(end.step - self._first_step - self._bar.n)

    def on_epoch_end(self, end: EpochEnd) -> None:
        r = end.record
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        spread = ""
        if "test_accuracy_std" in r:  # several seeds: the figures are means
            spread = (
                f"  ± {r['test_accuracy_std']:.2%} (mean of {len(r['test_accuracy_per_seed'])})"
            )
        if "ensemble_test_accuracy" in r:  # the mean of the members' probabilities
            spread += f"  ensemble {r['ensemble_test_accuracy']:.2%}"
            if "ensemble_val_accuracy" in r:  # and on the validation split
                spread += f" (val {r['ensemble_val_accuracy']:.2%})"
        val = f"{r['val_loss']:>9.4f} {r['val_accuracy']:>8.2%} " if "val_loss" in r else ""
        self._print(
            f"{r['epoch']:>5} {r['step']:>6} {r['train_loss']:>10.4f} {r['train_accuracy']:>9.2%} "
            f"{val}"
            f"{r['test_loss']:>9.4f} {r['test_accuracy']:>8.2%} {r['epoch_seconds']:>7.3f}{spread}"
        )

    def on_finish(self, end: RunEnd) -> None:
        s = end.summary
        line = (
            f"test accuracy {s['test_accuracy']:.2%} ({s['num_test_examples']:,} examples), "
            f"test loss {s['test_loss']:.4f} | compile {s['compile_seconds']:.2f} s, "
            f"train {s['train_seconds']:.2f} s, {s['examples_per_second']:,.0f} examples/s"
        )
        if self.mode == "quiet":  # exactly one line, as promised: the result and where it is
            where = f" | run directory: {self.workdir}" if self.workdir is not None else ""
            self._write(line + where)
        elif self.mode != "json":
            self._write(line)
            for extra in val_lines(s) + seed_lines(s) + target_lines(s):
                self._write(extra)
            if self.workdir is not None:
                self._write(f"run directory: {self.workdir}")


def seed_lines(s: dict) -> list[str]:
    """The spread over seeds of a multi-seed summary (none for one seed)."""
    if "seeds" not in s:
        return []
    from jaxmnist import stats  # start-up: numpy, which `train --help` need not wait for

    spread = stats.spread(s["test_accuracy_per_seed"])
    pairs = list(zip(s["seeds"], s["test_accuracy_per_seed"]))
    per_seed = "  ".join(f"{seed}: {a:.2%}" for seed, a in pairs[:SEEDS_LISTED])
    if len(pairs) > SEEDS_LISTED:  # thousands of seeds made one unreadable line
        per_seed += f"  … and {len(pairs) - SEEDS_LISTED:,} more in summary.json"
    return [
        (
            f"test accuracy over {spread.n} seeds: {stats.format_spread(spread)}; "
            f"min {spread.min:.2%}, max {spread.max:.2%}"
        ),
        f"per seed  {per_seed}",
        *([ensemble_line(s)] if "ensemble_test_accuracy" in s else []),
    ]


def val_lines(s: dict) -> list[str]:
    """The validation split's figures of a summary (none without one)."""
    if "val_accuracy" not in s:
        return []
    line = (
        f"validation accuracy {s['val_accuracy']:.2%} ({s['num_val_examples']:,} held-out "
        f"training examples), validation loss {s['val_loss']:.4f}"
    )
    if "val_accuracy_per_seed" in s:
        from jaxmnist import stats  # start-up: numpy, which `train --help` need not wait for

        spread = stats.spread(s["val_accuracy_per_seed"])
        line += f"; over {spread.n} seeds: {stats.format_spread(spread)}"
    return [line]


def ensemble_line(s: dict) -> str:
    """The ensemble of a multi-seed summary: the mean of its members' probabilities."""
    line = (
        f"ensemble of {s['ensemble_members']} (the mean of their probabilities): test "
        f"accuracy {s['ensemble_test_accuracy']:.2%}, loss {s['ensemble_test_loss']:.4f}"
    )
    if "ensemble_val_accuracy" in s:  # the validation split (data.validation)
        line += (
            f"; validation accuracy {s['ensemble_val_accuracy']:.2%}, "
            f"loss {s['ensemble_val_loss']:.4f}"
        )
    return line


def target_lines(s: dict) -> list[str]:
    if "target_accuracy" not in s:
        return []
    of = target_of(s)
    if not s["target_reached"]:
        return [
            f"target {of} {s['target_accuracy']:.2%} NOT reached in {plural(s['epochs'], 'epoch')}"
        ]
    return [
        (
            f"target {of} {s['target_accuracy']:.2%} reached after epoch "
            f"{s['epochs_to_target']} of {s['epochs_planned']}: "
            f"{s['time_to_target_seconds']:.2f} s training, "
            f"{s['time_to_target_with_compile_seconds']:.2f} s with compile"
        )
    ]


def target_of(s: dict) -> str:
    """What a summary's target watched: `test accuracy`, `mean validation accuracy`, ..."""
    split = "validation" if s.get("target_split") == "val" else "test"
    return f"{'mean ' * ('seeds' in s)}{split} accuracy"


@contextlib.contextmanager
def stdout_for_json_only(on: bool):
    """With `on` (--json): yields a stream on the real stdout, and sends everything else
    written to stdout, by Python or by native code (a collective library's connection
    lines), to stderr while the block runs, so that stdout holds the JSON alone. Without
    `on`: yields sys.stdout and changes nothing."""
    entry = sys.stdout
    if not on:
        yield entry
        return
    try:
        on_fd_1 = entry.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a stream of its own (a test's capture)
        on_fd_1 = False
    entry.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(os.dup(saved), "w") if on_fd_1 else entry
    try:
        yield out
    finally:
        try:
            entry.flush()
            out.flush()
        finally:
            if out is not entry:
                out.close()
            os.dup2(saved, 1)
            os.close(saved)


def compile_detail(info: dict) -> str:
    """What the "compiled in" line adds from a run's `compile_programs` (each program's
    compile seconds): how many programs, and the slowest (where they compile at once,
    what the run waited for). Empty where none are known."""
    programs = info.get("compile_programs") or {}
    if not programs:
        return ""
    name, longest = max(programs.items(), key=lambda item: item[1])
    return f" ({plural(len(programs), 'program')}; longest {name} {longest:.2f} s)"


def duration(seconds: float) -> str:
    """e.g. "45 s", "12 min", "3.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plural(n: int, noun: str) -> str:
    """`1 epoch`, `3 epochs`."""
    return f"{n:,} {noun}{'s' * (n != 1)}"
