"""Staged batches: on an accelerator an epoch's batches are gathered (and augmented) by a
program of their own before the steps, which then only index them (`step.make_stage`).

Staging moves work between programs and changes nothing a run computes: the same seed
trains the same parameters, bit for bit on a CPU (a TPU may fuse the affine warp
differently in the two programs: within the lane's tolerance there), an epoch cut into
calls included. The memory estimate counts the staged epoch as kept for every model, and
a population stages only where that epoch is a small part of an accelerator's budget.
"""

import dataclasses
import types

import jax
import numpy as np
import pytest
from test_seeds import small_cfg

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.models import CNNConfig
from jaxmnist.training import memory, parallel
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import Population, seed_members

ON_CPU = jax.default_backend() == "cpu"


def _cnn_augmented(cfg):
    """A CNN with batch norm and dropout, trained on affine-warped images."""
    model = CNNConfig(channels=(4,), hidden=(8,), batch_norm=True, dropout=0.2)
    data = dataclasses.replace(cfg.data, augment=True, max_rotation=10.0, max_scale=0.1)
    return dataclasses.replace(cfg, model=model, data=data)


def _train(cfg, dataset, monkeypatch, staged: bool):
    monkeypatch.setattr(memory, "stages_batches", lambda *a, **k: staged)
    return train_population(cfg, seed_members(cfg), dataset)


@pytest.mark.accelerator
@pytest.mark.parametrize("family", ["mlp, one model", "augmented cnn, three models in parts"])
def test_staged_batches_train_the_same_models(tiny_dataset, monkeypatch, paced_by_steps, family):
    if family.startswith("mlp"):
        cfg = small_cfg()
    else:  # calls of 3 steps: each call's steps index the staged epoch where it left off
        cfg = _cnn_augmented(small_cfg(seeds=3, progress_every=3))
    inline = _train(cfg, tiny_dataset, monkeypatch, staged=False)
    staged = _train(cfg, tiny_dataset, monkeypatch, staged=True)
    assert staged.population.staged and not inline.population.staged
    assert "stage" in staged.population.compile_times
    assert "stage" not in inline.population.compile_times
    same = (
        np.testing.assert_array_equal
        if ON_CPU
        else lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    )
    for a, b in zip(
        jax.tree.leaves(inline.population.params(inline.states)),
        jax.tree.leaves(staged.population.params(staged.states)),
        strict=True,
    ):
        same(a, b)
    for a, b in zip(inline.records, staged.records, strict=True):  # the batches' own figures
        for key in ("train_loss", "train_batch_accuracy", "test_loss"):
            same(a[key], b[key])


def _population(cfg, dataset, staged: bool) -> Population:
    plan = config_lib.plan_steps(cfg.train, len(dataset.train_labels))
    return Population(
        cfg,
        optim.make_optimizer(cfg.optimizer, plan.total_steps),
        seed_members(cfg),
        (cfg.train.seeds,),
        dataset.train_images.shape[1:],
        10,
        len(plan.epoch_steps),
        parallel.build_layout(1),
        staged=staged,
    )


def test_the_estimate_keeps_a_staged_epoch_for_every_model(tiny_dataset):
    """The staged epoch (uint8 images and int32 labels of every step) is resident per
    model, beside what an unstaged population keeps; the `stage` program returns the plan
    it was given with them, whose int32 indices it counts once more."""
    cfg = small_cfg(seeds=2)
    steps = config_lib.plan_steps(cfg.train, len(tiny_dataset.train_labels)).steps_per_epoch
    ests = {
        staged: memory.estimate_for(
            cfg, _population(cfg, tiny_dataset, staged), steps, tiny_dataset, (2,)
        )
        for staged in (False, True)
    }
    pixels = int(np.prod(tiny_dataset.train_images.shape[1:]))
    examples = steps * cfg.train.batch_size
    extra = ests[True].resident_per_model - ests[False].resident_per_model
    # CPU estimates are scaled by the runtime factor (memory.CPU_RUNTIME_FACTOR).
    expected = examples * (pixels + 4 + 4) * (memory.CPU_RUNTIME_FACTOR if ON_CPU else 1)
    assert extra == pytest.approx(expected, rel=1e-4)  # and a few bytes of its outputs list


def _layout(platform: str, members: int = 1):
    device = types.SimpleNamespace(platform=platform)
    mesh = types.SimpleNamespace(devices=np.array([device] * members))
    return types.SimpleNamespace(mesh=mesh, members=members)


@pytest.mark.parametrize(
    "platform, budget_mb, models, members, stages",
    [
        ("cpu", 10**6, 1, 1, False),  # never on a CPU, however much memory
        ("tpu", 100, 1, 1, False),  # one model's 45 MB > a quarter of 100 MB
        ("tpu", 1000, 4, 1, True),  # 180 MB <= 250 MB
        ("tpu", 1000, 8, 1, False),  # 361 MB > 250 MB
        ("tpu", 1000, 8, 2, True),  # 4 on each device: 180 MB
        ("gpu", 1000, 5, 1, True),  # 225 MB
    ],
)
def test_a_population_stages_where_an_epoch_is_a_small_part_of_the_budget(
    platform, budget_mb, models, members, stages
):
    cfg = dataclasses.replace(small_cfg(), memory_budget_mb=budget_mb)
    mnist = (60000, 28, 28)  # an epoch of it: 60,000 x (784 + 4) bytes, 45 MB (2**20) a model
    assert memory.stages_batches(cfg, _layout(platform, members), models, mnist) is stages
