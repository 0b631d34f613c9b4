"""Device memory for many models: an estimate, the budget, and chunks that fit.

Training N models in one vmapped program multiplies everything per model by N.
Before anything is compiled, `estimate_memory` adds up what the run needs from
the shapes alone (`jax.eval_shape`, nothing allocated):

    shared      the training set (uint8) and the padded evaluation sets, once
    resident    per model, kept for the whole run: parameters and optimizer state,
                and the epoch's plan (batch indices) and accumulators
    transient   per model in the program that is running: gradients and updates,
                the permutation's sort buffers, one step's
                activations (kept for the backward pass), one evaluation batch's
                activations; times a safety factor for XLA's temporaries

`plan_chunks` then splits the models into the fewest equal chunks whose
transient memory fits beside everything resident: the chunks run one after
another inside each epoch. If even one model at a time does not fit, it fails
with one line saying what would, before any work starts. The budget is the
device's free memory (`memory_stats`), the host's available memory on CPU
(where XLA allocates from the process heap), or `memory_budget_mb` when set.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.extend
import numpy as np

from jaxmnist.errors import ConfigError
from jaxmnist.models import get_model

MB = 2**20
TRANSIENT_SAFETY = 2.0  # XLA temporaries, fusion buffers, allocator slack (a bound)
# Headroom: the estimate is of the run's arrays, not of the allocator's slack, the
# compiler's own buffers or (on CPU) the rest of the process, so a run is planned
# into only part of what is free.
HOST_FRACTION = 0.7  # of the host's available memory, on CPU
DEVICE_FRACTION = 0.85  # of an accelerator's free memory


class MemoryEstimate(NamedTuple):
    shared_bytes: int
    resident_per_model: int
    transient_per_model: int

    def total(self, num_models: int, chunk: int) -> int:
        return (
            self.shared_bytes
            + num_models * self.resident_per_model
            + chunk * self.transient_per_model
        )


def _tree_bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def activation_bytes_per_example(
    cfg, params_shapes, input_shape, num_classes: int
) -> tuple[int, int]:
    """(all, largest): bytes of every intermediate value of one example's training
    forward pass (`train=True`), and of the largest one, read from the model's traced
    program (nothing runs). Whatever the family, an im2col buffer (k² times its
    activation), a wide hidden layer or batch norm's extra values are counted as what
    they are. Training keeps about all of them for the backward pass (fusion keeps
    fewer: an overestimate, which only makes chunks smaller); evaluation keeps a few at
    a time.

    cfg: Config; params_shapes: the model's parameters as shapes."""
    apply = get_model(cfg.model.name).apply
    batch = 2  # not 1: a size-1 batch axis may be squeezed away in the trace
    x = jax.ShapeDtypeStruct((batch, *input_shape), np.float32)
    key = jax.random.key(0)  # the training pass: dropout masks and batch statistics count

    def forward(p, x):
        return apply(p, x, cfg.model, key=key, train=True)

    closed = jax.make_jaxpr(forward)(params_shapes, x)
    sizes = [
        int(np.prod(v.aval.shape)) * np.dtype(v.aval.dtype).itemsize
        for eqn in _all_eqns(closed.jaxpr)
        for v in eqn.outvars
        if getattr(v.aval, "shape", ()) and v.aval.shape[0] == batch
    ] or [batch]
    return max(sum(sizes) // batch, 1), max(max(sizes) // batch, 1)


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _all_eqns(sub)


def estimate_memory(
    cfg, state_shapes, input_shape, num_classes: int, num_train: int, num_eval: int
) -> MemoryEstimate:
    """cfg: Config; state_shapes: one model's TrainState as `jax.ShapeDtypeStruct`s
    (from `jax.eval_shape`); input_shape: (H, W); num_eval: examples in all
    evaluation sets together."""
    t = cfg.train
    input_dim = int(np.prod(input_shape))
    params = _tree_bytes(state_shapes.params)
    steps = max(num_train // t.batch_size, 1)
    plan = num_train * 4 + steps * (4 + 8 + 4)  # indices; augmentation keys, step losses
    resident = _tree_bytes(state_shapes) + plan
    kept, largest = activation_bytes_per_example(cfg, state_shapes.params, input_shape, num_classes)
    step_activations = 2 * t.batch_size * kept  # forward values kept, and their gradients
    eval_activations = 3 * min(t.eval_batch_size, max(num_eval, 1)) * largest  # a few live
    permutation = 3 * num_train * 4  # random bits, sort, indices (int32)
    transient = 2 * params + permutation + max(step_activations, eval_activations)
    shared = num_train * (input_dim + 4) + num_eval * (
        input_dim + 5
    )  # uint8 images, int32 labels, mask
    return MemoryEstimate(shared, resident, int(transient * TRANSIENT_SAFETY))


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def device_budget(cfg) -> tuple[int | None, str]:
    """(bytes the models may use, where that figure comes from); None: unknown."""
    if cfg.memory_budget_mb is not None:
        return cfg.memory_budget_mb * MB, "memory_budget_mb"
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
        return int(free * DEVICE_FRACTION), f"85% of the free memory of {device.device_kind}"
    available = _host_available_bytes()
    if available is not None:
        return int(available * HOST_FRACTION), "70% of the available host memory"
    return None, "unknown"


def plan_chunks(
    num_models: int, est: MemoryEstimate, budget: int | None, source: str = "budget"
) -> tuple[int, ...]:
    """Sizes of the chunks the models train in: as few as fit, as equal as possible.

    Raises ConfigError (one line) when the resident models alone, or one model's
    working memory beside them, exceed `budget`.
    """
    if budget is None:
        return (num_models,)
    room = budget - est.shared_bytes - num_models * est.resident_per_model
    if room < est.transient_per_model:
        need = est.total(num_models, 1)
        most = max(
            0,
            (budget - est.shared_bytes - est.transient_per_model) // max(est.resident_per_model, 1),
        )
        if num_models == 1 or most == 0:
            what = "this model needs" if num_models == 1 else "not even one model fits: one needs"
            need = est.total(1, 1)
            raise ConfigError(
                f"{what} about {need / MB:,.0f} MB ({est.resident_per_model / MB:,.1f} MB of "
                f"parameters and optimizer state, {est.shared_bytes / MB:,.0f} MB of data, the "
                f"rest working memory) but {source} is {budget / MB:,.0f} MB; "
                "use a smaller model or batch"
            )
        raise ConfigError(
            f"{num_models} models need about {need / MB:,.0f} MB even one at a time "
            f"({est.resident_per_model / MB:.1f} MB each kept, "
            f"{est.shared_bytes / MB:.0f} MB of data) but {source} is {budget / MB:,.0f} MB; "
            f"train at most {most} seeds or points, or a smaller model"
        )
    per_chunk = min(num_models, room // est.transient_per_model)
    count = math.ceil(num_models / per_chunk)
    base, extra = divmod(num_models, count)
    return tuple(base + (i < extra) for i in range(count))


def chunks_for(
    cfg, state_shapes, dataset, num_models: int, members_axis: int = 1
) -> tuple[tuple[int, ...], dict]:
    """(chunk sizes, what to tell the user) for `num_models` of `cfg` on `dataset`.

    The models are spread over a mesh axis of `members_axis` devices, so each
    device holds `num_models / members_axis` of them and chunks are whole
    multiples of `members_axis`. Every run is estimated, one model too: a model
    that cannot fit is refused here, before anything is allocated.
    """
    n_train = len(dataset.train_labels)
    num_eval = len(dataset.test_labels) + (n_train if cfg.train.eval_train else 0)
    classes = len(dataset.spec.class_names)
    input_shape = tuple(dataset.train_images.shape[1:])
    est = estimate_memory(cfg, state_shapes, input_shape, classes, n_train, num_eval)
    budget, source = device_budget(cfg)
    per_device = plan_chunks(num_models // members_axis, est, budget, source)
    chunks = tuple(c * members_axis for c in per_device)
    return chunks, {
        "chunks": list(chunks),
        "memory_estimate_mb": round(est.total(num_models // members_axis, max(per_device)) / MB, 1),
        "memory_budget_mb": budget and round(budget / MB),
        "memory_budget_source": source,
    }
