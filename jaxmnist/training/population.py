"""Many models in one program: members, their keys, and the programs over `step`.

A population is the set of models a run trains together. Each member has a seed
and the optimizer hyperparameters that do not change any array's shape
(learning rate, weight decay, momentum). A run of one model is a population of
one. States always carry a leading member axis; the one place that differs is
`_lift`: a program over one member squeezes that axis away and runs the plain
single-model function (so the single-device path compiles exactly as the pure
epoch does), a program over several runs the same function under `jax.vmap`,
with the member axis split over the mesh's `members` axis. Hyperparameters live
in the optimizer state as traced arrays (`optim.set_hyperparams`), one per
member. Members are cut into chunks that fit in device memory
(`jaxmnist.training.memory`); the chunks run one after another inside each epoch.

Three programs train: `plan_epoch` draws every member's epoch plan once,
`new_metrics` makes the epoch's empty accumulators, and `train_steps` runs
any range of an epoch's steps (its bounds are traced, so it compiles once for
every range). The run loop chooses the ranges. A chunk's programs are lowered one
after another, the slowest first, and off the CPU each compiles on a thread as soon
as it is lowered (`Compiles`: the compiles are independent), so a run waits for its
slowest program rather than for the sum of them.

On a TPU, the plan is drawn on the host's CPU and copied to the mesh, the next
epoch's while this one trains: a TPU compiles a sort of a training set's size
for many seconds (most of a run's compile time), the host compiles and runs
it in milliseconds, and the plan is the same on either (`shuffle`). The next
epoch's plan is drawn there and copied to the mesh on a thread of its own while this
epoch trains. A population that stages its batches (`staged`, chosen by
`memory.stages_batches`) draws each plan with every step's images gathered in order
where the plan is drawn (`step.make_epoch_plan`): on a TPU, the host's CPU gathers them
and the steps' program only indexes them, which keeps the gather, much of that
program's compile there, out of it. The initial states are made there too (their
program, random draws, compiles in seconds on a TPU) and copied to the mesh.

On a TPU, too, a population of several models that augments its data augments each
epoch's batches ahead (`augment_ahead`, chosen by `augments_ahead`): as an epoch starts,
a program of its own makes every step's batch, gathered and augmented
(`step.make_augmented_batches`: the same batches), and the steps' program only indexes
them. The augmentation is a large part of the steps' compile there (the slowest program,
which a run waits for), and its own program compiles beside it; the augmented epoch is
held on the mesh while it trains (uint8: a fraction of a model's activations).

A member's random keys do not depend on its company: seed s gives
`init_key, shuffle_key = split(key(s))` and epoch keys `split(shuffle_key,
epochs)`, exactly as a single run does, so a seed trained in a group follows
the same trajectory as that seed trained alone (up to float summation order).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from typing import NamedTuple, Self

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist import optim
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training.hooks import Evaluation
from jaxmnist.training.step import (
    EpochMetrics,
    EpochPlan,
    TrainData,
    empty_metrics,
    init_state,
    make_augmented_batches,
    make_epoch_plan,
    make_train_steps,
    model_params,
)

HYPERPARAMS = ("lr", "weight_decay", "momentum")  # OptimizerConfig fields held as traced arrays
# Config fields that vary between members of one program (everything else shapes it).
TRACED_FIELDS = ("train.seed", *(f"optimizer.{h}" for h in HYPERPARAMS))


@dataclasses.dataclass(frozen=True)
class Member:
    seed: int
    lr: float
    weight_decay: float
    momentum: float

    @classmethod
    def of(cls, cfg, seed: int | None = None) -> Member:
        o = cfg.optimizer
        return cls(cfg.train.seed if seed is None else seed, o.lr, o.weight_decay, o.momentum)


def seed_members(cfg) -> tuple[Member, ...]:
    """`train.seeds` members with seeds train.seed ... train.seed + seeds - 1."""
    return tuple(Member.of(cfg, cfg.train.seed + i) for i in range(cfg.train.seeds))


def member_keys(seed: int, num_epochs: int):
    """(init_key, epoch_keys (num_epochs,)): the keys of a single run with this seed."""
    init_key, shuffle_key = jax.random.split(jax.random.key(seed))
    return init_key, jax.random.split(shuffle_key, num_epochs)


# Seeds per call of the program that makes a population's keys: one program serves every
# population up to this size (a search's batches of any size compile nothing more).
KEY_BLOCK = 1024


def plan_device(backend: str | None = None) -> jax.Device | None:
    """The device epoch plans are drawn on when it is not the mesh's: the host's CPU
    where the backend is a TPU (module doc) and JAX has its CPU backend too; else None."""
    if (backend or jax.default_backend()) != "tpu":
        return None
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu
        return None


def _in_background(fn, *args) -> Future:
    """`fn(*args)` on a daemon thread of its own; its result (or error) in the Future."""
    future: Future = Future()

    def run():
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 -- handed to whoever waits for it
            future.set_exception(e)

    threading.Thread(target=run, name="jaxmnist-next-plan", daemon=True).start()
    return future


def augments_ahead(cfg, platform: str, models: int) -> bool:
    """Whether a population of `models` of `cfg` on `platform` augments each epoch's
    batches ahead, in a program of their own (module doc): on a TPU, where the data are
    augmented, for several models (one model's steps compiled no sooner without the
    augmentation there, and its epochs were slower: docs/tpu-gpu.md)."""
    return platform == "tpu" and cfg.data.augment and models > 1


def compile_workers(platform: str) -> int:
    """How many programs compile at once for `platform`: one on a CPU, where XLA's
    compiles already share the cores with each other's threads (no faster at once on
    two cores, and more memory: docs/tpu-gpu.md), else up to 4 (on a TPU host, 4 at
    once were quicker than one by one or than one per core)."""
    return 1 if platform == "cpu" else min(os.cpu_count() or 1, 4)


class Compiles:
    """Compiles programs as they are lowered: each `add`ed `jax.stages.Lowered` starts
    compiling at once on one of `workers` threads (with one worker, in the caller's
    thread), so the slowest program compiles while the others are still being lowered.
    `results()` waits for every compile and returns (name -> Compiled, name -> seconds
    its compile took); the first error a compile raised is raised there, after every
    compile has ended. Use it as a context manager: leaving it (an error while lowering
    too) waits for the compiles already started."""

    def __init__(self, workers: int = 1):
        self.pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="jaxmnist-compile")
            if workers > 1
            else None
        )
        self.futures: dict[str, Future] = {}

    def add(self, name: str, lowered) -> None:
        if self.pool is None:
            future: Future = Future()
            future.set_result(_timed_compile(lowered))  # one by one: an error raises here
        else:
            future = self.pool.submit(_timed_compile, lowered)
        self.futures[name] = future

    def results(self) -> tuple[dict, dict]:
        wait(self.futures.values())
        done = {name: f.result() for name, f in self.futures.items()}
        return {n: c for n, (c, _) in done.items()}, {n: t for n, (_, t) in done.items()}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _timed_compile(lowered) -> tuple:
    start = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - start


def compile_all(lowered: dict, workers: int = 1) -> tuple[dict, dict]:
    """Compiles every `jax.stages.Lowered` of `lowered` (name -> Lowered), `workers` at
    once (`Compiles`); returns (name -> Compiled, name -> seconds its compile took)."""
    with Compiles(workers) as compiles:
        for name, low in lowered.items():
            compiles.add(name, low)
        return compiles.results()


def population_keys(seeds, num_epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """The raw key data of `member_keys` for every seed, (N, ...) and (N, num_epochs, ...).
    Each seed's two root keys come `KEY_BLOCK` seeds at a time (one member at a time, a
    population of thousands took longer to get its keys than to be refused for its
    memory); its epoch keys come from its own shuffle key, one member per call of one
    small program (dispatched together), so that what is computed and held grows with
    N x num_epochs, not with KEY_BLOCK x num_epochs (the epoch keys of a padded block,
    for one seed trained until stopped with a huge `--epochs`, once filled gigabytes)."""
    n = len(seeds)
    # Seeds lie in 0..config.MAX_SEED: uint32 holds them all as they are.
    padded = np.zeros(-(-n // KEY_BLOCK) * KEY_BLOCK, np.uint32)
    padded[:n] = seeds
    roots = [_root_keys(padded[i : i + KEY_BLOCK]) for i in range(0, len(padded), KEY_BLOCK)]
    init = np.concatenate([np.asarray(i) for i, _ in roots])[:n]
    shuffle = np.concatenate([np.asarray(s) for _, s in roots])[:n]
    epochs = [_epoch_keys(raw, num_epochs) for raw in shuffle]
    return init, np.stack([np.asarray(e) for e in epochs])


@jax.jit
def _root_keys(seeds):
    """Each seed's (init_key, shuffle_key) of `member_keys`, as raw key data."""
    keys = jax.vmap(lambda seed: jax.random.split(jax.random.key(seed)))(seeds)
    return jax.random.key_data(keys[:, 0]), jax.random.key_data(keys[:, 1])


