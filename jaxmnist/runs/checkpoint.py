"""Checkpoints of a run, with Orbax: saving as the run goes, and restoring the newest valid one.

`RUN_DIR/checkpoints/<step>/` holds, per checkpoint (at the end of an epoch, or
inside one: every `--checkpoint-every-steps` steps, or where a stop was asked for):

    state          the whole TrainState of every member (step, parameters,
                   optimizer state), the members concatenated along their leading
                   axis, whatever memory chunks the machine that wrote it used
    epoch_metrics  inside an epoch only: that epoch's accumulators so far (each
                   step's loss, the count of right answers), members concatenated
    progress       JSON: epochs done, step, steps done in the epoch under way and
                   their seconds, every metrics.jsonl record so far, the train
                   seconds, and fingerprints of `state` and `epoch_metrics`

The random keys need no saving: every member's epoch keys are derived from its
seed and the epoch index (`population.member_keys`), and the epoch's plan from
its key, so the data order continues by itself, mid-epoch too. Orbax writes each
checkpoint to a temporary directory and renames it when complete,
asynchronously: `save` returns once the arrays are copied to the host, and the
next call (which donates the state's buffers) runs while the files are written.
A checkpoint that is there but damaged (a file removed or garbled) is caught on
restore, by Orbax or by the fingerprint (a position-weighted sum of the raw
bits: any change to one array element changes it), and skipped with a warning
for the newest earlier one. A save cut short (the process killed mid-write)
leaves its temporary `<step>.orbax-checkpoint-tmp…` folder, never read back: the
run that goes on removes it (`remove_unfinished`).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import shutil
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist.errors import JaxmnistError, WriteError
from jaxmnist.runs.rundir import CHECKPOINT_DIR
from jaxmnist.training.hooks import Callback, RunStart

LARGE_BYTES = 256 * 2**20  # a state this large takes seconds to write
TMP_MARK = ".orbax-checkpoint-tmp"  # in the name of the folder a save is still writing


class CheckpointOptions(NamedTuple):
    every: int = 1  # epochs between checkpoints (the last epoch and a stop always save)
    keep: int = 3  # newest checkpoints kept
    every_steps: int = 0  # also every this many steps, inside epochs; 0: never


class Restored(NamedTuple):
    """A checkpoint read back: every member's state (member axis first) and its progress."""

    step: int
    epoch: int  # epochs done
    state: object  # a TrainState with every member, on the target's shardings
    progress: dict  # the `progress` JSON item
    metrics: object = None  # inside an epoch: its step.EpochMetrics, every member


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def _manager(
    path: Path, keep: int | None = None, read_only: bool = False, asynchronous: bool = False
):
    import orbax.checkpoint as ocp

    # Orbax logs routine notices (read-only options, directory creation) as absl
    # warnings, and a failed write as several multi-line absl errors from its
    # threads; the terminal is the run's: a failed write reaches it as one line
    # (`_write_error`), so only what is critical still goes there.
    logging.getLogger("absl").setLevel(logging.CRITICAL)

    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=asynchronous, read_only=read_only
    )
    return ocp.CheckpointManager(path.absolute(), options=options)


def _as_uint32(x, xp):
    """The raw bits of `x` as a flat uint32 vector, one per element (`xp`: jnp or np).
    jaxmnist runs without 64-bit types, so every element fits."""
    size = x.dtype.itemsize
    if x.dtype == xp.bool_:
        return x.astype(xp.uint32).reshape(-1)
    unsigned = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32}[size]
    bits = jax.lax.bitcast_convert_type(x, unsigned) if xp is jnp else x.view(unsigned)
    return bits.astype(xp.uint32).reshape(-1)


def _leaf_fingerprint(x, xp):
    bits = _as_uint32(x, xp)
    weights = 2 * xp.arange(bits.size, dtype=xp.uint32) + 1  # odd: invertible mod 2**32
    return xp.sum(bits * weights, dtype=xp.uint32)  # wraps mod 2**32, in any order


@jax.jit
def _device_fingerprint(tree) -> list:
    return [_leaf_fingerprint(jnp.asarray(x), jnp) for x in jax.tree.leaves(tree)]


def fingerprint(tree) -> list[int]:
    """One uint32 per leaf of `tree`: device arrays (sharded or not, on any mesh) or host
    arrays, the same figure for the same values."""
    leaves = jax.tree.leaves(tree)
    if all(isinstance(x, np.ndarray) for x in leaves):
        with np.errstate(over="ignore"):
            return [int(_leaf_fingerprint(x, np)) for x in leaves]
    return [int(v) for v in jax.device_get(_device_fingerprint(tree))]


