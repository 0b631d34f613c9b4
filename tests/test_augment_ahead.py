"""Batches augmented ahead: on a TPU, as an epoch starts, a program of its own gathers and
augments every step's batch (`step.make_augmented_batches`), and the steps' program only
indexes them (`population.Population(augment_ahead=True)`, `population.augments_ahead`).

It moves the augmentation and changes nothing a run computes: exact moves (translations,
flips, erasing) give the same batches and the same seed trains the same parameters bit for
bit, for one model or several, with plans drawn on the host or on the mesh, staged or
not, an epoch cut into calls and a shorter last epoch included. An interpolated pixel
of a warp, rounded to uint8, may round the other way where the compiler arranges its
arithmetic differently (one in 25,000 here). The memory estimate counts the augmented
epoch as kept for every model.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_accelerator import host_plans
from test_seeds import small_cfg
from test_stage import population_on_one_device

from jaxmnist import config as config_lib
from jaxmnist.models import CNNConfig
from jaxmnist.training import memory, population, step
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members


def _augmented_cnn(cfg, warps: bool = False):
    """A CNN with batch norm and dropout, trained on translated, flipped, erased images
    (`warps`: affine-warped instead of translated)."""
    model = CNNConfig(channels=(4,), hidden=(8,), batch_norm=True, dropout=0.2)
    moves = {"max_rotation": 10.0, "max_scale": 0.1} if warps else {}
    data = dataclasses.replace(cfg.data, augment=True, max_shift=2, flip=True, erase=0.5, **moves)
    return dataclasses.replace(cfg, model=model, data=data)


def _translated_mlp(cfg):
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, augment=True, max_shift=2))


def _train(cfg, dataset, monkeypatch, ahead: bool, staged: bool = False):
    monkeypatch.setattr(population, "augments_ahead", lambda cfg, platform, models: ahead)
    monkeypatch.setattr(memory, "stages_batches", lambda *a, **k: staged)
    return train_population(cfg, seed_members(cfg), dataset)


@pytest.mark.accelerator
@pytest.mark.parametrize(
    "case",
    [
        "augmented cnn, three models in parts, plans on the mesh",
        "augmented cnn, three models in parts, plans on the host",
        "translated mlp, one model staged on the host, a shorter last epoch",
    ],
)
def test_batches_augmented_ahead_train_the_same_models(
    tiny_dataset, monkeypatch, paced_by_steps, case
):
    if case.startswith("augmented cnn"):  # calls of 3 steps: each indexes where it left off
        cfg = _augmented_cnn(small_cfg(seeds=3, progress_every=3))
    else:  # epochs of 6 steps: the third runs 3 of its plan's steps
        cfg = _translated_mlp(small_cfg(epochs=None, steps=15, batch_size=96))
    host_plans(monkeypatch, not case.endswith("on the mesh"))
    staged = "staged" in case
    inline = _train(cfg, tiny_dataset, monkeypatch, ahead=False, staged=staged)
    ahead = _train(cfg, tiny_dataset, monkeypatch, ahead=True, staged=staged)
    assert ahead.population.augment_ahead and not inline.population.augment_ahead
    assert ahead.info["augmented_ahead"] and not inline.info["augmented_ahead"]
    assert ahead.population.staged == inline.population.staged == staged
    assert "augment" in ahead.info["compile_programs"]
    assert "augment" not in inline.info["compile_programs"]
    for a, b in zip(
        jax.tree.leaves(inline.population.params(inline.states)),
        jax.tree.leaves(ahead.population.params(ahead.states)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    assert len(ahead.records) == len(inline.records) > 1
    for a, b in zip(inline.records, ahead.records, strict=True):  # the batches' own figures
        for key in ("train_loss", "train_batch_accuracy", "test_loss"):
            assert a[key] == b[key]


@pytest.mark.parametrize(("staged", "warps"), [(False, True), (True, False)])
def test_an_augmented_plan_holds_the_batches_of_its_steps_and_nothing_else(
    tiny_dataset, staged, warps
):
    cfg = _augmented_cnn(small_cfg(), warps)
    images = jnp.asarray(tiny_dataset.train_images)
    data = step.TrainData(images, jnp.asarray(tiny_dataset.train_labels, jnp.int32))
    num_steps = 6
    plan = step.make_epoch_plan(cfg, len(images), num_steps, staged=staged)(jax.random.key(3), data)
    made = step.make_augmented_batches(cfg, staged=staged)(plan, data, 2, 5)
    ahead = plan._replace(images=made[0], labels=made[1])
    batch = jax.jit(step.make_batch(cfg, staged=staged))  # compiled, as the steps make it
    for i in range(num_steps):
        if 2 <= i < 5:  # the steps that run: each the batch a step would make
            want_images, want_labels = batch(plan, data, i)
        else:
            want_images = np.zeros_like(ahead.images[i])
            want_labels = np.zeros_like(ahead.labels[i])
        got, want = np.asarray(ahead.images[i], int), np.asarray(want_images, int)
        if warps:  # a rounded interpolation may differ by one level, in few pixels
            assert np.abs(got - want).max() <= 1
            assert np.mean(got != want) < 1e-3
        else:
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(ahead.labels[i], want_labels)
    # The steps read them as they are: not augmented twice.
    read = step.make_batch(cfg, staged=True, augmented=True)(ahead, data, 3)
    np.testing.assert_array_equal(read[0], ahead.images[3])


def test_several_models_augment_ahead_on_a_tpu_where_their_data_are_augmented():
    cfg = _augmented_cnn(small_cfg())
    plain = small_cfg()
    assert population.augments_ahead(cfg, "tpu", 2)
    assert not population.augments_ahead(cfg, "tpu", 1)
    assert not population.augments_ahead(plain, "tpu", 2)
    assert not population.augments_ahead(cfg, "cpu", 2)
    assert not population.augments_ahead(cfg, "gpu", 2)


def _programs(cfg, dataset, ahead: bool):
    plan = config_lib.plan_steps(cfg.train, len(dataset.train_labels))
    pop = population_on_one_device(cfg, dataset, augment_ahead=ahead)
    train, evals = memory.abstract_data(cfg, dataset, pop.layout)
    block = next(iter(evals.values()))[0]
    return plan, pop.chunk_programs(len(pop), plan.steps_per_epoch, train, block)


def test_the_estimate_keeps_the_augmented_epoch_for_every_model(tiny_dataset):
    cfg = _translated_mlp(small_cfg(seeds=2))
    plan, inline = _programs(cfg, tiny_dataset, ahead=False)
    _, ahead = _programs(cfg, tiny_dataset, ahead=True)
    kept = memory.chunk_memory(ahead, 2).resident - memory.chunk_memory(inline, 2).resident
    h, w = tiny_dataset.train_images.shape[1:]
    # every step's images (uint8) and labels (int32), for each of the 2 models, and the
    # few bytes of the output's tuple
    epoch = plan.steps_per_epoch * cfg.train.batch_size * (h * w + 4)
    assert 0 <= kept - 2 * epoch <= 64
