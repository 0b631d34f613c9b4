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


def ensemble_log_probs(model_cfg, params: Any, images: jax.Array) -> jax.Array:
    """The log of an ensemble's class probabilities, float32 (B, C), for uint8 images
    (B, H, W[, C]): the mean of the softmax probabilities of the S members stacked on
    `params`' leading axis, as logsumexp over the members of their log-softmax minus
    log S (so that no member's vanishing probability underflows the ensemble's). Pure."""
    logits = jax.vmap(lambda p: apply_uint8(p, images, model_cfg))(params)
    log_sums = jax.nn.logsumexp(jax.nn.log_softmax(logits, axis=-1), axis=0)
    return log_sums - jnp.log(logits.shape[0])