def host_members(states: list):
    """Every member's state on the host (numpy copies), concatenated along the member axis."""
    parts = jax.device_get(states)
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def gather_members(states: list, layout):
    """One TrainState with every member, from the per-chunk states (member axis first)."""
    if len(states) == 1:
        return states[0]
    join = jax.jit(
        lambda parts: jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts),
        out_shardings=layout.by_member,
    )
    return join(states)


def split_members(state, population) -> list:
    """The per-chunk states of `population` from one state holding every member."""
    if len(population.chunks) == 1:
        return [state]
    return [
        jax.jit(
            lambda t, s=s: jax.tree.map(lambda x: x[s], t),
            out_shardings=population.layout.by_member,
        )(state)
        for s in population.slices
    ]


def abstract_state(shapes, members: int, sharding):
    """The restore target: one member's state `shapes` (e.g. `Population.state_shapes()`)
    stacked `members` times, placed by `sharding` (nothing allocated)."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((members, *x.shape), x.dtype, sharding=sharding), shapes
    )


class Checkpointer(Callback):
    """A run-loop callback: saves the state after every `every`-th epoch and the last.

    A resumed run's earlier epochs (their metrics.jsonl records, saved with every
    checkpoint) come from `on_start`. A stop (`EpochEnd.stopping`,
    `StepsEnd.stopping`) always saves, where it happens. Call `close()` at the end:
    it waits for the last write.

    In one process the state is copied to the host (the next epoch donates its
    device buffers) and a worker thread does the rest: fingerprint, Orbax's
    write and commit, so the loop only waits for the copy. With several
    processes (arrays no process holds whole) Orbax's own asynchronous save
    does the copying, collectively.
    """

    def __init__(self, run_dir, options: CheckpointOptions):
        self.options = options
        _quiet_abandoned_writes()  # before any write: a failing one echoes from its threads
        self.records: list = []
        self.path = checkpoint_dir(run_dir)
        self.threaded = jax.process_count() == 1
        # Made at the first save, which creates the folder: a run refused before it
        # started leaves none, and a new run's writer may first remove an old run's.
        self.manager = None
        self.pool = None
        if self.threaded:
            self.pool = ThreadPoolExecutor(1, "jaxmnist-checkpoint", initializer=_yield_cpu)
        self.pending: Future | None = None
        if self.pool is not None:  # Orbax loads on the writer's thread as the run sets up
            self.pending = self.pool.submit(importlib.import_module, "orbax.checkpoint")
        self.last_epoch = -1  # the plan's last epoch, known at `on_start`

    def on_start(self, start: RunStart) -> None:
        self.last_epoch = start.info["epochs"]
        # No save of this run is under way yet (the first comes after an epoch or a
        # stop), and the run directory's lock keeps other runs out: what is there is
        # an interrupted run's. Process 0 only: the others share the folder.
        if jax.process_index() == 0:
            remove_unfinished(self.path)
        self.records = list(start.progress.records)  # a resumed run's epochs before the restart

    def on_epoch_end(self, end) -> None:
        self.records.append(end.record)
        wanted = end.epoch % self.options.every == 0 or end.epoch == self.last_epoch
        if wanted or end.stopping:
            progress = {"epoch": end.epoch, "step": end.step, "epoch_step": 0}
            self.save(end.step, end.states, None, end.population, progress, end.stopping)

    def on_steps(self, end) -> None:
        every = self.options.every_steps
        if not (end.stopping or (every and end.step % every == 0)):
            return
        progress = {
            "epoch": end.epoch - 1,
            "step": end.step,
            "epoch_step": end.epoch_step,
            "epoch_seconds": end.epoch_seconds,
        }
        self.save(end.step, end.states, end.metrics, end.population, progress, end.stopping)

    def save(
        self, step: int, states: list, metrics, population, progress: dict, stopping=False
    ) -> None:
        """Saves every member's state (and, inside an epoch, its accumulators `metrics`)
        with `progress`; `states` and `metrics` are per memory chunk. `stopping`: the
        run ends after this save."""
        size = sum(x.nbytes for x in jax.tree.leaves(states))
        if stopping and size >= LARGE_BYTES:
            # The stop waits for this write: say why the terminal goes quiet.
            print(
                f"jaxmnist: writing a {size / 2**30:.1f} GB checkpoint before stopping",
                file=sys.stderr,
                flush=True,
            )
        progress = {
            **progress,
            "records": list(self.records),
            "train_seconds": float(sum(r["epoch_seconds"] for r in self.records))
            + progress.get("epoch_seconds", 0.0),
            "members": len(population),
        }
        if metrics is not None and not _all_finite([m.loss for m in metrics]):
            return  # the run loop stops on it at the epoch's end: a bad state is never saved
        if not self.threaded:
            state = gather_members(states, population.layout)
            partial = metrics and gather_members(metrics, population.layout)
            try:
                self._write(step, state, partial, progress)
            except Exception as e:  # noqa: BLE001 -- Orbax and TensorStore raise many kinds
                raise _write_error(self.path, e) from None
            return
        state = host_members(states)
        partial = metrics and host_members(metrics)
        self._wait()  # at most one write in flight: a slow disk holds the loop, not memory
        self.pending = self.pool.submit(self._write, step, state, partial, progress)

    def _write(self, step: int, state, metrics, progress: dict) -> None:
        import orbax.checkpoint as ocp

        if self.manager is None:  # the first save, in every process at once (it is collective)
            keep, asynchronous = self.options.keep, not self.threaded
            self.manager = _manager(self.path, keep=keep, asynchronous=asynchronous)
        progress["fingerprint"] = fingerprint(state)
        items = {"state": ocp.args.StandardSave(state)}
        if metrics is not None:
            progress["metrics_fingerprint"] = fingerprint(metrics)
            items["epoch_metrics"] = ocp.args.StandardSave(metrics)
        items["progress"] = ocp.args.JsonSave(progress)
        self.manager.save(step, args=ocp.args.Composite(**items))

    def _wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                pending.result()
            except Exception as e:  # noqa: BLE001 -- Orbax and TensorStore raise many kinds
                raise _write_error(self.path, e) from None

    def close(self) -> None:
        try:
            self._wait()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            try:
                if self.manager is not None:  # None: nothing was saved
                    self.manager.wait_until_finished()
            except Exception as e:  # noqa: BLE001 -- an earlier failed save, reported above
                if sys.exc_info()[0] is None:
                    raise _write_error(self.path, e) from None
            finally:
                if self.manager is not None:
                    self.manager.close()


def remove_unfinished(path: Path) -> list[Path]:
    """Removes, from the checkpoints folder `path`, the temporary folders of saves that
    never completed; returns them. Call it only when no save into `path` is running."""
    if not path.is_dir():
        return []
    left = sorted(p for p in path.iterdir() if TMP_MARK in p.name)
    for p in left:
        # One that cannot be removed does no harm where it is: Orbax never reads it.
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass
    return left


def _yield_cpu() -> None:
    """Lowers the writer thread's CPU priority (Linux: per thread), and so that of the
    threads Orbax and TensorStore start from it: on a machine with few cores the
    write then takes the cycles training leaves, instead of slowing the next epoch."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: write at normal priority
        pass


