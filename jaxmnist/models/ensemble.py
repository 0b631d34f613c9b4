"""An ensemble of S models of one family: the mean of their class probabilities.

What a run of several seeds predicts as one model, for `predict`, `export` and
`serve` (`use.predict`); training evaluates the same mean in its own pass over an
evaluation set (`training.evaluate.with_ensemble`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxmnist.models import apply_uint8


def ensemble_log_probs(model_cfg, params: Any, images: jax.Array, chunks: int = 1) -> jax.Array:
    """The log of an ensemble's class probabilities, float32 (B, C), for uint8 images
    (B, H, W[, C]): the mean of the softmax probabilities of the S members stacked on
    `params`' leading axis, as logsumexp over the members of their log-softmax minus
    log S (so that no member's vanishing probability underflows the ensemble's). With
    `chunks` (a divisor of S) above 1, the members run S / chunks at a time, one chunk
    after another in a loop (`lax.scan`), and the chunks' sums add as `logaddexp`: the
    program then holds one chunk's activations, not every member's. Pure."""
    members = jax.tree.leaves(params)[0].shape[0]
    if members % chunks:
        raise ValueError(f"{chunks} chunks do not divide an ensemble of {members}")

    def log_sums(stacked):
        logits = jax.vmap(lambda p: apply_uint8(p, images, model_cfg))(stacked)
        return jax.nn.logsumexp(jax.nn.log_softmax(logits, axis=-1), axis=0)

    if chunks == 1:
        return log_sums(params) - jnp.log(members)
    split = jax.tree.map(lambda x: x.reshape(chunks, members // chunks, *x.shape[1:]), params)
    shape = jax.eval_shape(log_sums, jax.tree.map(lambda x: x[0], split))
    start = jnp.full(shape.shape, -jnp.inf, shape.dtype)  # the log of no probability yet
    total, _ = jax.lax.scan(
        lambda t, chunk: (jnp.logaddexp(t, log_sums(chunk)), None), start, split
    )
    return total - jnp.log(members)
