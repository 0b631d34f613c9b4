"""The training core: models, optimizers, the compiled epoch, exact evaluation."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.errors import TrainingError
from jaxmnist.models import count_params, mlp
from jaxmnist.timing import compile_count
from jaxmnist.train import train_and_evaluate
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training.loop import place_train_data
from jaxmnist.training.step import (
    EpochMetrics,
    empty_metrics,
    init_state,
    make_epoch_plan,
    make_train_epoch,
    make_train_step,
    make_train_steps,
)


def small_cfg(**train):
    cfg = config_lib.get_preset("tpu101")
    train = {"batch_size": 32, "epochs": 2, "eval_batch_size": 64, **train}
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, **train), compile_cache=False
    )


@pytest.mark.parametrize("preset, expected", [("tpu101", 203_530), ("codelab", 235_146)])
def test_parameter_count_is_pinned(preset, expected):
    cfg = config_lib.get_preset(preset)
    params = mlp.init(jax.random.key(0), cfg.model)
    assert count_params(params) == expected


def test_he_init_and_zero_biases():
    cfg = config_lib.get_preset("codelab").model
    params = mlp.init(jax.random.key(1), cfg)
    for layer in params:
        fan_in = layer["w"].shape[0]
        assert layer["w"].dtype == jnp.float32
        assert float(jnp.std(layer["w"])) == pytest.approx(math.sqrt(2 / fan_in), rel=0.1)
        assert not np.any(np.asarray(layer["b"]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_apply_shapes_and_float32_logits(dtype):
    cfg = dataclasses.replace(mlp.MLPConfig(hidden=(64, 32), activation="gelu"), dtype=dtype)
    params = mlp.init(jax.random.key(0), cfg)
    logits = mlp.apply(params, jnp.zeros((5, 28, 28), jnp.float32), cfg)
    assert logits.shape == (5, 10) and logits.dtype == jnp.float32
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))


def test_flops_per_example_counts_matmuls():
    cfg = mlp.MLPConfig(hidden=(256,))
    macs1, macs2 = 784 * 256, 256 * 10
    # forward 2*(m1+m2); backward: weight grads 2*(m1+m2), input grad of layer 2 only.
    assert mlp.flops_per_example(cfg) == 4 * (macs1 + macs2) + 2 * macs2


def _setup(cfg, dataset):
    optimizer = optim.make_optimizer(cfg.optimizer, 100)
    state = init_state(jax.random.key(0), cfg, optimizer, (28, 28), 10)
    data = place_train_data(dataset.train_images, dataset.train_labels)
    return optimizer, state, data


@pytest.mark.accelerator
def test_scanned_epoch_equals_python_loop(tiny_dataset):
    cfg = small_cfg()
    optimizer, state, data = _setup(cfg, tiny_dataset)
    num_steps = len(tiny_dataset.train_labels) // cfg.train.batch_size
    epoch = make_train_epoch(cfg, optimizer, num_steps)
    key = jax.random.key(3)
    scanned, metrics = jax.jit(epoch)(state, key, data)

    step = jax.jit(make_train_step(cfg, optimizer))
    perm = np.asarray(jax.random.permutation(key, len(tiny_dataset.train_labels)))
    looped, losses = state, []
    for i in range(num_steps):
        idx = perm[i * cfg.train.batch_size : (i + 1) * cfg.train.batch_size]
        looped, (loss, _) = step(looped, data.images[idx], data.labels[idx])
        losses.append(loss)
    for a, b in zip(jax.tree.leaves(scanned), jax.tree.leaves(looped)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics.loss, np.array(losses), rtol=1e-5)


@pytest.mark.parametrize(
    "augment, dropout", [(False, 0.0), (True, 0.0), (True, 0.3)], ids=["plain", "augment", "drop"]
)
@pytest.mark.accelerator
def test_epoch_in_parts_equals_whole_epoch_bit_for_bit(tiny_dataset, augment, dropout):
    """The run loop cuts epochs into calls wherever its pacing says: any cut must give
    exactly the one-call epoch's parameters, optimizer state and metrics."""
    cfg = small_cfg()
    cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, augment=augment, flip=augment),
        model=dataclasses.replace(cfg.model, dropout=dropout),
    )
    optimizer, state, data = _setup(cfg, tiny_dataset)
    num_steps = len(tiny_dataset.train_labels) // cfg.train.batch_size
    key = jax.random.key(3)
    whole = jax.jit(make_train_epoch(cfg, optimizer, num_steps))(state, key, data)
    plan = jax.jit(make_epoch_plan(cfg, len(tiny_dataset.train_labels), num_steps))(key)
    steps = jax.jit(make_train_steps(cfg, optimizer))
    for cuts in ([0, 1, 7, num_steps], [0, 5, 6, 13, num_steps]):
        parts, metrics = state, empty_metrics(num_steps)
        for a, b in itertools.pairwise(cuts):
            parts, metrics = steps(parts, metrics, plan, data, a, b)
        for x, y in zip(jax.tree.leaves((parts, metrics)), jax.tree.leaves(whole), strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.accelerator
def test_second_epoch_does_not_recompile(tiny_dataset):
    cfg = small_cfg()
    optimizer, state, data = _setup(cfg, tiny_dataset)
    epoch = jax.jit(make_train_epoch(cfg, optimizer, 10), donate_argnums=0)
    # The bench's compile counter: one listener for the whole process (clearing JAX's
    # listeners here would blind it for every later test).
    before = compile_count()
    state, _ = epoch(state, jax.random.key(0), data)
    first = compile_count()
    state, _ = epoch(state, jax.random.key(1), data)
    assert first > before and compile_count() == first
    assert epoch._cache_size() == 1


@pytest.mark.accelerator
def test_masked_evaluation_matches_numpy_on_ragged_set(tiny_dataset):
    cfg = mlp.MLPConfig(hidden=(32,))
    params = mlp.init(jax.random.key(5), cfg)
    images, labels = tiny_dataset.test_images[:37], tiny_dataset.test_labels[:37]
    data = evaluate_lib.place_eval_data(images, labels, 8)  # 5 batches, 3 padded rows
    assert data.arrays.mask.shape == (5, 8) and int(data.arrays.mask.sum()) == 37
    result = evaluate_lib.compile_evaluate(cfg, params, data, 10)(params, data)

    x = images.reshape(37, -1).astype(np.float64) / 255.0
    for layer in params[:-1]:
        x = np.maximum(x @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"]), 0)
    logits = x @ np.asarray(params[-1]["w"], np.float64) + np.asarray(params[-1]["b"])
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    pred = logits.argmax(1)
    assert result.count == 37
    assert result.loss == pytest.approx(-logp[np.arange(37), labels].mean(), rel=1e-4)
    assert result.accuracy == pytest.approx((pred == labels).mean())
    expected = np.zeros((10, 10), np.int64)
    np.add.at(expected, (labels, pred), 1)
    np.testing.assert_array_equal(result.confusion, expected)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("schedule", ["constant", "cosine", "warmup_cosine", "onecycle"])
def test_optimizers_and_schedules_step(name, schedule):
    cfg = config_lib.OptimizerConfig(
        name=name,
        lr=1e-2,
        schedule=schedule,
        warmup_steps=3,
        grad_clip=1.0,
        weight_decay=0.0 if name == "adam" else 1e-4,
    )
    opt = optim.make_optimizer(cfg, total_steps=10)
    params = {"w": jnp.ones((3,))}
    state = opt.init(params)
    for step in range(4):
        updates, state = opt.update({"w": jnp.ones((3,))}, state, params)
        params = optax.apply_updates(params, updates)
        lr = optim.current_learning_rate(state[1])  # state[0] is the clipping state
        assert float(lr) == pytest.approx(float(optim.make_schedule(cfg, 10)(step)))
    assert np.all(np.asarray(params["w"]) < 1)  # descended along the gradient


def test_schedule_shapes():
    cfg = config_lib.OptimizerConfig(lr=1.0, schedule="warmup_cosine", warmup_steps=10)
    s = optim.make_schedule(cfg, 100)
    assert (
        float(s(0)) == 0.0
        and float(s(10)) == pytest.approx(1.0)
        and float(s(100)) == pytest.approx(0.0)
    )
    cos = optim.make_schedule(dataclasses.replace(cfg, schedule="cosine"), 100)
    assert float(cos(50)) == pytest.approx(0.5)


@pytest.mark.parametrize("total_steps", [1, 3, 10])
def test_a_run_no_longer_than_its_warmup_only_warms_up(total_steps):
    # `--steps 3 optimizer.warmup_steps=10` (or as many steps as the warmup) trains; it
    # raised optax's ValueError when no decay step was left.
    cfg = config_lib.OptimizerConfig(lr=1.0, schedule="warmup_cosine", warmup_steps=10)
    s = optim.make_schedule(cfg, total_steps)
    rates = [float(s(step)) for step in range(total_steps + 1)]
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(1.0)
    assert np.all(np.diff(rates) > 0)  # rising at every step


def test_plan_steps_is_the_one_place_durations_become_steps():
    codelab = config_lib.get_preset("codelab").train
    plan = config_lib.plan_steps(codelab, 60_000)
    assert plan.steps_per_epoch == 117 and plan.epoch_steps == (117, 117, 117, 49)
    assert plan.total_steps == 400
    tpu = config_lib.plan_steps(config_lib.get_preset("tpu101").train, 60_000)
    assert tpu.epoch_steps == (468,) * 5


def test_train_and_evaluate_learns_and_writes_run(tiny_dataset, tmp_path):
    summary = train_and_evaluate(small_cfg(epochs=4), tmp_path / "run", dataset=tiny_dataset)
    assert summary["num_test_examples"] == 150
    assert summary["test_accuracy"] > 0.8  # the classes are trivially separable
    assert summary["steps"] == 4 * (640 // 32)
    for name in (
        "config.json",
        "environment.json",
        "metrics.jsonl",
        "summary.json",
        "confusion_matrix.json",
        "params.npz",
        "step_loss.csv",
    ):
        assert (tmp_path / "run" / name).is_file(), name


def test_non_finite_loss_stops_with_clear_error(tiny_dataset, tmp_path):
    cfg = small_cfg()
    cfg = dataclasses.replace(
        cfg, optimizer=dataclasses.replace(cfg.optimizer, name="sgd", lr=1e30)
    )
    with pytest.raises(TrainingError, match=r"non-finite at step \d+ \(epoch 1.*learning rate"):
        train_and_evaluate(cfg, tmp_path / "run", dataset=tiny_dataset)
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.accelerator
def test_bfloat16_training_keeps_float32_params(tiny_dataset):
    cfg = small_cfg(epochs=1)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="bfloat16"))
    optimizer, state, data = _setup(cfg, tiny_dataset)
    state, metrics = jax.jit(make_train_epoch(cfg, optimizer, 5))(state, jax.random.key(0), data)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state.params))
    assert metrics.loss.dtype == jnp.float32 and np.all(np.isfinite(metrics.loss))
    assert isinstance(metrics, EpochMetrics)


