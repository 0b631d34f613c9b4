"""The four ways to run training steps, each built on the same `make_train_step`.

Every mode runs the same step (`jaxmnist.training.step.make_train_step`: uint8 images in,
scaled to [0, 1] and cast to the compute dtype inside, Adam or whatever the
config says) for the same model, optimizer and batch size; only how the steps
are driven differs:

- `python-dispatch`: the un-jitted step, dispatched op by op from Python (the
  codelab's eager row). The batch is gathered on the device by eager indexing.
- `jit-step-host`: one jitted call per batch, the batch gathered from a host
  permutation in NumPy and copied to the device every step by an explicit
  `jax.device_put` (the TPU 101 loop; it copies uint8 where the tutorial copies
  float32, because the same step is measured).
- `jit-step-device`: one jitted call per batch; the data sit on the device and
  the call gathers its batch from them by an index vector (the codelab's loop).
- `scan-epoch`: jaxmnist's compiled epoch: one call runs a window of steps in
  `lax.scan`, shuffling and gathering on the device.

A window is `steps` steps (`run`, timed). What a per-step loop needs before it
starts (a host permutation, or the device index vectors) is made in `prepare`,
outside the clock; `scan-epoch` shuffles inside its compiled call, so its
shuffle is timed: the comparison leans, if anything, against it. Jitted modes are
compiled ahead of time and their state is donated, as in training. The eager mode
cannot run under a host-to-device transfer guard: an un-jitted step uploads each
Python-scalar constant as it goes, which is part of what eager dispatch costs, so
its `guard` allows that direction only.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist.timing import Guard
from jaxmnist.training.step import (
    TrainData,
    TrainState,
    epoch_indices,
    make_train_epoch,
    make_train_step,
)

MODES = ("python-dispatch", "jit-step-host", "jit-step-device", "scan-epoch")


class HostData(NamedTuple):
    images: np.ndarray  # uint8 (N, H, W), host memory
    labels: np.ndarray  # int32 (N,), host memory


class Runner:
    """One mode driving `steps` training steps per window from `state`.

    `prepare(i)` (untimed) readies window i and returns arrays to wait for;
    `run()` enqueues one window and returns what to wait for; `losses(out)`
    turns a window's output into the host array of its per-step losses.
    """

    mode: str
    guard = Guard()

    def __init__(
        self,
        step,
        epoch_fn,
        state: TrainState,
        data: TrainData,
        host: HostData,
        batch_size: int,
        steps: int,
        seed: int,
    ):
        self.state, self.data, self.host = state, data, host
        self.batch_size, self.steps = batch_size, steps
        self.key = jax.random.key(seed)
        self.seed = seed
        self._setup()
        start = time.perf_counter()
        self._compile(step, epoch_fn)
        self.compile_seconds = time.perf_counter() - start

    def _setup(self) -> None:
        """What the loop needs besides the step (e.g. its index feeder): off the compile clock."""

    def _compile(self, step, epoch_fn) -> None: ...
    def prepare(self, window: int) -> Any: ...
    def run(self) -> Any: ...

    def losses(self, out) -> np.ndarray:
        return np.asarray(jax.device_get(out[1]), np.float32).reshape(-1)

    def _device_batches(self, window: int) -> list[jax.Array]:
        """This window's batches as a list of int32 (B,) index vectors on the device."""
        idx = self._indices(jax.random.fold_in(self.key, window))
        return list(idx)  # unstacked here, outside the clock


class PythonDispatch(Runner):
    mode = "python-dispatch"
    guard = Guard(host_to_device="allow")

    def _setup(self) -> None:
        self._indices = _compile_indices(self.data, self.batch_size, self.steps)
        first = self._indices(jax.random.fold_in(self.key, 2**20))[0]  # a key no window uses
        self._first = jax.block_until_ready(first)

    def _compile(self, step, epoch_fn) -> None:
        # Nothing is compiled as a whole; the first eager step (run here, so it
        # trains one step) compiles each primitive once, and that is its cost.
        self._step = step
        self.state, out = step(
            self.state, self.data.images[self._first], self.data.labels[self._first]
        )
        jax.block_until_ready((self.state, out))

    def prepare(self, window: int):
        self._batches = self._device_batches(window)
        return self._batches

    def run(self):
        losses = []
        for idx in self._batches:
            self.state, (loss, _) = self._step(
                self.state, self.data.images[idx], self.data.labels[idx]
            )
            losses.append(loss)
        return self.state, losses


