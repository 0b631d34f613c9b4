"""What the model families share: activations, dropout, the running statistics' name,
and the matmul of the compute dtype.

Dropout is the inverted kind: in training each unit is zeroed with probability
`rate` and the survivors are scaled by 1 / (1 - rate), so inference (no key) is the
identity and needs no rescaling. A family applies it to the inputs of its dense
layers in training (`apply(..., key, train=True)`); evaluation, prediction and export
run inference, which never drops.

`matmul` is `a @ b` in the compute dtype. In float32 it is exactly that. In bfloat16
it is the usual mixed-precision matmul, forward and backward: each dot reads bfloat16
operands and accumulates and returns float32 (`preferred_element_type`), and the result
is rounded to bfloat16 (its VJP is written out so that the backward dots also take the
cotangent in bfloat16, as tensor cores and the TPU's MXU need). On CPU that form is
what makes bfloat16 fast: XLA hands a bfloat16 x bfloat16 -> float32 dot of row-major
operands to YNNPACK's bfloat16 kernels (AVX512-BF16 where the CPU has it; AMX was
not measured), while it widens to float32 the operands of a bfloat16 -> bfloat16 dot, and of any dot
with a transposed operand (each backward matmul has one), and runs those at float32's
rate (`benchmarks/bf16_matmul.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxmnist import rng

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}
STATS = "stats"  # the params entry of running statistics (batch norm): not trained, not counted


def dropout(key: jax.Array | None, x: jax.Array, rate: float, layer: int) -> jax.Array:
    """x with each element zeroed with probability `rate`, survivors scaled by
    1 / (1 - rate); unchanged when `key` is None or `rate` is 0. `layer` makes each
    layer's mask its own draw from the one key of the step."""
    if key is None or rate == 0:
        return x
    keep = rng.flat(jax.random.bernoulli, jax.random.fold_in(key, layer), x.shape, p=1.0 - rate)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a (..., K) @ b (K, N) in a's dtype, accumulated in float32 (module docstring)."""
    if a.dtype == jnp.float32:
        return a @ b
    return _mixed_matmul(a, b)


def wide_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """a (M, K) @ b (K, N) with a float32 result whatever the operands' dtype."""
    return lax.dot(a, b, preferred_element_type=jnp.float32)


@jax.custom_vjp
def _mixed_matmul(a, b):
    rows = a.reshape(-1, a.shape[-1])
    return wide_dot(rows, b).astype(a.dtype).reshape(*a.shape[:-1], b.shape[-1])


def _mixed_matmul_fwd(a, b):
    return _mixed_matmul(a, b), (a, b)


def _mixed_matmul_bwd(residuals, g):
    a, b = residuals
    g = g.astype(a.dtype).reshape(-1, b.shape[-1])
    da = wide_dot(g, b.T).astype(a.dtype).reshape(a.shape)
    db = wide_dot(a.reshape(-1, a.shape[-1]).T, g).astype(b.dtype)
    return da, db


_mixed_matmul.defvjp(_mixed_matmul_fwd, _mixed_matmul_bwd)
