"""Label smoothing (`train.label_smoothing`): the training loss against smoothed targets.

With a > 0 the step's loss is the cross-entropy against `optax.smooth_labels` targets
(1 - a + a / C on the label, a / C elsewhere); with 0 the step is today's integer-label
program, unchanged. Values outside [0, 1) are refused in one line (tests/test_ema.py
checks both fractions of the training config).
"""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from test_seeds import small_cfg

from jaxmnist import optim
from jaxmnist.models import train_apply_uint8
from jaxmnist.training.step import init_state, make_train_step

CLASSES = 10


def _smoothing(cfg, alpha: float):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, label_smoothing=alpha))


def _batch(tiny_arrays, n: int = 8):
    return tiny_arrays["train_images"][:n], tiny_arrays["train_labels"][:n].astype(np.int32)


def _setup(cfg, images):
    optimizer = optim.make_optimizer(cfg.optimizer, 10)
    state = init_state(jax.random.key(0), cfg, optimizer, images.shape[1:], CLASSES)
    return optimizer, state


def _numpy_loss(logits: np.ndarray, labels: np.ndarray, alpha: float) -> float:
    """The mean cross-entropy against smoothed one-hot targets, by hand in float64."""
    z = logits.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    targets = np.full(logits.shape, alpha / CLASSES)
    targets[np.arange(len(labels)), labels] += 1 - alpha
    return float(-(targets * log_p).sum(-1).mean())


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.3])
def test_the_steps_loss_is_the_smoothed_cross_entropy(tiny_arrays, alpha):
    cfg = _smoothing(small_cfg(), alpha)
    images, labels = _batch(tiny_arrays)
    optimizer, state = _setup(cfg, images)
    _, (loss, _) = jax.jit(make_train_step(cfg, optimizer))(state, images, labels)
    logits, _ = train_apply_uint8(state.params, images, cfg.model)
    expected = _numpy_loss(np.asarray(logits), labels, alpha)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    if alpha:  # and not the plain cross-entropy
        assert abs(float(loss) - _numpy_loss(np.asarray(logits), labels, 0.0)) > 1e-3


def test_no_smoothing_is_todays_integer_label_program(tiny_arrays):
    """label_smoothing=0 lowers to exactly the step as it was before the field existed:
    the integer-label cross-entropy, no one-hot targets."""
    cfg = small_cfg()
    assert cfg.train.label_smoothing == 0.0
    images, labels = _batch(tiny_arrays)
    optimizer, state = _setup(cfg, images)

    def make_reference_step():  # the step before label smoothing, as it was written
        def loss_fn(params, images, labels, key):
            logits, stats = train_apply_uint8(params, images, cfg.model, key)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, (logits, stats)

        def step(state, images, labels, key=None):
            (loss, (logits, _)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                state.params, images, labels, key
            )
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            correct = jax.numpy.sum(jax.numpy.argmax(logits, -1) == labels, dtype=jax.numpy.int32)
            return type(state)(state.step + 1, params, opt_state), (loss, correct)

        return step

    ours = jax.jit(make_train_step(cfg, optimizer)).lower(state, images, labels).as_text()
    reference = jax.jit(make_reference_step()).lower(state, images, labels).as_text()
    assert ours == reference
    smoothed = make_train_step(_smoothing(cfg, 0.1), optimizer)
    assert jax.jit(smoothed).lower(state, images, labels).as_text() != reference
