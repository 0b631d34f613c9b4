"""`--variants KEY=V1,V2,...`: one config field as a comparison axis of the benchmark.

Each value is the bench's config with that one field overridden (`config.apply_overrides`,
so the key and the values are type-checked exactly as `KEY=VALUE` overrides are), and
each variant is one measurement in the sweep mode; `measure` makes them side by side, their
timed windows interleaved (A B A B ...). Values are separated by commas; a tuple field
takes its elements separated by spaces within a value (`model.channels=16 32,32 64`).

Everything wrong is a `ConfigError` found before anything is measured: an unknown field
(`model.conv_impl` with the MLP, whose config has no such field), a value the field's type
or the config's validation refuses (a `conv_impl` that does not exist), two values that
give the same config, or a field the measurement does not depend on. That last test is
generic rather than a list of fields per model family: every value's training program
(the one the sweep mode runs) and the program that makes its initial state (parameters
and optimizer state: the learning rate lives there), both traced on abstract inputs, are
fingerprinted with the seed, and if all values give the same ones the comparison would
measure one thing several times, e.g. `train.epochs` (a bench window is one epoch
whatever it says).
Values that give the same program while others differ (`auto` and the formulation it
resolves to) are measured, and the rows say so.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.errors import ConfigError
from jaxmnist.training.step import TrainData, init_state, make_train_epoch, make_train_step

SYNTAX = "KEY=V1,V2[,...], e.g. model.conv_impl=xla,im2col"
# The schedule's length is part of the optimizer; any fixed length compares values alike.
_FINGERPRINT_STEPS = 1000


class Variant(NamedTuple):
    value: str  # as given on the command line
    cfg: config_lib.Config  # the bench's config with the field overridden
    same_as: str | None  # an earlier value with the same program and initial state


def parse_variants(text: str) -> tuple[str, tuple[str, ...]]:
    """'model.conv_impl=xla,im2col' -> ('model.conv_impl', ('xla', 'im2col')).

    ConfigError unless there is a key and at least two distinct values.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    values = tuple(v.strip() for v in raw.split(","))
    if not sep or not key or not all(values):
        raise ConfigError(f"variants: expected {SYNTAX}; got {text!r}")
    if len(values) < 2:
        raise ConfigError(f"variants {key}: a comparison needs at least two values, got {raw!r}")
    if len(set(values)) != len(values):
        raise ConfigError(f"variants {key}: values repeat in {raw!r}")
    return key, values


def variant_configs(
    cfg: config_lib.Config,
    key: str,
    values: tuple[str, ...],
    mode: str,
    input_shape: tuple[int, ...],
    num_classes: int,
) -> list[Variant]:
    """The validated config of each value, with what each one shares with the others.

    cfg: the bench's (validated) config; mode: the mode whose program is measured.
    Raises ConfigError for anything that makes the comparison wrong or empty (above).
    """
    cfgs: list[config_lib.Config] = []
    for value in values:
        try:
            variant = config_lib.apply_overrides(cfg, {key: value})
            config_lib.validate(variant)
        except ConfigError as e:
            raise ConfigError(f"variants {key}={value}: {e}") from None
        for other, seen in zip(values, cfgs):
            if seen == variant:
                raise ConfigError(
                    f"variants {key}: {other} and {value} give the same config; nothing to compare"
                )
        cfgs.append(variant)
    prints = [fingerprint(c, mode, input_shape, num_classes) for c in cfgs]
    if len(set(prints)) == 1:
        raise ConfigError(
            f"variants {key}: every value gives the same {mode} program and initial state "
            f"(the {cfg.model.name} model or the bench does not read {key}, or the values "
            f"resolve alike on {jax.default_backend()}); nothing to compare"
        )
    return [
        Variant(value, c, next((v for v, q in zip(values, prints[:i]) if q == p), None))
        for i, (value, c, p) in enumerate(zip(values, cfgs, prints))
    ]


def fingerprint(cfg, mode: str, input_shape: tuple[int, ...], num_classes: int) -> str:
    """SHA-256 of what a measurement of `cfg` in `mode` computes and starts from: the
    programs (jaxprs and their constants) of its step or epoch and of its initial state,
    traced on abstract inputs (nothing is compiled or run), and the seed."""
    optimizer = optim.make_optimizer(cfg.optimizer, _FINGERPRINT_STEPS)

    def initial_state(key):
        return init_state(key, cfg, optimizer, input_shape, num_classes)

    key = jax.eval_shape(lambda: jax.random.key(0))
    state = jax.eval_shape(initial_state, key)
    b = cfg.train.batch_size
    images = jax.ShapeDtypeStruct((b, *input_shape), jnp.uint8)
    labels = jax.ShapeDtypeStruct((b,), jnp.int32)
    if mode == "scan-epoch":
        run = jax.make_jaxpr(make_train_epoch(cfg, optimizer, 1))(
            state, key, TrainData(images, labels)
        )
    else:  # every other mode runs the step itself
        run = jax.make_jaxpr(make_train_step(cfg, optimizer))(state, images, labels)
    h = hashlib.sha256(f"seed {cfg.train.seed}".encode())
    for closed in (jax.make_jaxpr(initial_state)(key), run):
        # Function objects print with their address; the program does not depend on it.
        h.update(re.sub(r" at 0x[0-9a-fA-F]+", "", str(closed.jaxpr)).encode())
        for const in closed.consts:
            a = np.asarray(const)
            h.update(f"{a.dtype}{a.shape}".encode() + a.tobytes())
    return h.hexdigest()


def rows(variants: list[Variant], records: list[dict]) -> list[dict]:
    """The `variants.rows` of bench.json: each value's measurement, with its examples/s
    over the first value's and the value it shares a program with (or null)."""
    first = records[0]["examples_per_second"]["median"]
    return [
        {
            "value": v.value,
            **r,
            "examples_per_second_vs_first": r["examples_per_second"]["median"] / first,
            "same_program_as": v.same_as,
        }
        for v, r in zip(variants, records)
    ]


def table_lines(section: dict, timing_rows) -> list[str]:
    """The terminal table of the variants; `timing_rows(rows, first, key, quality)` draws
    the columns every comparison shares (from `output`)."""
    rows_ = section["rows"]
    r0 = rows_[0]
    title = (
        f"Variants of {section['key']}: {section['mode']}, batch {r0['batch_size']}, "
        f"{r0['dtype']} unless varied (timed windows interleaved)"
    )
    lines = ["", title]
    body = timing_rows(rows_, "value", lambda m: m["value"], quality=True)
    vs = f"vs {r0['value']}"
    width = max(10, len(vs))
    lines.append(f"{body[0]}  {vs:>{width}}")
    for m, line in zip(rows_, body[1:]):
        lines.append(f"{line}  {m['examples_per_second_vs_first']:>{width - 1}.2f}x")
    shared = [f"{m['value']} = {m['same_program_as']}" for m in rows_ if m["same_program_as"]]
    if shared:
        lines.append(f"(same program and initial state: {', '.join(shared)})")
    return lines
