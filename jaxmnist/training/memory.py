"""Device memory for many models: an estimate from the compiled programs, the budget,
and chunks that fit.

Training N models in one vmapped program multiplies everything per model by N. Before
any data or state is placed, `chunks_for` compiles a chunk's programs from shapes alone
(`Population.chunk_programs`: `jax.ShapeDtypeStruct`s, nothing allocated; the run then
uses these very programs) and reads what XLA says they need (`memory_analysis()`), per
device:

    shared      the training set and the padded evaluation sets, as they are placed
                (replicated, or split over the `data` axis), and the generated code
    resident    per model, for the whole run: its state and the epoch's accumulators
                (the `steps` program's output), the epoch's plan (the `plan` program's;
                staged, with its batches; twice where plans are drawn on the host, whose
                next epoch's is copied to the mesh while this one trains), its batches
                augmented ahead (the `augment` program's, where there is one) and its keys
    transient   the program that is running: XLA's temporaries, plus whatever it outputs
                beyond what it writes over its donated inputs, plus (on CPU) the largest
                array a YNNPACK fusion makes inside itself; the largest over the chunk's
                programs (the chunks run one after another; on CPU the run loop
                keeps the calls of one program to one block, `hostmem.GrowthCheck`)
    native      on CPU, where a program calls jaxmnist's native kernels (oneDNN's), what
                those hold outside every program, once per process

The whole population is compiled first: when it fits, that is the plan, and its programs
are the run's (nothing compiles twice). When it does not, one model per device is
compiled too, and a chunk's transient memory is taken as affine in its size between
these two: every buffer of a vmapped program carries the member axis, so it grows in
proportion to the chunk, and what does not is a constant; both ends are the compiler's
own figures, so only the chunk sizes in between are interpolated. `plan_chunks` then
splits the models into the fewest equal chunks whose transient memory fits beside
everything resident; if even one model at a time does not fit, it fails with one line
saying what would, before anything is placed. The budget is the device's free memory
(`memory_stats`: its limit, less what is in use and what is reserved for programs), the
host's available memory on CPU (where XLA allocates from the process heap), or
`memory_budget_mb` when set.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import jax
import numpy as np

from jaxmnist.errors import ConfigError
from jaxmnist.training.evaluate import EvalData, block_shape, train_eval_facts
from jaxmnist.training.step import TrainData

MB = 2**20
# Headroom: the estimate is of the run's arrays and programs, not of the allocator's
# slack, the compiler's own buffers or (on CPU) the rest of the process, so a run is
# planned into only part of what is free.
HOST_FRACTION = 0.7  # of the host's available memory, on CPU
DEVICE_FRACTION = 0.85  # of an accelerator's free memory
# XLA:CPU allocates from the process heap, and the process holds more than the compiled
# programs' buffers: the kernels' own working memory (oneDNN's, Eigen's) and the blocks the
# allocator keeps for reuse, in proportion to what the programs use, and the runtime's own
# allocations around them, which no program adds. So on CPU what the programs need is
# scaled by the factor and the constant added (benchmarks/memory_estimate.py measures both
# against the peak resident set; an under-estimate is an out-of-memory crash, an
# over-estimate only splits a population sooner). The heap in use while the `steps`
# program runs can exceed its temporaries, so the factor is set from the benchmark's case
# with the least margin below its measured peak (docs/results.md says which and by
# how much). An accelerator's allocator holds what XLA plans.
CPU_RUNTIME_FACTOR = 1.15
CPU_RUNTIME_BYTES = 10 * MB
# A process whose programs call jaxmnist's native CPU kernels (oneDNN's: `models.onednn`)
# also holds what those keep outside every program: oneDNN's
# threads, the code it generates for each shape, each cached plan's scratchpad. A
# constant, since they follow the shapes and not the number of models; measured by
# benchmarks/memory_estimate.py (docs/results.md has the figure).
NATIVE_KERNEL_BYTES = 8 * MB
NATIVE_CALL = re.compile(r'custom_call_target="jaxmnist_')
# XLA:CPU hands some fusions to YNNPACK, which makes the arrays inside a fusion itself,
# outside the buffer assignment `memory_analysis()` reports: batch norm's normalised
# activations of a whole evaluation batch, for one. While such a program runs, the largest
# array any of its YNNPACK fusions makes is counted as its working memory too (the
# measured peaks follow the largest, not the sum). They are read from the optimised HLO.
_YNN_FUSION = re.compile(r"calls=(%[\w.\-]+).*\"kind\":\"__ynn_fusion\"")
_COMPUTATION = re.compile(r"^(%[\w.\-]+) \(.*?\) -> .*? \{\n(.*?)\n\}", re.DOTALL | re.MULTILINE)
# An array an instruction makes: its element width in bits, its dimensions, its opcode (a
# fusion's output, its ROOT, is not matched: XLA holds it).
_ARRAY = re.compile(r"\s*%[\w.\-]+ = [a-z]+(\d*)\[([\d,]*)\]\S* ([\w\-]+)\(")
_NOT_MADE = ("parameter", "constant", "bitcast", "broadcast")  # inputs, or views of them
# Programs whose output is the resident state, plan or accumulators (counted as such).
_KEPT_OUTPUTS = ("init", "plan", "metrics", "augment")
# On a TPU a population of one model stages its batches (`stages_batches`) when its staged
# epochs (this epoch's and the next's) take at most this part of the device's budget.
STAGE_FRACTION = 0.25


class MemoryEstimate(NamedTuple):
    """Bytes on one device: `total(n, chunk)` for n models trained `chunk` at a time."""

    shared_bytes: int
    resident_per_model: int
    transient_per_model: int
    transient_fixed: int = 0  # the part of the running program's memory no model adds

    def total(self, num_models: int, chunk: int) -> int:
        return (
            self.shared_bytes
            + num_models * self.resident_per_model
            + self.transient_fixed
            + chunk * self.transient_per_model
        )


class ChunkMemory(NamedTuple):
    """What the compiled programs of one chunk need on one device (bytes)."""

    models: int  # the chunk's models on each device
    resident: int  # their states, plans, accumulators and keys
    transient: int  # the largest program's working memory
    code: int  # the generated code of all the chunk's programs
    native: bool = False  # whether any of them calls a native kernel (`calls_native_kernels`)


def ynn_fusion_bytes(hlo: str) -> int:
    """The largest array made inside any YNNPACK fusion of the optimised HLO text `hlo`
    (`Compiled.as_text()`): neither a fusion's inputs nor its output, which XLA's buffer
    assignment holds; 0 where there is none (every backend but XLA:CPU)."""
    if "__ynn_fusion" not in hlo:
        return 0
    bodies = {m.group(1): m.group(2) for m in _COMPUTATION.finditer(hlo)}
    largest = 0
    for fusion in _YNN_FUSION.finditer(hlo):
        for line in bodies.get(fusion.group(1), "").splitlines():
            made = _ARRAY.match(line)
            if made is None or made.group(3) in _NOT_MADE:
                continue
            bits, dims, _ = made.groups()
            size = math.prod(int(d) for d in dims.split(",") if d)
            largest = max(largest, size * max(int(bits or 8), 8) // 8)  # pred: a byte
    return largest


def chunk_memory(
    programs: dict, models: int, num_epochs: int = 1, host: tuple[str, ...] = ()
) -> ChunkMemory:
    """Reads `memory_analysis()` and the YNNPACK fusions (`ynn_fusion_bytes`) of a
    chunk's compiled programs (`Population.chunk_programs`: name -> `jax.stages.Compiled`)
    for `models` models per device. Programs named in `host` run on the host's CPU
    (a TPU run's plan): only their outputs, placed on the mesh, count."""
    stats = {name: p.memory_analysis() for name, p in programs.items()}
    texts = {name: p.as_text() for name, p in programs.items() if name not in host}
    fusions = {name: ynn_fusion_bytes(text) for name, text in texts.items()}
    on_mesh = {name: st for name, st in stats.items() if name not in host}

    def working(name, s) -> int:
        new_outputs = s.output_size_in_bytes - s.alias_size_in_bytes  # donated ones reused
        kept = name in _KEPT_OUTPUTS
        return s.temp_size_in_bytes + fusions[name] + (0 if kept else max(new_outputs, 0))

    plan = stats["plan"]
    keys = programs["plan"].args_info[0][0]  # the plan's first argument: its raw keys
    resident = (
        stats["steps"].output_size_in_bytes  # the states and accumulators it steps
        + plan.output_size_in_bytes * (2 if "plan" in host else 1)  # the next one's too
        # The epoch's batches, augmented ahead (`population.augments_ahead`).
        + (stats["augment"].output_size_in_bytes if "augment" in stats else 0)
        # Every epoch's key (kept on the host, placed as its epoch starts: on a CPU, the
        # same memory) and the init key.
        + math.prod(keys.shape) * np.dtype(keys.dtype).itemsize * (num_epochs + 1)
    )
    return ChunkMemory(
        models,
        resident,
        max(working(n, s) for n, s in on_mesh.items()),
        sum(s.generated_code_size_in_bytes for s in on_mesh.values()),
        any(calls_native_kernels(text) for text in texts.values()),
    )


def estimate_memory(
    shared_bytes: int,
    measured: ChunkMemory,
    other: ChunkMemory | None = None,
    factor: float = 1.0,
    runtime_bytes: int = 0,
) -> MemoryEstimate:
    """The estimate from one compiled chunk size (transient memory in proportion to the
    chunk, exact at it) or two (affine between them, exact at both); every figure times
    `factor`, and `runtime_bytes` added (`CPU_RUNTIME_FACTOR`, `CPU_RUNTIME_BYTES` on CPU)."""
    points = [measured] if other is None else sorted([measured, other])
    resident = max(p.resident / p.models for p in points)
    shared = shared_bytes + max(p.code for p in points)
    a, b = points[0], points[-1]
    if a.models == b.models:
        slope, fixed = b.transient / b.models, 0.0
    else:
        slope = (b.transient - a.transient) / (b.models - a.models)
        fixed = a.transient - slope * a.models
    scaled = [math.ceil(x * factor) for x in (shared, resident, slope, fixed)]
    return MemoryEstimate(*scaled[:3], scaled[3] + runtime_bytes)


def _placed_bytes(tree) -> int:
    """Bytes one device holds of `tree`'s ShapeDtypeStructs, as their shardings place them."""
    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
        for x in jax.tree.leaves(tree)
    )


