"""Optimizers and learning-rate schedules, built from Optax pieces.

`make_optimizer(cfg, total_steps)` returns one `optax.GradientTransformation`.
Hyperparameters are injected (`optax.inject_hyperparams`), so the learning rate
and weight decay live in the optimizer state as arrays: the current learning rate
can be logged, and a later sweep can vmap over them without recompiling.
"""

from __future__ import annotations

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
        return optax.warmup_cosine_decay_schedule(
            0.0, cfg.lr, warmup_steps=min(cfg.warmup_steps, total_steps), decay_steps=total_steps
        )
    if cfg.schedule == "onecycle":
        return optax.cosine_onecycle_schedule(total_steps, cfg.lr)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")  # validate() catches this first


def make_optimizer(cfg, total_steps: int) -> optax.GradientTransformation:
    """cfg: OptimizerConfig. sgd (with momentum, optional L2-style decay), adam, adamw."""
    schedule = make_schedule(cfg, total_steps)
    if cfg.name == "sgd":
        base = optax.inject_hyperparams(_sgd)(
            learning_rate=schedule, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    elif cfg.name == "adam":
        base = optax.inject_hyperparams(optax.adam)(learning_rate=schedule)
    elif cfg.name == "adamw":
        base = optax.inject_hyperparams(optax.adamw)(
            learning_rate=schedule, weight_decay=cfg.weight_decay
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


def current_learning_rate(opt_state) -> float | None:
    """The learning rate the last update used, found in injected hyperparameters."""
    states = (opt_state,) if hasattr(opt_state, "hyperparams") else opt_state
    for s in states:
        hyper = getattr(s, "hyperparams", None)
        if hyper and "learning_rate" in hyper:
            return hyper["learning_rate"]
    return None
