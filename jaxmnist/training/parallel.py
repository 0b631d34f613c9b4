"""Devices and processes: the mesh, where arrays live on it, and who may write.

A run's devices form a 2-D `jax.sharding.Mesh` with axes `members` (the models
of a population: seeds, sweep points) and `data` (the global batch). Arrays are
placed once, described by a `NamedSharding`:

    training set     replicated: every device gathers its own part of each batch
    state, keys      split over `members` (replicated over `data`)
    a batch          split over `data` (the constraint `shard_batch` applies)
    evaluation set   batches split over `data`
    metrics          replicated, so every process can read them

With data parallelism the gradient mean over the `data` axis is inserted by the
compiler (GSPMD) from these shardings; nothing here communicates by hand.

Several processes (hosts) join through `jax.distributed` (its coordination
service; on Cloud TPU, SLURM, Open MPI and Kubernetes it finds the cluster by
itself). Every process runs the same program; global arrays are assembled from
what each process holds (`jax.make_array_from_callback`: every process has the
whole host array and hands over the slices of its own devices). Only process 0
writes files and prints. This module is the only one that asks for devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import sys
import threading

import jax
import numpy as np
from jax._src import distributed as jax_distributed
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmnist.errors import ConfigError
from jaxmnist.mesh import AXES, parse_devices, parse_mesh


def open_devices_ahead(coordinator: str | None, auto: bool = False) -> None:
    """Starts JAX's backend on a daemon thread, for a process that joins no other: an
    accelerator's runtime takes seconds to open (a TPU's, most of it outside the GIL),
    which the command's imports and data reading then fill. Whoever asks for devices
    next waits for it (JAX starts its backends under a lock) and gets any error itself.
    A multi-process run opens nothing before `initialize_distributed`."""
    if coordinator is not None or auto:
        return

    def start() -> None:
        with contextlib.suppress(Exception):  # raised again where the devices are asked for
            jax.devices()

    threading.Thread(target=start, name="jaxmnist-open-devices", daemon=True).start()


def initialize_distributed(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    *,
    auto: bool = False,
    timeout_seconds: int = 60,
) -> None:
    """Joins a multi-process run (call before anything else touches JAX).

    With a coordinator `HOST:PORT`, the process count and this process's id are
    required; with `auto`, `jax.distributed.initialize()` detects the cluster.
    Process 0's coordinator listens on HOST only (not on every interface), unless
    JAX_COORDINATOR_BIND_ADDRESS says otherwise. A peer that is not there within
    `timeout_seconds` makes the others fail instead of hang, with one line and
    exit 1 (a watchdog here). A peer that stops sending heartbeats for
    `timeout_seconds` during the run ends the others through the coordination
    service, which aborts them in C++ (jaxlib's `missed_heartbeat_callback` cannot
    be a Python function: handing it the status throws std::bad_cast). A second
    process 0 is refused before it starts a coordinator; processes that disagree
    on --num-processes stop with a ConfigError once they have joined.
    """
    if coordinator is None and not auto:
        return
    # CPU devices of different processes talk through gloo (GPUs and TPUs bring their
    # own collectives; the setting only concerns the CPU backend). Asking for the
    # backend first would start it, which must not happen before initialize().
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {
        "initialization_timeout": timeout_seconds + 10,  # the watchdog below speaks first
        "heartbeat_timeout_seconds": timeout_seconds,
    }
    if coordinator is not None:
        kwargs.update(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
        if process_id == 0 and not os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
            # jax's default is [::]:PORT, every interface: listen where the user said.
            kwargs["coordinator_bind_address"] = coordinator
            _check_port_free(coordinator)
    where = f" at {coordinator}" if coordinator else ""
    peers = f"the {num_processes} processes" if num_processes else "the processes"
    message = (
        f"jaxmnist: error: {peers} did not all join the distributed run{where} within "
        f"{timeout_seconds} s (is every process started, with the same --coordinator "
        f"and --num-processes, and a --process-id of its own?)\n"
    )
    watchdog = threading.Timer(timeout_seconds, _give_up, args=(message,))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as e:  # noqa: BLE001 -- the coordination service's errors vary by cause
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"could not join the distributed run{where}: {first}") from None
    finally:
        watchdog.cancel()
    if num_processes is not None:
        _check_same_process_count(num_processes, process_id, timeout_seconds)
    if jax.process_index() != 0:
        # Only process 0 speaks; gloo's C++ start-up lines ("[Gloo] Rank 1 is connected
        # to ...") reach stdout below Python, so the descriptor itself goes quiet.
        # Errors and the stop line go to stderr, which stays.
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


def _give_up(message: str) -> None:
    sys.stderr.write(message)
    sys.stderr.flush()
    os._exit(1)


def _check_port_free(coordinator: str) -> None:
    """ConfigError when process 0's port is taken. gRPC binds with SO_REUSEPORT, so a
    second process 0 (or any program doing the same) would share the port silently and
    the two coordinators would each get part of the connections; a plain bind sees it."""
    host, _, port = coordinator.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # A port left in TIME_WAIT by a run that just ended is free to listen on
            # (gRPC can), and a listener is still seen: the restart after a crash works.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except socket.gaierror as e:
        raise ConfigError(f"--coordinator {coordinator}: unknown host ({e.strerror})") from None
    except OSError as e:
        raise ConfigError(
            f"--coordinator {coordinator}: cannot listen there ({e.strerror}); is another "
            f"process already started with --process-id 0, or another program on port {port}?"
        ) from None


def _check_same_process_count(num_processes: int, process_id: int, timeout_seconds: int) -> None:
    """ConfigError on every process when they were started with different
    --num-processes (process 0's count rules the coordinator, so the others would
    otherwise run along with a count of their own). Each publishes its count in the
    coordinator's key-value store; process 0 reads every other's, the others read 0's."""
    # jax has no public key-value store: its distributed client is internal. Where a
    # jax release moves it, the count the coordinator holds is the check left.
    client = getattr(getattr(jax_distributed, "global_state", None), "client", None)
    if client is None:
        if jax.process_count() != num_processes:
            raise ConfigError(
                f"this process was started with --num-processes {num_processes}, but the "
                f"run's coordinator counts {jax.process_count()}"
            )
        return
    client.key_value_set(f"jaxmnist/num_processes/{process_id}", str(num_processes))
    others = range(1, num_processes) if process_id == 0 else [0]
    for other in others:
        theirs = int(
            client.blocking_key_value_get(f"jaxmnist/num_processes/{other}", timeout_seconds * 1000)
        )
        if theirs != num_processes:
            raise ConfigError(
                f"the processes disagree on --num-processes: process {process_id} was "
                f"started with {num_processes}, process {other} with {theirs}"
            )


