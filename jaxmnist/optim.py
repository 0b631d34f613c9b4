"""Optimizers and learning-rate schedules, built from Optax pieces.

`make_optimizer(cfg, total_steps)` returns one `optax.GradientTransformation`.
Hyperparameters are injected (`optax.inject_hyperparams`), so the learning rate
and weight decay live in the optimizer state as arrays: the current learning rate
can be logged, and a sweep can vmap over them without recompiling. The schedule
is a fixed shape (`make_schedule` with a peak of 1) times a peak learning rate
that is itself state (`PeakSchedule`), so the peak is a traced array too:
`set_hyperparams` writes per-model values into a (stacked) optimizer state.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


def make_schedule(cfg, total_steps: int) -> optax.Schedule:
    """cfg: OptimizerConfig. Returns step -> learning rate, peaking at `cfg.lr`.

    constant: lr. cosine: lr * (1 + cos(pi t / T)) / 2. warmup_cosine: linear from 0
    over `warmup_steps`, then cosine to 0. onecycle: Smith's one-cycle (linear ramp up
    for 30% of T from lr/25, then cosine down to lr/25e4), as in `optax.cosine_onecycle_schedule`.
    """
    if cfg.schedule == "constant":
        return optax.constant_schedule(cfg.lr)
    if cfg.schedule == "cosine":
        return optax.cosine_decay_schedule(cfg.lr, decay_steps=total_steps)
    if cfg.schedule == "warmup_cosine":
        if cfg.warmup_steps >= total_steps:  # a run no longer than its warmup: all warmup
            return optax.linear_schedule(0.0, cfg.lr, transition_steps=total_steps)
        return optax.warmup_cosine_decay_schedule(
            0.0, cfg.lr, warmup_steps=cfg.warmup_steps, decay_steps=total_steps
        )
    if cfg.schedule == "onecycle":
        return optax.cosine_onecycle_schedule(total_steps, cfg.lr)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")  # validate() catches this first


# Adam's decay rates are compile-time constants, not state: the optimizer state keeps the
# shape it had before they could be set, so older checkpoints restore.
BETAS = ("b1", "b2")


def make_optimizer(cfg, total_steps: int) -> optax.GradientTransformation:
    """cfg: OptimizerConfig. sgd (with momentum, optional L2-style decay), adam, adamw."""
    schedule = PeakSchedule(cfg.lr, make_schedule(dataclasses.replace(cfg, lr=1.0), total_steps))
    if cfg.name == "sgd":
        base = optax.inject_hyperparams(_sgd)(
            learning_rate=schedule, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    elif cfg.name == "adam":
        base = optax.inject_hyperparams(optax.adam, static_args=BETAS)(
            learning_rate=schedule, b1=cfg.b1, b2=cfg.b2
        )
    elif cfg.name == "adamw":
        base = optax.inject_hyperparams(optax.adamw, static_args=BETAS)(
            learning_rate=schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay
        )
    else:
        raise ValueError(f"unknown optimizer {cfg.name!r}")  # validate() catches this first
    if cfg.grad_clip is not None:
        return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), base)
    return base


def _sgd(learning_rate, momentum, weight_decay):
    # Weight decay added to the gradient before momentum: classic L2-regularised SGD.
    return optax.chain(
        optax.add_decayed_weights(weight_decay),
        optax.sgd(learning_rate, momentum=momentum),
    )


class PeakScheduleState(NamedTuple):
    peak: jax.Array  # float32 (): the schedule's peak learning rate, writable per model
    count: jax.Array  # int32 (): updates so far


class PeakSchedule:
    """An optax stateful schedule: `peak * unit(count)`, with `peak` held in its state.

    `inject_hyperparams` recomputes a scheduled hyperparameter from its schedule
    at every update, so writing `learning_rate` into the state would be undone;
    keeping the peak in the schedule's own state makes it a traced value instead
    of a compile-time constant. With `unit` = the schedule for a peak of 1 the
    learning rate is the same float32 product as the schedule built for `peak`
    (exactly so for constant, cosine and warmup_cosine, whose peak enters as one
    final multiplication; onecycle may differ in the last bit).
    """

    def __init__(self, peak: float, unit: optax.Schedule):
        self.peak, self.unit = peak, unit

    def init(self) -> PeakScheduleState:
        return PeakScheduleState(jnp.asarray(self.peak, jnp.float32), jnp.zeros([], jnp.int32))

    def update(self, state: PeakScheduleState, **extra_args) -> PeakScheduleState:
        return state._replace(count=optax.safe_increment(state.count))

    def __call__(self, state: PeakScheduleState, **extra_args) -> jax.Array:
        return state.peak * self.unit(state.count)


# Config field -> where its value lives in the injected optimizer state.
TRACED_HYPERPARAMS = {"lr": "learning_rate", "weight_decay": "weight_decay", "momentum": "momentum"}


def _injected(opt_state):
    """The injected-hyperparameter state inside `opt_state` (alone or in a chain)."""
    states = (opt_state,) if hasattr(opt_state, "hyperparams") else opt_state
    for i, s in enumerate(states):
        if hasattr(s, "hyperparams"):
            return i, s
    raise ValueError("optimizer state has no injected hyperparameters")


def set_hyperparams(opt_state, **values):
    """Returns `opt_state` with `lr`, `weight_decay` and/or `momentum` replaced.

    Values are float32 arrays shaped like the state's own (`()` for one model,
    `(N,)` for N stacked models). A value the optimizer does not use (momentum
    for adam) is skipped: it has no effect on training.
    """
    index, inj = _injected(opt_state)
    hyper, sched = dict(inj.hyperparams), dict(inj.hyperparams_states)
    for name, value in values.items():
        value = jnp.asarray(value, jnp.float32)
        if name == "lr":
            sched["learning_rate"] = sched["learning_rate"]._replace(peak=value)
        elif TRACED_HYPERPARAMS[name] in hyper:
            hyper[TRACED_HYPERPARAMS[name]] = value
    inj = inj._replace(hyperparams=hyper, hyperparams_states=sched)
    if index == 0 and hasattr(opt_state, "hyperparams"):
        return inj
    return type(opt_state)((*opt_state[:index], inj, *opt_state[index + 1 :]))


def current_learning_rate(opt_state) -> float | None:
    """The learning rate the last update used, found in injected hyperparameters."""
    states = (opt_state,) if hasattr(opt_state, "hyperparams") else opt_state
    for s in states:
        hyper = getattr(s, "hyperparams", None)
        if hyper and "learning_rate" in hyper:
            return hyper["learning_rate"]
    return None
