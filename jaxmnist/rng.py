"""`jax.random`'s draws, drawn as one flat vector and reshaped: the same values, compiled
faster by XLA:CPU.

`jax.random` numbers the elements of a draw in row-major order and derives each one's
bits from its number, so a draw of shape (n,) reshaped to `shape` is, bit for bit, the
draw of `shape` itself (tests/test_rng.py checks it for every sampler used here). What
differs is the program: XLA:CPU compiles the random-bit generator and the transform
after it over one axis in a fraction of the time it takes over several, most of all
when the last axis is short (a dense layer's 10 outputs, a 3×3 kernel's channels). A
model's initialisation is one such draw per weight, and dropout and augmentation draw
inside every training step (`benchmarks/compile_time.py` measures whole runs' compiles).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax


def flat(draw: Callable, key: jax.Array, shape: tuple[int, ...], **kwargs) -> jax.Array:
    """`draw(key, shape=shape, **kwargs)` (a `jax.random` sampler taking `shape`), drawn
    flat and reshaped: the same array (module docstring)."""
    shape = tuple(shape)
    return draw(key, shape=(math.prod(shape),), **kwargs).reshape(shape)
