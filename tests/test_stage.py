"""Staged batches: where plans are drawn on the host (a TPU), the host's CPU gathers every
step's images as it draws the epoch's plan, and the steps' program only indexes them
(`step.make_epoch_plan(staged=True)`, `population.Population(staged=True)`).

Staging moves the gather and changes nothing a run computes: the same seed trains the
same parameters bit for bit (a gather is exact), with plans drawn on the host or on the
mesh, an epoch cut into calls included. The memory estimate counts the staged epochs as
kept for every model (this epoch's and, drawn on the host, the next's), and a population
stages only where plans are drawn on the host and those epochs are a small part of the
budget.
"""

import dataclasses

import jax
import numpy as np
import pytest
from test_accelerator import host_plans
from test_seeds import small_cfg

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.models import CNNConfig
from jaxmnist.training import memory, parallel
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import Population, seed_members


def _cnn_augmented(cfg):
    """A CNN with batch norm and dropout, trained on affine-warped images."""
    model = CNNConfig(channels=(4,), hidden=(8,), batch_norm=True, dropout=0.2)
    data = dataclasses.replace(cfg.data, augment=True, max_rotation=10.0, max_scale=0.1)
    return dataclasses.replace(cfg, model=model, data=data)


def _train(cfg, dataset, monkeypatch, staged: bool):
    monkeypatch.setattr(memory, "stages_batches", lambda *a, **k: staged)
    return train_population(cfg, seed_members(cfg), dataset)


@pytest.mark.accelerator
@pytest.mark.parametrize("where", ["host", "mesh"])
@pytest.mark.parametrize("family", ["mlp, one model", "augmented cnn, three models in parts"])
def test_staged_batches_train_the_same_models(
    tiny_dataset, monkeypatch, paced_by_steps, family, where
):
    if family.startswith("mlp"):
        cfg = small_cfg(epochs=3)
    else:  # calls of 3 steps: each call's steps index the staged epoch where it left off
        cfg = _cnn_augmented(small_cfg(seeds=3, progress_every=3))
    host_plans(monkeypatch, where == "host")
    inline = _train(cfg, tiny_dataset, monkeypatch, staged=False)
    staged = _train(cfg, tiny_dataset, monkeypatch, staged=True)
    assert staged.population.staged and not inline.population.staged
    assert staged.info["staged_batches"] and not inline.info["staged_batches"]
    for a, b in zip(
        jax.tree.leaves(inline.population.params(inline.states)),
        jax.tree.leaves(staged.population.params(staged.states)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(inline.records, staged.records, strict=True):  # the batches' own figures
        for key in ("train_loss", "train_batch_accuracy", "test_loss"):
            assert a[key] == b[key]


def population_on_one_device(cfg, dataset, **options) -> Population:
    """A population of `cfg`'s seeds on one device (`options`: `Population`'s keywords)."""
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
        **options,
    )


@pytest.mark.parametrize("where, epochs_kept", [("mesh", 1), ("host", 2)])
def test_the_estimate_keeps_the_staged_epochs_for_every_model(
    tiny_dataset, monkeypatch, where, epochs_kept
):
    """The staged epoch (uint8 images and int32 labels of every step) is resident per
    model, beside what an unstaged population keeps; drawn on the host, the next epoch's
    plan is on the mesh too."""
    host_plans(monkeypatch, where == "host")
    cfg = small_cfg(seeds=2)
    steps = config_lib.plan_steps(cfg.train, len(tiny_dataset.train_labels)).steps_per_epoch
    ests = {
        staged: memory.estimate_for(
            cfg,
            population_on_one_device(cfg, tiny_dataset, staged=staged),
            steps,
            tiny_dataset,
            (2,),
        )
        for staged in (False, True)
    }
    pixels = int(np.prod(tiny_dataset.train_images.shape[1:]))
    examples = steps * cfg.train.batch_size
    extra = ests[True].resident_per_model - ests[False].resident_per_model
    # CPU estimates are scaled by the runtime factor (memory.CPU_RUNTIME_FACTOR).
    factor = memory.CPU_RUNTIME_FACTOR if jax.default_backend() == "cpu" else 1
    expected = epochs_kept * examples * (pixels + 4) * factor
    assert extra == pytest.approx(expected, rel=1e-4)  # and a few bytes of its outputs list


@pytest.mark.parametrize(
    "host, budget_mb, models, stages",
    [
        (False, 10**6, 1, False),  # plans drawn on the mesh: never, however much memory
        (True, None, 1, False),  # a budget not known: never
        (True, 100, 1, False),  # one model's two epochs, 90 MB > a quarter of 100 MB
        (True, 1000, 1, True),  # 90 MB <= 250 MB
        (True, 1000, 2, False),  # two models: the host's gathers outrun their steps
        (True, 1000, 4, False),  # one on each of 4 devices: the host still gathers for 4
    ],
)
def test_a_population_of_one_model_stages_where_plans_are_drawn_on_the_host(
    host, budget_mb, models, stages
):
    budget = None if budget_mb is None else budget_mb * memory.MB
    mnist = (60000, 28, 28)  # an epoch of it: 60,000 x (784 + 4) bytes, 45 MB (2**20)
    assert memory.stages_batches(budget, models, mnist, host) is stages


def test_a_population_is_told_to_stage_before_it_compiles(tiny_dataset):
    pop = population_on_one_device(small_cfg(), tiny_dataset, staged=False)
    pop.stage_batches()
    assert pop.staged
    steps = config_lib.plan_steps(small_cfg().train, len(tiny_dataset.train_labels))
    train, evals = memory.abstract_data(small_cfg(), tiny_dataset, pop.layout)
    pop.chunk_programs(1, steps.steps_per_epoch, train, evals["test"][0])
    with pytest.raises(RuntimeError, match="compiled already"):
        pop.stage_batches()