def check_process_args(coordinator, num_processes, process_id) -> None:
    """ConfigError (exit 2) for an incomplete or inconsistent set of process flags."""
    given = [x is not None for x in (coordinator, num_processes, process_id)]
    if any(given) and not all(given):
        raise ConfigError(
            "--coordinator, --num-processes and --process-id go together "
            "(or give none of them, on a cluster jax.distributed detects by itself)"
        )
    if num_processes is not None:
        if num_processes < 1:
            raise ConfigError(f"--num-processes must be at least 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ConfigError(
                f"--process-id must be in 0..{num_processes - 1} for {num_processes} processes, "
                f"got {process_id}"
            )
    if coordinator is not None:
        host, sep, port = coordinator.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--coordinator must be HOST:PORT, got {coordinator!r}")


@dataclasses.dataclass(frozen=True)
class Layout:
    """A run's mesh and the shardings of everything placed on it."""

    mesh: Mesh

    @property
    def members(self) -> int:
        return self.mesh.shape["members"]

    @property
    def data(self) -> int:
        return self.mesh.shape["data"]

    @property
    def size(self) -> int:
        return self.mesh.size

    def sharding(self, *spec) -> NamedSharding:
        return NamedSharding(self.mesh, P(*spec))

    @property
    def replicated(self) -> NamedSharding:
        return self.sharding()

    @property
    def by_member(self) -> NamedSharding:
        """Leading axis split over `members`."""
        return self.sharding("members")

    @property
    def batch(self) -> NamedSharding:
        """A batch's leading axis split over `data` (inside a members-vmapped program
        `vmap(..., spmd_axis_name="members")` adds the member axis)."""
        return self.sharding("data")

    @property
    def eval_batches(self) -> NamedSharding:
        """(num_batches, batch, ...): each batch split over `data`."""
        return self.sharding(None, "data")

    def shard_batch(self, x: jax.Array) -> jax.Array:
        """The constraint `step.make_train_epoch` puts on each batch."""
        if self.data == 1:
            return x
        return jax.lax.with_sharding_constraint(x, self.batch)

    def put(self, array, sharding: NamedSharding) -> jax.Array:
        """A global array from a host array every process holds in full."""
        array = np.asarray(array)
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    def describe(self) -> dict:
        return {
            "mesh": {name: int(size) for name, size in self.mesh.shape.items()},
            "devices": [str(d) for d in self.mesh.devices.flat],
            "processes": jax.process_count(),
        }


