"""The epoch's random order: `jax.random.permutation`'s, bit for bit, drawn faster on CPU.

`jax.random.permutation(key, n)` shuffles by sorting: in each of a few rounds (two for a
training set of 60,000) it draws a fresh 32-bit random key per element and sorts the
elements by it, stably, with `lax.sort_key_val`. On the CPU, XLA sorts a key and a
value together through a generic comparison loop, several times slower than its sort of
one array of numbers; for a population, whose every member shuffles every epoch, that
sort becomes a sizeable part of the epoch.

`permutation` draws the same keys from the same key splits and computes the same stable
order from one-operand sorts: a least-significant-digit radix sort, each pass sorting
numbers that hold one digit of the key above the element's position, so the digit
decides and the position breaks ties in the order of the pass before. Two passes of 16
bits order up to 65,536 elements; larger sets take narrower digits and more passes, up
to 2^24 elements, past which (and off the CPU, where sorts of key-value pairs are
cheap to run) it is `jax.random.permutation` itself. A TPU compiles any sort of tens of
thousands of elements for seconds, so there the run draws its plans with this on the
host's CPU (`population.Population`). The result is the library's exactly
(tests/test_shuffle.py compares them, ties among the keys included), so a run's data
order, and every figure measured with it, is unchanged; `benchmarks/shuffle.py` (in the
history, at 4b115f5) measured the difference (docs/results.md, "Decided").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

KEY_BITS = 32  # the random keys of each round: `jax.random.bits`' uint32
MAX_RADIX_ELEMENTS = 2**24  # positions of 24 bits leave digits of 8: four passes at most
# `jax.random.permutation`'s rounds: enough that all keys are distinct in some round
# with high probability (its source explains the heuristic; the test pins the count).
_ROUNDS_EXPONENT = 3


def rounds(n: int) -> int:
    """How many sorts `jax.random.permutation` makes to shuffle `n` elements."""
    return math.ceil(_ROUNDS_EXPONENT * math.log(max(1, n)) / math.log(2**KEY_BITS - 1))


def stable_argsort(keys: jax.Array) -> jax.Array:
    """int32 indices that sort uint32 `keys` (..., n) along the last axis, equal keys in
    their original order (numpy's `argsort(kind="stable")`); n <= MAX_RADIX_ELEMENTS."""
    n = keys.shape[-1]
    if n > MAX_RADIX_ELEMENTS:
        raise ValueError(f"stable_argsort sorts at most {MAX_RADIX_ELEMENTS} keys, got {n}")
    position_bits = max(1, (n - 1).bit_length())
    digit_bits = KEY_BITS - position_bits
    position = jnp.arange(n, dtype=jnp.uint32)
    order = None
    for low in range(0, KEY_BITS, digit_bits):
        current = keys if order is None else jnp.take_along_axis(keys, order, axis=-1)
        width = min(digit_bits, KEY_BITS - low)
        digit = (current >> low) & jnp.uint32(2**width - 1)
        packed = jnp.sort((digit << position_bits) | position, axis=-1)
        step = (packed & jnp.uint32(2**position_bits - 1)).astype(jnp.int32)
        order = step if order is None else jnp.take_along_axis(order, step, axis=-1)
    return order


def permutation(key: jax.Array, n: int, platform: str | None = None) -> jax.Array:
    """`jax.random.permutation(key, n)`, bit for bit and in its integer dtype (module
    docstring); `platform`: where the program runs ("cpu", "tpu", ...), by default JAX's
    default backend."""
    if n > MAX_RADIX_ELEMENTS or (platform or jax.default_backend()) != "cpu":
        return jax.random.permutation(key, n)
    x = jnp.arange(n)
    for _ in range(rounds(n)):
        key, subkey = jax.random.split(key)
        x = x[stable_argsort(jax.random.bits(subkey, (n,), jnp.uint32))]
    return x
