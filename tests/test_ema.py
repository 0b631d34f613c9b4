"""A moving average of the parameters (`train.ema_decay`): kept while training, used for
evaluation and as the saved model.

After each step the average moves towards the new parameters (batch norm's statistics
included) with the decay `ema_decay_at` gives; it never changes what training computes.
Evaluation after each epoch, the saved parameters (so `eval`, `predict`, `export` and
`serve`) and the checkpoints use it; 0 keeps the state as it was before the field
existed. Values outside [0, 1) are refused in one line, as for the other fraction of
the training config, `train.label_smoothing` (both checked here).
"""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest
from test_seeds import small_cfg

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.cli import main
from jaxmnist.models import CNNConfig
from jaxmnist.training.step import ema_decay_at, init_state, make_train_step, model_params

CLASSES = 10
QUIET = ("--quiet", "--no-report", "--no-compile-cache")


def _ema(cfg, decay: float):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, ema_decay=decay))


def _cnn(cfg):
    model = CNNConfig(channels=(4,), hidden=(8,), batch_norm=True)
    return dataclasses.replace(cfg, model=model)


def _steps(cfg, tiny_arrays, n: int):
    """The state after each of `n` steps on the first batches of the tiny set."""
    images = tiny_arrays["train_images"]
    labels = tiny_arrays["train_labels"].astype(np.int32)
    optimizer = optim.make_optimizer(cfg.optimizer, n)
    state = init_state(jax.random.key(0), cfg, optimizer, images.shape[1:], CLASSES)
    step = jax.jit(make_train_step(cfg, optimizer))
    states = [state]
    for i in range(n):
        batch = slice(16 * i, 16 * (i + 1))
        state, _ = step(state, images[batch], labels[batch])
        states.append(state)
    return states


@pytest.mark.parametrize("family", ["mlp", "cnn with batch norm"])
def test_the_average_follows_each_step_and_never_steers_training(tiny_arrays, family):
    cfg = small_cfg() if family == "mlp" else _cnn(small_cfg())
    decay, n = 0.9, 12
    averaged = _steps(_ema(cfg, decay), tiny_arrays, n)
    plain = _steps(cfg, tiny_arrays, n)
    for a, b in zip(averaged, plain, strict=True):  # the same training, bit for bit
        assert b.ema is None
        for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
            np.testing.assert_array_equal(x, y)
    # The average by hand, in float64, over the parameters after each step.
    expected = jax.tree.map(lambda x: np.asarray(x, np.float64), averaged[0].params)
    for t, s in enumerate(averaged[1:]):
        d = min(decay, (1 + t) / (10 + t))
        expected = jax.tree.map(
            lambda e, p, d=d: d * e + (1 - d) * np.asarray(p), expected, s.params
        )
    final = averaged[-1]
    leaves = jax.tree.leaves(final.ema)
    assert len(leaves) == len(jax.tree.leaves(final.params))  # statistics included
    for got, want in zip(leaves, jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert model_params(final) is final.ema and model_params(plain[-1]) is plain[-1].params
    moved = [not np.allclose(e, p) for e, p in zip(leaves, jax.tree.leaves(final.params))]
    assert any(moved)  # an average, not a copy of the parameters


def test_the_decay_rises_to_its_value_as_steps_are_averaged():
    assert float(ema_decay_at(0.999, 0.0)) == pytest.approx(0.1)
    assert float(ema_decay_at(0.999, 90.0)) == pytest.approx(0.91)
    assert float(ema_decay_at(0.9, 1000.0)) == pytest.approx(0.9)


def test_no_average_keeps_the_state_as_it_was(tiny_arrays):
    """ema_decay=0: no moving average in the state, so checkpoints keep their layout."""
    cfg = small_cfg()
    assert cfg.train.ema_decay == 0.0
    state = _steps(cfg, tiny_arrays, 1)[-1]
    assert state.ema is None
    parts = (state.step, state.params, state.opt_state)
    assert len(jax.tree.leaves(state)) == len(jax.tree.leaves(parts))


def test_a_run_is_evaluated_saved_and_resumed_with_its_average(tiny_data_dir, tmp_path, capsys):
    def train(run, *extra):
        argv = ["train", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--run-dir"]
        argv += [str(run), "--batch-size", "32", "train.ema_decay=0.9", *extra, *QUIET]
        assert main(argv) == 0

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(whole, "--epochs", "2")
    train(parts, "--epochs", "1")
    # A run read from its checkpoint (no params.npz yet) is its average too.
    stopped = tmp_path / "stopped"
    shutil.copytree(parts, stopped)
    (stopped / "params.npz").unlink()
    losses = []
    for run in (parts, stopped):
        capsys.readouterr()
        assert main(["eval", str(run), "--json"]) == 0
        losses.append(json.loads(capsys.readouterr().out)["test_loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert main(["train", "--resume", str(parts), "--epochs", "2", *QUIET]) == 0
    saved = np.load(whole / "params.npz")
    resumed = np.load(parts / "params.npz")
    assert sorted(saved.files) == sorted(resumed.files)
    for name in saved.files:  # the average was checkpointed and resumed, bit for bit
        np.testing.assert_array_equal(saved[name], resumed[name])
    summary = json.loads((whole / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(whole), "--json"]) == 0  # the saved model is what was evaluated
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["test_accuracy"] == summary["test_accuracy"]
    assert evaluated["test_loss"] == pytest.approx(summary["test_loss"], rel=1e-5)
    # and it is the average: training the same run without one saves other parameters.
    train(tmp_path / "plain", "--epochs", "2", "train.ema_decay=0")
    plain = np.load(tmp_path / "plain" / "params.npz")
    assert any(not np.array_equal(saved[n], plain[n]) for n in saved.files)


FRACTIONS = [("train.ema_decay", 0.99), ("train.label_smoothing", 0.1)]


@pytest.mark.parametrize("key, value", FRACTIONS)
def test_config_lists_the_field(capsys, key, value):
    assert main(["config", f"{key}={value}"]) == 0
    section, field = key.split(".")
    assert json.loads(capsys.readouterr().out)[section][field] == value
    # A run saved before the field existed reads as off (no average, no smoothing).
    old = config_lib.Config().to_dict()
    del old[section][field]
    assert getattr(config_lib.from_dict(old).train, field) == 0.0


@pytest.mark.parametrize("key", [key for key, _ in FRACTIONS])
@pytest.mark.parametrize("bad", ["-0.1", "1.0", "nan"])
def test_a_bad_fraction_is_one_line_and_exit_2(tiny_data_dir, tmp_path, capsys, key, bad):
    run = tmp_path / "run"
    argv = [
        "train", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--run-dir", str(run),
        "--epochs", "1", *QUIET, f"{key}={bad}",
    ]  # fmt: skip
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and f"{key} must be in [0, 1)" in err[0], err
    assert not captured.out and not run.exists()