def abstract_data(cfg, dataset, layout) -> tuple[TrainData, dict[str, tuple[EvalData, ...]]]:
    """The training data and evaluation sets as the run will place them, as shapes with
    their shardings: (TrainData, name -> its blocks, EvalData each), cut and padded as
    `evaluate.place_eval_blocks` cuts them."""

    def like(shape, dtype, sharding):
        return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), sharding=sharding)

    # The validation split (data.validation) leaves the training set and is evaluated apart.
    images = dataset.train_images[cfg.data.validation :]
    train = TrainData(
        like(images.shape, images.dtype, layout.replicated),
        like((len(images),), np.int32, layout.replicated),
    )
    counts = {"test": len(dataset.test_images)}
    if cfg.train.eval_train:  # all of it, or a subset
        counts["train"] = train_eval_facts(cfg.train, len(images))["train_eval_examples"]
    if cfg.data.validation:
        counts["val"] = cfg.data.validation
    batch, per_block = block_shape(counts.values(), cfg.train.eval_batch_size, layout.data)
    shape = (per_block, batch)
    block = EvalData(
        like((*shape, *images.shape[1:]), images.dtype, layout.eval_batches),
        like(shape, np.int32, layout.eval_batches),
        like(shape, np.bool_, layout.eval_batches),
    )
    rows = batch * per_block
    return train, {name: (block,) * -(-n // rows) for name, n in counts.items()}


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def device_bytes_held(stats: dict) -> int:
    """What an accelerator holds now, from its `memory_stats()`: the arrays in use and,
    where the runtime reports it, what it has reserved for programs' working memory
    (`bytes_reserved`: a TPU reserves a program's temporaries when it first runs, outside
    `bytes_in_use`, keeps them, and runs smaller programs in the same reservation)."""
    return stats.get("bytes_in_use", 0) + stats.get("bytes_reserved", 0)


def device_peak_bytes(stats: dict) -> int:
    """The most an accelerator has held, from its `memory_stats()`: the peak of the arrays
    in use plus the peak reserved for programs (`device_bytes_held`). The two peaks may
    come at different moments, so the sum bounds the peak of what it held from above."""
    return stats.get("peak_bytes_in_use", 0) + stats.get("peak_bytes_reserved", 0)


def device_budget(cfg) -> tuple[int | None, str]:
    """(bytes the models may use, where that figure comes from); None: unknown."""
    if cfg.memory_budget_mb is not None:
        return cfg.memory_budget_mb * MB, "memory_budget_mb"
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        free = stats["bytes_limit"] - device_bytes_held(stats)
        return int(free * DEVICE_FRACTION), f"85% of the free memory of {device.device_kind}"
    available = _host_available_bytes()
    if available is not None:
        return int(available * HOST_FRACTION), "70% of the available host memory"
    return None, "unknown"


def stages_batches(
    budget: int | None, num_models: int, train_shape: tuple[int, ...], host_plans: bool
) -> bool:
    """Whether a population of `num_models` stages its batches
    (`population.Population.stage_batches`) for epochs of `train_shape` (examples, H, W):
    only where its plans are drawn on the host (`host_plans`: a TPU,
    `population.plan_device`), whose CPU then gathers them; only for one model, since the
    host gathers and copies every model's epoch while the last one trains, and several
    models' epochs outran their training on a TPU (docs/tpu-gpu.md, "Staged batches");
    and only when two epochs of uint8 images and int32 labels (this epoch's and the next's,
    on the mesh at once) take at most `STAGE_FRACTION` of `budget` (bytes, from
    `device_budget`; None: unknown, never)."""
    if not host_plans or budget is None or num_models != 1:
        return False
    epoch = train_shape[0] * (math.prod(train_shape[1:]) + 4)
    return 2 * epoch <= STAGE_FRACTION * budget


def choose_staging(cfg, pop, steps_per_epoch: int, dataset, budget: int | None) -> None:
    """Tells `pop` (a `Population`, before its programs compile) to stage its batches
    where `stages_batches` says so, for epochs of `steps_per_epoch` of `dataset`."""
    epoch = (steps_per_epoch * cfg.train.batch_size, *dataset.train_images.shape[1:])
    if stages_batches(budget, len(pop), epoch, pop.plan_device is not None):
        pop.stage_batches()


def plan_chunks(
    num_models: int, est: MemoryEstimate, budget: int | None, source: str = "budget"
) -> tuple[int, ...]:
    """Sizes of the chunks the models train in: as few as fit, as equal as possible.

    Raises ConfigError (one line) when the resident models alone, or one model's
    working memory beside them, exceed `budget`.
    """
    if budget is None:
        return (num_models,)
    room = budget - est.shared_bytes - num_models * est.resident_per_model - est.transient_fixed
    if room < est.transient_per_model:
        need = est.total(num_models, 1)
        most = max(
            0,
            (budget - est.total(0, 1)) // max(est.resident_per_model, 1),
        )
        if num_models == 1 or most == 0:
            what = "this model needs" if num_models == 1 else "not even one model fits: one needs"
            need = est.total(1, 1)
            raise ConfigError(
                f"{what} about {need / MB:,.0f} MB ({est.resident_per_model / MB:,.1f} MB of "
                f"parameters, optimizer state and epoch plan, {est.shared_bytes / MB:,.0f} MB "
                f"of data and code, the rest working memory) but {source} is "
                f"{budget / MB:,.0f} MB; use a smaller model or batch"
            )
        raise ConfigError(
            f"{num_models} models need about {need / MB:,.0f} MB even one at a time "
            f"({est.resident_per_model / MB:.1f} MB each kept, "
            f"{est.shared_bytes / MB:.0f} MB of data and code) but {source} is "
            f"{budget / MB:,.0f} MB; train at most {most} seeds or points, or a smaller model"
        )
    per_chunk = min(num_models, room // max(est.transient_per_model, 1))
    count = math.ceil(num_models / per_chunk)
    base, extra = divmod(num_models, count)
    return tuple(base + (i < extra) for i in range(count))


def estimate_for(cfg, pop, steps_per_epoch: int, dataset, sizes: tuple[int, ...]) -> MemoryEstimate:
    """The estimate for the members of `pop` (a `Population`) trained on `dataset`, from
    the compiled programs of chunks of one or two `sizes` (models over all devices,
    multiples of the mesh's `members` axis), per device."""
    per = pop.layout.members
    train, evals = abstract_data(cfg, dataset, pop.layout)
    num_epochs = pop.num_epochs
    block = next(iter(evals.values()))[0]  # every set's blocks share its shape
    compiled = [pop.chunk_programs(size, steps_per_epoch, train, block) for size in sizes]
    host = ("plan", "init") if pop.plan_device is not None else ()
    measured = [
        chunk_memory(programs, size // per, num_epochs, host)
        for programs, size in zip(compiled, sizes, strict=True)
    ]
    cpu = pop.layout.mesh.devices.flat[0].platform == "cpu"
    # On CPU the placed data are the host arrays themselves (aligned arrays are used in
    # place, `data.formats.aligned`, `evaluate.pad_eval_data`), already in memory when the
    # budget is read: only what the programs add counts there.
    shared = 0 if cpu else _placed_bytes((train, evals))
    factor, runtime = (CPU_RUNTIME_FACTOR, CPU_RUNTIME_BYTES) if cpu else (1.0, 0)
    if cpu and any(m.native for m in measured):
        runtime += NATIVE_KERNEL_BYTES
    return estimate_memory(shared, *measured, factor=factor, runtime_bytes=runtime)


def calls_native_kernels(hlo_text: str) -> bool:
    """Whether a compiled program (its optimised HLO's text) calls one of jaxmnist's
    native kernels."""
    return NATIVE_CALL.search(hlo_text) is not None


def chunks_for(cfg, pop, steps_per_epoch: int, dataset) -> tuple[tuple[int, ...], dict]:
    """(chunk sizes, what to tell the user) for the members of `pop` (a `Population`)
    trained on `dataset` in epochs of `steps_per_epoch` steps.

    The models are spread over the mesh's `members` axis, so each device holds
    `len(pop) / members` of them and chunks are whole multiples of `members`. Every
    run is estimated, one model too: a model that cannot fit is refused here, before
    anything is placed. The programs compiled for the estimate stay in `pop`, which is
    told to stage its batches first where `stages_batches` says so.
    """
    per = pop.layout.members
    n = len(pop) // per
    budget, source = device_budget(cfg)
    choose_staging(cfg, pop, steps_per_epoch, dataset, budget)
    est = estimate_for(cfg, pop, steps_per_epoch, dataset, (len(pop),))
    if budget is not None and n > 1 and est.total(n, n) > budget:  # one per device too
        est = estimate_for(cfg, pop, steps_per_epoch, dataset, (len(pop), per))
    per_device = plan_chunks(n, est, budget, source)
    chunks = tuple(c * per for c in per_device)
    return chunks, {
        "chunks": list(chunks),
        "memory_estimate_mb": round(est.total(n, max(per_device)) / MB, 1),
        "memory_budget_mb": budget and round(budget / MB),
        "memory_budget_source": source,
    }
