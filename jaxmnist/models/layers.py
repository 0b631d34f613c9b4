"""What the model families share: activations, dropout, the running statistics' name.

Dropout is the inverted kind: in training each unit is zeroed with probability
`rate` and the survivors are scaled by 1 / (1 - rate), so inference (no key) is the
identity and needs no rescaling. A family applies it to the inputs of its dense
layers in training (`apply(..., key, train=True)`); evaluation, prediction and export
run inference, which never drops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}
STATS = "stats"  # the params entry of running statistics (batch norm): not trained, not counted


def dropout(key: jax.Array | None, x: jax.Array, rate: float, layer: int) -> jax.Array:
    """x with each element zeroed with probability `rate`, survivors scaled by
    1 / (1 - rate); unchanged when `key` is None or `rate` is 0. `layer` makes each
    layer's mask its own draw from the one key of the step."""
    if key is None or rate == 0:
        return x
    keep = jax.random.bernoulli(jax.random.fold_in(key, layer), 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))