def build_layout(
    devices: int | None = None, mesh: dict[str, int] | None = None, *, num_models: int = 1
) -> Layout:
    """The mesh for `devices` (None: all) or an explicit `mesh` {members, data}.

    Without an explicit mesh, several models take the `members` axis (as many
    devices as divide the model count) and one model the `data` axis. Raises
    ConfigError, one line, when the request does not fit the devices there are.
    """
    available = jax.devices()
    if mesh is not None:
        count = mesh["members"] * mesh["data"]
        if devices is not None and devices != count:
            raise ConfigError(
                f"--mesh members={mesh['members']},data={mesh['data']} uses {count} devices "
                f"but --devices says {devices}"
            )
        shape = (mesh["members"], mesh["data"])
    else:
        count = len(available) if devices is None else devices
        if num_models > 1:
            members = math.gcd(count, num_models)
            shape = (members, count // members)
        else:
            shape = (1, count)
    if count > len(available):
        kind = available[0].platform
        raise ConfigError(
            f"{count} devices asked for, but only {len(available)} {kind} device(s) exist "
            f"(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N fakes more)"
        )
    if jax.process_count() > 1 and count != len(available):
        raise ConfigError(
            f"a multi-process run uses every device of every process ({len(available)}); "
            f"got {count}"
        )
    grid = np.array(available[:count]).reshape(shape)
    return Layout(Mesh(grid, AXES))


def check_layout(layout: Layout, *, num_models: int, batch_size: int) -> None:
    """ConfigError unless the population and the batch divide over the mesh."""
    if num_models % layout.members:
        raise ConfigError(
            f"{num_models} model(s) do not split over a members axis of {layout.members} devices; "
            f"use a multiple of {layout.members} seeds or points, or --mesh members=1"
        )
    if batch_size % layout.data:
        raise ConfigError(
            f"batch size {batch_size} is not divisible by the data axis ({layout.data} devices); "
            f"use a multiple of {layout.data}"
        )


def layout_for(where, *, num_models: int, batch_size: int) -> Layout:
    """The mesh a config's `parallel` section (`where`: config.ParallelConfig) asks for,
    checked for `num_models` models and the batch size: a ConfigError, one line, when it
    cannot be had. The section alone: where a run happens is all this module reads."""
    mesh = parse_mesh(where.mesh)
    if where.devices is None:  # one device, unless a mesh names more
        devices = mesh["members"] * mesh["data"] if mesh else 1
    else:
        devices = parse_devices(where.devices)
    layout = build_layout(devices, mesh, num_models=num_models)
    check_layout(layout, num_models=num_models, batch_size=batch_size)
    return layout


def is_main_process() -> bool:
    """Only process 0 writes the run directory, the report and the terminal table."""
    return jax.process_index() == 0


def default_device():
    """The device a single-device computation (export, predict, reports) runs on."""
    return jax.local_devices()[0]


def agree(seconds: float, stop: bool) -> tuple[float, bool]:
    """What every process of a run does next: the longest time `seconds` any measured
    for the last call (the pacing of the next), and whether any was asked to stop.
    Each process times its calls by its own clock and gets its own signals, but they
    run one program together: a process that ran further, or stopped alone, would
    hang the others. One process: the values."""
    if jax.process_count() == 1:
        return seconds, stop
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.array([seconds, stop], np.float32))
    votes = np.asarray(votes).reshape(-1, 2)
    return float(votes[:, 0].max()), bool(votes[:, 1].any())