def test_loss_matches_optax_reference():
    cfg = config_lib.get_preset("tpu101")
    optimizer = optim.make_optimizer(cfg.optimizer, 10)
    state = init_state(jax.random.key(0), cfg, optimizer, (28, 28), 10)
    images = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 784)), jnp.uint8)
    labels = jnp.array([1, 2, 3, 4], jnp.int32)
    _, (loss, _) = make_train_step(cfg, optimizer)(state, images, labels)
    logits = mlp.apply(state.params, images.astype(jnp.float32) / 255.0, cfg.model)
    expected = optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, 10)).mean()
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)


def test_pacing_fits_calls_to_the_target_and_to_checkpoint_steps():
    from jaxmnist.training.pacing import Pacer

    pacer = Pacer(every=(50,), target_seconds=0.5)
    assert pacer.next_stop(0, 468, 0) == 1  # nothing timed yet: one step
    pacer.record(1, 0.01)  # 10 ms per step: 50 per call, and 50 is also the checkpoint
    assert pacer.next_stop(1, 468, 1) == 50  # ends on the multiple of 50, not at 51
    pacer.record(49, 0.049)  # 1 ms per step: 500 steps fit in 0.5 s
    assert Pacer(target_seconds=0.5).next_stop(0, 468, 0) == 1
    fast = Pacer(target_seconds=0.5)
    fast.record(10, 0.01)
    assert fast.next_stop(0, 468, 0) == 468  # the whole epoch in one call
    assert fast.next_stop(0, 600, 0) == 600  # 100 left after 500 is a sliver: one call
    assert fast.next_stop(0, 700, 0) == 500
    assert fast.epoch_seconds(700) == pytest.approx(0.7)


def test_the_full_training_sets_loss_has_one_name_in_metrics_and_eval(
    train_argv, tiny_data_dir, tmp_path, capsys
):
    """metrics.jsonl's `train_loss` is the epoch's mean batch loss; the full training set's
    loss after the epoch is `train_set_loss` there, and `jaxmnist eval --json` gives the
    same figure under the same name (its `train_loss`, kept, is that figure too)."""
    import json

    from jaxmnist.cli import main

    run = tmp_path / "run"
    assert main([*train_argv(run, "--epochs", "2", "--quiet", "--no-report")]) == 0
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_loss"] == last["train_loss"]  # the batch loss, as before
    assert summary["train_set_loss"] == last["train_set_loss"]  # the full set's, beside it
    capsys.readouterr()
    assert main(["eval", str(run), "--data-dir", str(tiny_data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["train_set_loss"] == result["train_loss"]
    assert last["train_set_loss"] == pytest.approx(result["train_set_loss"], rel=1e-5)
    assert last["train_set_loss"] != pytest.approx(last["train_loss"], rel=1e-5)