class JitStepHost(Runner):
    mode = "jit-step-host"

    def _compile(self, step, epoch_fn) -> None:
        b, image_shape = self.batch_size, self.host.images.shape[1:]
        batch = (
            jax.ShapeDtypeStruct((b, *image_shape), jnp.uint8),
            jax.ShapeDtypeStruct((b,), jnp.int32),
        )
        self._step = jax.jit(step, donate_argnums=0).lower(self.state, *batch).compile()

    def prepare(self, window: int):
        rng = np.random.default_rng((self.seed, window))
        perm = rng.permutation(len(self.host.labels))
        self._rows = perm[: self.steps * self.batch_size].reshape(self.steps, self.batch_size)

    def run(self):
        losses = []
        for rows in self._rows:
            images, labels = jax.device_put((self.host.images[rows], self.host.labels[rows]))
            self.state, (loss, _) = self._step(self.state, images, labels)
            losses.append(loss)
        return self.state, losses


class JitStepDevice(Runner):
    mode = "jit-step-device"

    def _setup(self) -> None:
        self._indices = _compile_indices(self.data, self.batch_size, self.steps)

    def _compile(self, step, epoch_fn) -> None:
        def step_at(state, data: TrainData, idx):
            return step(state, data.images[idx], data.labels[idx])

        idx = jax.ShapeDtypeStruct((self.batch_size,), jnp.int32)
        self._step = jax.jit(step_at, donate_argnums=0).lower(self.state, self.data, idx).compile()

    def prepare(self, window: int):
        self._batches = self._device_batches(window)
        return self._batches

    def run(self):
        losses = []
        for idx in self._batches:
            self.state, (loss, _) = self._step(self.state, self.data, idx)
            losses.append(loss)
        return self.state, losses


class ScanEpoch(Runner):
    mode = "scan-epoch"

    def _compile(self, step, epoch_fn) -> None:
        self._epoch = (
            jax.jit(epoch_fn, donate_argnums=0).lower(self.state, self.key, self.data).compile()
        )

    def prepare(self, window: int):
        self._key = jax.random.fold_in(self.key, window)
        return self._key

    def run(self):
        self.state, metrics = self._epoch(self.state, self._key, self.data)
        return self.state, metrics.loss


def _compile_indices(data: TrainData, batch_size: int, steps: int):
    """The compiled `epoch_indices` for these sizes: key -> int32 (steps, batch_size)."""
    n = data.images.shape[0]
    fn = jax.jit(lambda key: epoch_indices(key, n, batch_size, steps).astype(jnp.int32))
    return fn.lower(jax.random.key(0)).compile()


RUNNERS = {r.mode: r for r in (PythonDispatch, JitStepHost, JitStepDevice, ScanEpoch)}


def build_runner(
    mode: str, cfg, optimizer, state: TrainState, data: TrainData, host: HostData, steps: int
) -> Runner:
    """Compiles `mode` for `cfg` (its batch size and compute dtype) and `steps` per window.

    `state` is consumed (jitted modes donate it). `steps * batch_size` must not
    exceed the number of training examples.
    """
    if mode not in RUNNERS:
        raise ValueError(f"unknown mode {mode!r}")  # options are validated before this
    n = data.images.shape[0]
    if not 1 <= steps * cfg.train.batch_size <= n:
        raise ValueError(f"{steps} steps of {cfg.train.batch_size} exceed {n} examples")
    step = make_train_step(cfg, optimizer)
    epoch_fn = make_train_epoch(cfg, optimizer, steps) if mode == "scan-epoch" else None
    return RUNNERS[mode](
        step, epoch_fn, state, data, host, cfg.train.batch_size, steps, cfg.train.seed
    )