@functools.partial(jax.jit, static_argnums=1)  # compiled once per epoch count
def _epoch_keys(shuffle, num_epochs: int):
    """One member's epoch keys of `member_keys` (raw), from its raw shuffle key."""
    return jax.random.key_data(jax.random.split(_wrap(shuffle), num_epochs))


class EpochTotals(NamedTuple):
    """An epoch's training figures on the host, every member (leading axis N)."""

    losses: np.ndarray  # float32 (N, steps): each step's mean batch loss
    correct: np.ndarray  # int (N,): training examples classified right in the epoch's batches
    learning_rates: np.ndarray | None  # float64 (N,): the last update's; None: not tracked


def _added(parts: list) -> evaluate_lib.EvalSums:
    """The sum of `EvalSums` on the host (one per block), in float64 and int64."""
    return evaluate_lib.EvalSums(
        *(
            np.sum([np.asarray(x, wide) for x in field], axis=0)
            for field, wide in zip(zip(*parts), (np.float64, np.int64, np.int64), strict=True)
        )
    )


def _wrap(raw):
    return jax.random.wrap_key_data(raw)


class Population:
    """The states and compiled programs of `members` trained under one `cfg`.

    `chunks` are the sizes the members train in (from `memory.plan_chunks`), each
    a multiple of the layout's `members` axis; `layout` is a `parallel.Layout`.
    """

    def __init__(
        self,
        cfg,
        optimizer,
        members,
        chunks,
        input_shape,
        num_classes,
        num_epochs,
        layout,
        *,
        ensemble: bool = False,
        staged: bool = False,
        augment_ahead: bool | None = None,
    ):
        self.cfg, self.optimizer, self.members = cfg, optimizer, tuple(members)
        self.layout = layout
        platform = layout.mesh.devices.flat[0].platform
        self.staged = staged  # plans hold their batches (module doc)
        self.plan_data: TrainData | None = None  # what staged plans gather from (`hold_plan_data`)
        # Each epoch's batches augmented ahead, in a program of their own (module doc; None:
        # `augments_ahead`).
        self.augment_ahead = (
            augments_ahead(cfg, platform, len(self.members))
            if augment_ahead is None
            else augment_ahead
        )
        # Evaluate the ensemble of every member too, on the sets of `evaluate.ENSEMBLE_SETS`.
        self.ensemble = ensemble
        self.chunks = tuple(chunks)
        ends = np.cumsum((0, *self.chunks))
        self.slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(ends)]
        self.input_shape, self.num_classes = tuple(input_shape), num_classes
        # Where plans are drawn when not on the mesh (module doc), and the next epoch's
        # plans, drawn there ahead: (epoch index, one per chunk). The keys are drawn there
        # too: the same bits (threefry is integer arithmetic), without the mesh compiling
        # their programs.
        self.plan_device = plan_device(platform)
        with jax.default_device(self.plan_device) if self.plan_device else nullcontext():
            init, self.epoch_keys = population_keys([m.seed for m in self.members], num_epochs)
        self.num_epochs = num_epochs
        self.init_keys = [init[s] for s in self.slices]  # placed where init runs
        self.plan_fns: dict = {}  # chunk size -> compiled plan_epoch
        self.metrics_fns: dict = {}  # chunk size -> compiled new_metrics
        self.steps_fns: dict = {}  # chunk size -> compiled train_steps
        self.augment_fns: dict = {}  # chunk size -> compiled augmented plan (`augment_ahead`)
        self.rate_fns: dict = {}  # chunk size -> compiled learning rates
        # (chunk size, set name) -> compiled evaluation of a block: one program per chunk
        # size, whichever the set (`evaluate.place_eval_blocks`)
        self.eval_fns: dict = {}
        self.finish_fn = None  # the compiled ensemble of every chunk, on a block
        self.finish_chunks = 0  # how many chunks' sums `finish_fn` takes
        # set name -> the ensemble's log-probabilities float32 (batches, batch, C), one array
        # per block, after the last evaluation, left on the device (the run's saved
        # predictions read the test set's)
        self.ensemble_log_probs: dict = {}
        self.programs: dict = {}  # chunk size -> its compiled programs (`chunk_programs`)
        self.compile_seconds = 0.0  # spent in `chunk_programs`, for the estimate or the run
        self.compile_times: dict = {}  # program name (size/name) -> its compile's seconds
        self.compile_workers = compile_workers(platform)
        self._next_plans: tuple[int, Future] | None = None

    def __len__(self) -> int:
        return len(self.members)

    def _lift(self, fn, size: int, in_axes, on_mesh: bool = True):
        """`fn` over one member, run over `size` stacked members (see the module doc);
        `on_mesh`: the program runs on the mesh (else on one device: no member axis)."""
        if size == 1:

            def squeezed(*args):
                args = [
                    jax.tree.map(lambda x: x[0], a) if axis == 0 else a
                    for a, axis in zip(args, in_axes, strict=True)
                ]
                return jax.tree.map(lambda x: x[None], fn(*args))

            return squeezed
        axis_name = "members" if self.layout.members > 1 and on_mesh else None
        return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=axis_name)

    def _init_fn(self, size: int, on_mesh: bool = True):
        def init_one(raw_key):
            return init_state(
                _wrap(raw_key), self.cfg, self.optimizer, self.input_shape, self.num_classes
            )

        def init(raw_keys, hyper):
            state = self._lift(init_one, size, (0,), on_mesh)(raw_keys)
            return state._replace(opt_state=optim.set_hyperparams(state.opt_state, **hyper))

        return init

    def state_shapes(self):
        """One member's TrainState as shapes (nothing allocated)."""
        raw = jax.ShapeDtypeStruct((2,), np.uint32)
        return jax.eval_shape(
            lambda k: init_state(
                _wrap(k), self.cfg, self.optimizer, self.input_shape, self.num_classes
            ),
            raw,
        )

    def init_states(self) -> list:
        """One state per chunk, member axis first, each member's hyperparameters set;
        made where plans are drawn (on a TPU, the host's CPU: module doc) and placed on
        the mesh."""
        lay, host = self.layout, self.plan_device
        states = []
        for s, keys in zip(self.slices, self.init_keys, strict=True):
            size = s.stop - s.start
            hyper = {
                h: np.array([getattr(m, h) for m in self.members[s]], np.float32)
                for h in HYPERPARAMS
            }
            compiled = self.programs.get(size, {}).get("init")  # from `chunk_programs`
            if host is None:
                init = compiled or jax.jit(self._init_fn(size), out_shardings=lay.by_member)
                args = jax.tree.map(lambda x: lay.put(x, lay.by_member), (keys, hyper))
                states.append(init(*args))
                continue
            init = compiled or jax.jit(self._init_fn(size, on_mesh=False))
            with jax.transfer_guard("allow"):  # made on the host, copied to the mesh
                made = init(*jax.device_put((keys, hyper), host))
                states.append(jax.tree.map(lambda x: lay.put(np.asarray(x), lay.by_member), made))
        return states

    def in_chunks(self, chunks) -> Population:
        """The same members cut into `chunks`, keeping every program compiled so far."""
        other = Population(
            self.cfg, self.optimizer, self.members, chunks, self.input_shape,
            self.num_classes, self.num_epochs, self.layout, ensemble=self.ensemble,
            staged=self.staged, augment_ahead=self.augment_ahead,
        )  # fmt: skip
        other.plan_data = self.plan_data
        other.programs, other.compile_seconds = self.programs, self.compile_seconds
        other.finish_fn, other.finish_chunks = self.finish_fn, self.finish_chunks
        other.compile_times = self.compile_times
        return other

    def stage_batches(self) -> None:
        """From now on each plan carries its batches (module doc); only before any of the
        population's programs is compiled (`memory.chunks_for` decides)."""
        if self.programs:
            raise RuntimeError("stage_batches: the population's programs are compiled already")
        self.staged = True

    def hold_plan_data(self, images: np.ndarray, labels: np.ndarray, placed: TrainData) -> None:
        """Keeps the training set staged plans gather from: `placed` (the set on the mesh)
        where plans are drawn on the mesh, else a copy of `images` and `labels` (host
        arrays) on `plan_device`. Nothing where the population does not stage."""
        if not self.staged:
            return
        if self.plan_device is None:
            self.plan_data = placed
            return
        with jax.transfer_guard("allow"):
            host = TrainData(images, labels.astype(np.int32))
            self.plan_data = jax.device_put(host, self.plan_device)

    def chunk_programs(self, size: int, steps_per_epoch: int, train_data, eval_block) -> dict:
        """The compiled programs of a chunk of `size` members: "plan", "metrics", "steps",
        "rate" and "eval", the evaluation of one block of every eval set (`eval_block`, an
        EvalData: `evaluate.place_eval_blocks`). Lowered from shapes alone (`train_data`
        and `eval_block` may be `jax.ShapeDtypeStruct`s with their shardings), so nothing
        is allocated: `memory` reads their sizes before anything is placed, and `compile`
        then uses the same programs. Kept per size (a population has one epoch length and
        one dataset)."""
        if size in self.programs:
            return self.programs[size]
        start = time.perf_counter()
        lay, S = self.layout, steps_per_epoch
        by_member = lay.by_member

        def shapes(tree, sharding=by_member):
            return jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
            )

        host = self.plan_device
        # Where the initial states and the plans are made: on the host's CPU (module doc),
        # placed on the mesh as `by_member` (`init_states`, `plan_epoch`), or on the mesh.
        on_host = jax.sharding.SingleDeviceSharding(host) if host else by_member
        raw_keys = jax.ShapeDtypeStruct((size, 2), np.uint32, sharding=on_host)
        hyper = {
            h: jax.ShapeDtypeStruct((size,), np.float32, sharding=on_host) for h in HYPERPARAMS
        }
        if host is None:
            init = jax.jit(self._init_fn(size), out_shardings=by_member)
        else:
            init = jax.jit(self._init_fn(size, on_mesh=False))
        states = shapes(init.eval_shape(raw_keys, hyper))
        plan = make_epoch_plan(
            self.cfg, train_data.images.shape[0], S, host.platform if host else None, self.staged
        )
        if self.staged:  # (keys, the training set where the plan is drawn)
            planned = self._lift(lambda k, data: plan(_wrap(k), data), size, (0, None), not host)
            plan_args = (train_data,) if host is None else (shapes(train_data, on_host),)
        else:
            planned = self._lift(lambda k: plan(_wrap(k)), size, (0,), host is None)
            plan_args = ()
        if host is None:
            data_in = (lay.replicated,) if self.staged else ()
            planned = jax.jit(planned, in_shardings=(by_member, *data_in), out_shardings=by_member)
        else:
            planned = jax.jit(planned)
        fresh = jax.jit(
            lambda: jax.tree.map(lambda x: jnp.broadcast_to(x, (size, *x.shape)), empty_metrics(S)),
            out_shardings=by_member,
        )
        ahead = self.augment_ahead
        train_steps = make_train_steps(
            self.cfg,
            self.optimizer,
            shard_batch=lay.shard_batch,
            staged=self.staged or ahead,
            augmented=ahead,
        )
        steps_plan = self._ahead_shardings() if ahead else by_member  # a plan, or its prefix
        stepped = jax.jit(
            self._lift(train_steps, size, (0, 0, 0, None, None, None)),
            donate_argnums=(0, 1),
            in_shardings=(by_member, by_member, steps_plan) + (lay.replicated,) * 3,
            out_shardings=(by_member, by_member),
        )
        bounds = jax.ShapeDtypeStruct((), np.int32, sharding=lay.replicated)
        plan_shapes = shapes(planned.eval_shape(raw_keys, *plan_args))
        steps_plan_shapes = plan_shapes
        if ahead:  # the steps read the plan the augmentation's program makes of it
            batches = (steps_plan.images, steps_plan.labels)
            augment = jax.jit(
                self._lift(
                    make_augmented_batches(self.cfg, lay.shard_batch, self.staged),
                    size,
                    (0, None, None, None),
                ),
                in_shardings=(by_member,) + (lay.replicated,) * 3,
                out_shardings=batches,
            )
            made = augment.eval_shape(plan_shapes, train_data, bounds, bounds)
            images, labels = (
                jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
                for x, sharding in zip(made, batches, strict=True)
            )
            steps_plan_shapes = plan_shapes._replace(images=images, labels=labels)
        metric_shapes = shapes(fresh.eval_shape())
        with Compiles(self.compile_workers) as compiles:  # the slowest first
            compiles.add(
                "steps",
                stepped.lower(states, metric_shapes, steps_plan_shapes, train_data, bounds, bounds),
            )
            if ahead:
                compiles.add("augment", augment.lower(plan_shapes, train_data, bounds, bounds))
            compiles.add("init", init.lower(raw_keys, hyper))
            compiles.add("plan", planned.lower(raw_keys, *plan_args))
            compiles.add("metrics", fresh.lower())
            compiles.add("rate", self._rate_fn().lower(states))
            compiles.add("eval", self._eval_fn(size).lower(model_params(states), eval_block))
            finishing = self.ensemble and self.finish_chunks != len(self.chunks)
            if finishing:  # beside the others, not after them (`compile`)
                compiles.add("ensemble", self._finish_program(eval_block))
            programs, seconds = compiles.results()
        if finishing:
            self.finish_fn, self.finish_chunks = programs.pop("ensemble"), len(self.chunks)
            self.compile_times["ensemble"] = seconds.pop("ensemble")
        self.compile_times.update(
            {
                f"{name}" if size == len(self) else f"{name} ({size})": t
                for name, t in seconds.items()
            }
        )
        self.programs[size] = programs
        self.compile_seconds += time.perf_counter() - start
        return programs

    def _eval_fn(self, size: int):
        """The evaluation of a chunk of `size` members on a block of an eval set: their
        `EvalSums` (member axis first), and with `ensemble`, in the same pass, the chunk's
        `log_sums` for the ensemble (`evaluate.with_ensemble`)."""
        lay = self.layout
        evaluate = evaluate_lib.make_evaluate(self.cfg.model, self.num_classes, self.ensemble)
        fn = self._lift(evaluate, size, (0, None))
        out = lay.replicated
        if self.ensemble:
            fn, out = evaluate_lib.with_ensemble(fn), (out, lay.eval_batches)
        return jax.jit(fn, in_shardings=(lay.by_member, lay.eval_batches), out_shardings=out)

    def compile(self, steps_per_epoch: int, train_data, eval_sets: dict):
        """Compiles (or takes from `chunk_programs`) the epoch's programs and evaluation for
        every chunk size ahead of time; `eval_sets` maps a name to its PlacedBlocks, whose
        blocks share one shape. Every epoch, a shorter last one too, uses the plan of a
        full epoch of `steps_per_epoch`. With `ensemble`, also the program that makes the
        ensemble of every chunk, unless `chunk_programs` compiled it beside the chunk's
        programs for as many chunks."""
        block = next(iter(eval_sets.values())).blocks[0]
        for size in dict.fromkeys(self.chunks):
            programs = self.chunk_programs(size, steps_per_epoch, train_data, block)
            self.plan_fns[size] = programs["plan"]
            self.metrics_fns[size] = programs["metrics"]
            self.steps_fns[size] = programs["steps"]
            if self.augment_ahead:
                self.augment_fns[size] = programs["augment"]
            self.rate_fns[size] = programs["rate"]
            for name in eval_sets:
                self.eval_fns[size, name] = programs["eval"]
        if (
            self.ensemble
            and any(n in evaluate_lib.ENSEMBLE_SETS for n in eval_sets)
            and self.finish_chunks != len(self.chunks)
        ):
            self._compile_finish(block)

    def _finish_program(self, block):
        """The program that adds every chunk's `log_sums` on a block of an eval set
        (EvalData, or its shapes) and makes the ensemble's `EvalSums` there, lowered."""
        members, classes, lay = len(self.members), self.num_classes, self.layout

        def finish(chunk_sums, data):
            return evaluate_lib.ensemble_of_chunks(chunk_sums, members, data, classes)

        part = jax.ShapeDtypeStruct(
            (*block.labels.shape, classes), jnp.float32, sharding=lay.eval_batches
        )
        return jax.jit(finish, out_shardings=lay.replicated).lower([part] * len(self.chunks), block)

    def _compile_finish(self, block) -> None:
        """Compiles `_finish_program` for the population's chunks (`finish_fn`)."""
        start = time.perf_counter()
        compiled, seconds = compile_all({"ensemble": self._finish_program(block)})
        self.finish_fn, self.finish_chunks = compiled["ensemble"], len(self.chunks)
        self.compile_times.update(seconds)
        self.compile_seconds += time.perf_counter() - start

    def _ahead_shardings(self) -> EpochPlan:
        """Where a plan augmented ahead lies: each step's batch split over the mesh's
        `data` axis, as the steps split it (`parallel.Layout.shard_batch`)."""
        lay = self.layout
        batches = lay.sharding("members", None, "data")
        return EpochPlan(lay.by_member, lay.by_member, batches, batches)

    def plan_epoch(self, epoch_index: int, steps: tuple[int, int] | None = None, data=None) -> list:
        """Every chunk's plan for epoch `epoch_index` (0-based), on the mesh (staged: with
        its batches). Where plans are drawn on the host (`plan_device`), the next epoch's
        is drawn there and copied to the mesh on a thread while this one trains. With
        `augment_ahead`, each plan is then staged with the batches of `steps` (start,
        stop), the steps that will run (default: all), gathered from `data` (the
        training set on the mesh, as `train_steps` takes it) and augmented (module doc)."""
        plans = self._plans(epoch_index)
        if not self.augment_ahead:
            return plans
        lay = self.layout
        start, stop = steps or (0, plans[0].indices.shape[1])
        with jax.transfer_guard_host_to_device("allow"):  # the two bounds
            a, b = (lay.put(np.int32(x), lay.replicated) for x in (start, stop))
        augmented = []
        for size, plan in zip(self.chunks, plans, strict=True):
            images, labels = self.augment_fns[size](plan, data, a, b)
            augmented.append(plan._replace(images=images, labels=labels))
        return augmented

    def _plans(self, epoch_index: int) -> list[EpochPlan]:
        """Every chunk's plan for epoch `epoch_index`, as drawn, on the mesh (`plan_epoch`)."""
        lay = self.layout
        if self.plan_device is None:
            with jax.transfer_guard_host_to_device("allow"):  # the epoch's keys, as it starts
                keys = [
                    lay.put(self.epoch_keys[s, epoch_index], lay.by_member) for s in self.slices
                ]
            return [self._plan(size, k) for size, k in zip(self.chunks, keys, strict=True)]
        ahead, self._next_plans = self._next_plans, None
        if ahead and ahead[0] == epoch_index:
            plans = ahead[1].result()
        else:  # the first epoch, or out of turn (a resumed run): drawn now
            plans = self._host_plans(epoch_index)
        if epoch_index + 1 < self.num_epochs:
            self._next_plans = (epoch_index + 1, _in_background(self._host_plans, epoch_index + 1))
        return plans

    def _plan(self, size: int, keys) -> EpochPlan:
        if self.staged:
            return self.plan_fns[size](keys, self.plan_data)
        return self.plan_fns[size](keys)

    def _host_plans(self, epoch_index: int) -> list[EpochPlan]:
        """Every chunk's plan for epoch `epoch_index`, drawn on `plan_device` and copied
        to the mesh."""
        lay = self.layout
        drawn = self._draw_plans(epoch_index)
        with jax.transfer_guard("allow"):  # the host's plan, copied to the mesh
            return [
                jax.tree.map(lambda x: lay.put(np.asarray(x), lay.by_member), plan)
                for plan in drawn
            ]

    def _draw_plans(self, epoch_index: int) -> list[EpochPlan]:
        """Every chunk's plan for epoch `epoch_index`, dispatched on `plan_device`."""
        with jax.transfer_guard("allow"):
            keys = [
                jax.device_put(self.epoch_keys[s, epoch_index], self.plan_device)
                for s in self.slices
            ]
            return [self._plan(size, k) for size, k in zip(self.chunks, keys, strict=True)]

    def new_metrics(self) -> list[EpochMetrics]:
        """Every chunk's empty epoch accumulators (member axis first)."""
        return [self.metrics_fns[size]() for size in self.chunks]

    def train_steps(self, states, metrics, plans, data, start: int, stop: int):
        """Runs steps `start .. stop - 1` of the epoch `plans` belong to, for every chunk
        in turn; returns (states, metrics), the inputs donated."""
        lay = self.layout
        with jax.transfer_guard_host_to_device("allow"):  # the two bounds
            a, b = (lay.put(np.int32(x), lay.replicated) for x in (start, stop))
        out_states, out_metrics = [], []
        for size, state, m, plan in zip(self.chunks, states, metrics, plans, strict=True):
            state, m = self.steps_fns[size](state, m, plan, data, a, b)
            out_states.append(state)
            out_metrics.append(m)
        return out_states, out_metrics

    def host_metrics(self, states, metrics, num_steps: int) -> EpochTotals:
        """The epoch's figures on the host, for an epoch of `num_steps` steps."""
        host = jax.device_get(metrics)
        losses = np.concatenate([np.asarray(m.loss)[:, :num_steps] for m in host])
        correct = np.concatenate([np.asarray(m.correct).reshape(-1) for m in host])
        return EpochTotals(losses, correct, self.learning_rates(states))

    def evaluate(
        self, states, name: str, data: evaluate_lib.PlacedBlocks, watch=None
    ) -> tuple[Evaluation, evaluate_lib.EvalResult | None]:
        """Exact evaluation of every member on eval set `name`, and on the sets of
        `evaluate.ENSEMBLE_SETS`, with `ensemble`, that of the ensemble of every member,
        its chunks together (the mean of their softmax probabilities), else None. One pass
        over the set's blocks gives both: on each block, each chunk's program returns its
        members' sums and the logs of their summed probabilities, and one more adds the
        chunks'; the blocks' sums add on the host. `watch(ready)`, where given, is called
        once those programs are dispatched, with a function that says whether they are
        done (`hostmem.GrowthCheck.watch`)."""
        outs = [
            [
                self.eval_fns[size, name](model_params(s), block)
                for size, s in zip(self.chunks, states, strict=True)
            ]
            for block in data.blocks
        ]
        if watch is not None:
            leaves = jax.tree.leaves(outs)
            watch(lambda: all(x.is_ready() for x in leaves))
        together = None
        if self.ensemble:  # each program returned (sums, log_sums)
            outs, log_sums = (
                [[o[0] for o in block] for block in outs],
                [[o[1] for o in block] for block in outs],
            )
        if self.ensemble and name in evaluate_lib.ENSEMBLE_SETS:
            done = [self.finish_fn(list(s), b) for s, b in zip(log_sums, data.blocks, strict=True)]
            self.ensemble_log_probs[name] = [log_p for _, log_p in done]
            together = _added(jax.device_get([sums for sums, _ in done]))
        # every block's sums per member, the chunks' members in order, added over blocks
        sums = _added(
            [
                evaluate_lib.EvalSums(*(np.concatenate(field) for field in zip(*block)))
                for block in jax.device_get(outs)
            ]
        )
        count = data.count
        members = Evaluation(
            sums.loss_sum.astype(np.float64) / count,
            sums.correct.astype(np.float64) / count,
            sums.confusion.astype(np.int64),
            count,
        )
        return members, None if together is None else evaluate_lib.result_of(together, count)

    def _rate_fn(self):
        return jax.jit(
            lambda s: optim.current_learning_rate(s.opt_state), out_shardings=self.layout.replicated
        )

    def learning_rates(self, states) -> np.ndarray | None:
        """float64 (N,): the learning rate each member's last update used."""
        lrs = [
            (self.rate_fns.get(size) or self._rate_fn())(s)
            for size, s in zip(self.chunks, states, strict=True)
        ]
        if lrs[0] is None:
            return None
        return np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in jax.device_get(lrs)])

    def params(self, states):
        """Every member's parameters on the host, stacked along a leading member axis (the
        moving average where the run keeps one: `step.model_params`)."""
        if self.layout.size == 1:  # nothing to gather: one device holds every member
            return jax.tree.map(
                lambda *xs: np.concatenate(xs), *jax.device_get([model_params(s) for s in states])
            )
        gather = jax.jit(lambda p: p, out_shardings=self.layout.replicated)
        return jax.tree.map(
            lambda *xs: np.concatenate(xs),
            *[jax.device_get(gather(model_params(s))) for s in states],
        )

    def member_params(self, states, index: int):
        """Member `index`'s parameters on the host, unstacked."""
        return jax.tree.map(lambda x: x[index], self.params(states))
