"""Augmentation inside the compiled epoch: reproducible from the seed, its own draw per
member, per epoch and per step, and off by default."""

import dataclasses
import json

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist.models import conv
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members


def cfg_with(augment: bool, seeds: int = 1):
    cfg = config_lib.get_preset("tpu101")
    return dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, augment=augment, max_shift=2),
        train=dataclasses.replace(
            cfg.train, batch_size=32, epochs=2, seeds=seeds, eval_batch_size=64, seed=3
        ),
        compile_cache=False,
    )


def train(cfg, dataset):
    r = train_population(cfg, seed_members(cfg), dataset)
    return r, r.population.params(r.states)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_augmented_training_is_reproducible_and_really_augments(tiny_dataset):
    a, pa = train(cfg_with(True), tiny_dataset)
    _, pb = train(cfg_with(True), tiny_dataset)
    plain, pp = train(cfg_with(False), tiny_dataset)
    for x, y in zip(leaves(pa), leaves(pb), strict=True):
        np.testing.assert_array_equal(x, y)  # the same seed, the same moves
    assert not all(np.array_equal(x, y) for x, y in zip(leaves(pa), leaves(pp), strict=True))
    # Same batches (the permutation keeps the epoch key), different pixels: the first
    # step's loss differs from the plain run's.
    assert a.records[0]["train_loss"] != plain.records[0]["train_loss"]


def test_each_member_draws_its_own_moves_as_if_alone(tiny_dataset):
    """Member i of a vmapped population augments exactly as seed i trained alone."""
    _, pair = train(cfg_with(True, seeds=2), tiny_dataset)
    alone_cfg = dataclasses.replace(
        cfg_with(True), train=dataclasses.replace(cfg_with(True).train, seed=4)
    )
    _, alone = train(alone_cfg, tiny_dataset)
    for x, y in zip(leaves(pair), leaves(alone), strict=True):
        np.testing.assert_allclose(x[1], y[0], rtol=1e-4, atol=1e-5)
        assert not np.allclose(x[0], x[1])


def test_a_cnn_with_augmentation_trains_and_evaluates_end_to_end(train_argv, tmp_path, capsys):
    from jaxmnist.cli import main

    run = tmp_path / "run"
    argv = train_argv(run, "--model", "cnn", "--hidden", "32", "--no-report", "--json")
    assert main([*argv, "model.channels=8,16", "data.augment=true"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["test_accuracy"] > 0.5 and summary["num_params"] > 0
    # The formulation `auto` chose is on record: oneDNN's on this one-device CPU where
    # jaxmnist-onednn is installed, else im2col.
    assert json.loads((run / "environment.json").read_text())["conv_impl"] == conv.resolve("auto")
    assert main(["eval", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test_accuracy"] == summary["test_accuracy"]


def test_every_step_of_an_epoch_augments_with_its_own_key_from_the_plan(tiny_dataset, monkeypatch):
    """Step i moves its batch with the plan's key i: not one key for the whole epoch, not a
    constant, not a key of its own making. A spy on `augment` records each key it is called
    with while the compiled epoch runs."""
    from jaxmnist import optim
    from jaxmnist.training import step as step_lib
    from jaxmnist.training.loop import place_train_data

    cfg = cfg_with(True)
    num_steps = 6
    seen = []
    real_augment = step_lib.augment

    def spy(key, images, data_cfg):
        jax.debug.callback(
            lambda k: seen.append(tuple(np.asarray(k).tolist())), jax.random.key_data(key)
        )
        return real_augment(key, images, data_cfg)

    monkeypatch.setattr(step_lib, "augment", spy)
    optimizer = optim.make_optimizer(cfg.optimizer, 100)
    state = step_lib.init_state(jax.random.key(0), cfg, optimizer, (28, 28), 10)
    data = place_train_data(tiny_dataset.train_images, tiny_dataset.train_labels)
    plan_fn = step_lib.make_epoch_plan(cfg, len(tiny_dataset.train_labels), num_steps)
    plan = plan_fn(jax.random.key(3))
    planned = [tuple(row) for row in np.asarray(plan.keys).tolist()]
    assert len(set(planned)) == num_steps  # the plan draws a different key for each step
    other_epoch = {tuple(row) for row in np.asarray(plan_fn(jax.random.key(4)).keys).tolist()}
    assert not other_epoch & set(planned)  # and another epoch's key draws other ones

    steps = jax.jit(step_lib.make_train_steps(cfg, optimizer))
    out = steps(state, step_lib.empty_metrics(num_steps), plan, data, 0, num_steps)
    jax.block_until_ready(out)
    jax.effects_barrier()
    assert sorted(seen) == sorted(planned)


def test_the_report_shows_augmented_examples_and_only_when_augmenting(
    train_argv, tiny_arrays, tmp_path
):
    from jaxmnist.cli import main

    moved = tmp_path / "moved"
    argv = train_argv(moved, "--epochs", "1", "data.augment=true", "data.max_rotation=15")
    assert main([*argv, "data.max_scale=0.1", "data.max_shear=10"]) == 0
    with np.load(moved / "augmented_examples.npz") as f:
        images, labels = f["images"], f["labels"]
    first = [int(np.argmax(tiny_arrays["train_labels"] == c)) for c in range(10)]
    np.testing.assert_array_equal(images[:10], tiny_arrays["train_images"][first])  # as stored
    assert list(labels) == list(tiny_arrays["train_labels"][first]) * 3
    assert not np.array_equal(images[10:20], images[:10])  # then moved
    page = (moved / "report.html").read_text()
    assert 'id="augmentation"' in page and "as augmentation moved it twice" in page

    plain = tmp_path / "plain"
    assert main(train_argv(plain, "--epochs", "1")) == 0
    assert not (plain / "augmented_examples.npz").exists()
    assert 'id="augmentation"' not in (plain / "report.html").read_text()

    (moved / "augmented_examples.npz").write_bytes(b"not a zip")  # damaged: one line, exit 1
    assert main(["report", str(moved)]) == 1