def _all_finite(arrays: list) -> bool:
    """Whether every element of these (sharded) device arrays is finite, in every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        arrays = [multihost_utils.process_allgather(x, tiled=True) for x in arrays]
    return all(np.isfinite(np.asarray(jax.device_get(x))).all() for x in arrays)


def _write_error(path: Path, e: BaseException) -> WriteError:
    """One line for a checkpoint that could not be written (Orbax reports a full disk
    as a RESOURCE_EXHAUSTED ValueError, not an OSError)."""
    import errno

    if isinstance(e, OSError):
        return WriteError.from_os_error(e, path)
    text = str(e)
    if "No space left" in text or "os_error_code='28'" in text:
        return WriteError.from_os_error(OSError(errno.ENOSPC, "No space left on device"), path)
    return WriteError(f"cannot write a checkpoint in {path}: {_reason(e)}")


def _quiet_abandoned_writes() -> None:
    """After a failed save or restore, Orbax's other in-flight TensorStore writes or
    reads still finish and call back into the event loop the failed call already
    closed; Python reports each as an unraisable "Event loop is closed" traceback on
    stderr, and asyncio logs each of Orbax's tasks that failed the same way, unawaited,
    as "Task exception was never retrieved" when it is collected. The failure is
    reported in one line (`_write_error`, the damaged-checkpoint warning): those echoes
    of it are dropped, and every other unraisable exception and asyncio record still
    goes where it went."""
    asyncio_log = logging.getLogger("asyncio")
    if _orbax_task_echo not in asyncio_log.filters:
        asyncio_log.addFilter(_orbax_task_echo)
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        previous(unraisable)

    if getattr(previous, "__name__", "") != "hook":
        sys.unraisablehook = hook


def _orbax_task_echo(record: logging.LogRecord) -> bool:
    """False (drop it) for asyncio's record of an Orbax task whose exception was never
    retrieved (`_quiet_abandoned_writes`)."""
    text = record.getMessage()
    return not (text.startswith("Task exception was never retrieved") and "/orbax/" in text)


def _warn(message: str) -> None:
    print(f"jaxmnist: warning: {message}", file=sys.stderr, flush=True)


def _reason(e: BaseException, width: int = 120) -> str:
    """`e` in a few words for a one-line message: TensorStore appends its whole spec
    and nests one cause in another ("opening X: reading Y: decoding Z: ..."), and
    some errors carry object reprs; the innermost causes are what says what is wrong,
    so the tail is kept, whole `: `-separated parts only (no path cut in two)."""
    text = str(e).strip()
    text = re.sub(r"\s*\[tensorstore_spec.*", "", text, flags=re.DOTALL)
    text = re.sub(r"\s*<[^<>]*>", "", text)
    lines = text.splitlines()
    text = lines[0].strip() if lines else ""
    if not text:
        return type(e).__name__
    parts = text.split(": ")
    kept = parts.pop()
    while parts and len(parts[-1]) + 2 + len(kept) <= width:
        kept = f"{parts.pop()}: {kept}"
    return kept if len(kept) <= width else kept[: width - 1] + "…"


def checkpoint_steps(run_dir) -> list[int]:
    """Steps of the complete (committed) checkpoints in `run_dir`, oldest first."""
    path = checkpoint_dir(run_dir)
    if not path.is_dir():
        return []
    manager = _manager(path, read_only=True)
    try:
        return sorted(manager.all_steps())
    finally:
        manager.close()


def restore_newest(run_dir, target, warn=_warn, metrics_target=None) -> Restored | None:
    """The newest checkpoint of `run_dir` that reads back intact, onto `target`'s shardings
    (see `abstract_state`: any mesh, whatever the one that wrote it). With
    `metrics_target` (the epoch accumulators' abstract arrays), a checkpoint taken
    inside an epoch brings its accumulators back too.

    None when there is no checkpoint at all; a damaged one is skipped with
    `warn(line)` naming it; JaxmnistError (exit 1) when none is intact.
    """
    import orbax.checkpoint as ocp

    path = checkpoint_dir(run_dir)
    steps = checkpoint_steps(run_dir)
    if not steps:
        return None
    members = jax.tree.leaves(target)[0].shape[0]
    _quiet_abandoned_writes()  # a damaged one fails while its other reads are in flight
    manager = _manager(path, read_only=True)
    try:
        for step in reversed(steps):
            where = path / str(step)
            partial = metrics_target is not None and (where / "epoch_metrics").exists()
            items = {"state": ocp.args.StandardRestore(target), "progress": ocp.args.JsonRestore()}
            if partial:
                items["epoch_metrics"] = ocp.args.StandardRestore(metrics_target)
            try:
                got = manager.restore(step, args=ocp.args.Composite(**items))
                progress = dict(got.progress)
                if progress.get("members") != members:
                    raise ValueError(f"holds {progress.get('members')} models, not {members}")
                if fingerprint(got.state) != progress["fingerprint"]:
                    raise ValueError("its arrays do not match the fingerprint saved with them")
                inside = progress.get("epoch_step", 0) > 0
                if metrics_target is not None and inside and not partial:
                    raise ValueError("it was taken inside an epoch but its metrics are missing")
                if partial and fingerprint(got.epoch_metrics) != progress.get(
                    "metrics_fingerprint"
                ):
                    raise ValueError("its metrics do not match the fingerprint saved with them")
            except Exception as e:  # noqa: BLE001 -- Orbax and TensorStore raise many kinds
                older = "an earlier one" if step != steps[0] else "nothing earlier"
                warn(f"checkpoint {where} is damaged ({_reason(e)}); trying {older}")
                continue
            metrics = got.epoch_metrics if partial else None
            return Restored(step, int(progress["epoch"]), got.state, progress, metrics)
    finally:
        manager.close()
    raise JaxmnistError(f"{path}: no intact checkpoint (all {len(steps)} are damaged)")
