"""The training set's evaluation on a fixed subset (`train.eval_train_examples`), and the
evaluation sets' host memory: aligned, padded once, shared with the training data."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import numpy_mlp_figures

from jaxmnist import config as config_lib
from jaxmnist.cli import main
from jaxmnist.data import formats
from jaxmnist.report.describe import summary_rows
from jaxmnist.report.rundata import load_run
from jaxmnist.runs import resume
from jaxmnist.train import train_and_evaluate
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training import parallel
from jaxmnist.training.hooks import Callback
from jaxmnist.training.loop import place_train_data, setup_run
from jaxmnist.training.population import seed_members
from jaxmnist.use.reevaluate import evaluate_run


def tiny_cfg(**train) -> config_lib.Config:
    """tpu101 on the tiny dataset (registered as `tiny` by the `tiny_data_dir` fixture)."""
    cfg = config_lib.get_preset("tpu101")
    train = {"batch_size": 32, "epochs": 2, "eval_batch_size": 64, **train}
    return dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, dataset="tiny"),
        train=dataclasses.replace(cfg.train, **train),
        compile_cache=False,
    )


# --- the subset ---------------------------------------------------------------------------


def test_subset_is_stratified_sorted_and_fixed():
    labels = np.repeat(np.arange(10, dtype=np.uint8), [50, 80, 30, 100, 60, 70, 90, 40, 20, 100])
    labels = np.random.default_rng(3).permutation(labels)
    idx = evaluate_lib.subset_indices(labels, 64)
    assert idx.shape == (64,) and len(set(idx.tolist())) == 64
    assert np.all(np.diff(idx) > 0) and idx.min() >= 0 and idx.max() < len(labels)
    share = np.bincount(labels, minlength=10) * 64 / len(labels)
    counts = np.bincount(labels[idx], minlength=10)
    assert np.all(np.abs(counts - share) < 1), (counts, share)
    np.testing.assert_array_equal(idx, evaluate_lib.subset_indices(labels, 64))  # fixed
    assert not np.array_equal(idx, evaluate_lib.subset_indices(labels, 64, seed=1))


@pytest.mark.parametrize("n, subset", [(None, False), (639, True), (640, False), (10**6, False)])
def test_n_at_least_the_training_set_is_the_full_set(n, subset):
    train = dataclasses.replace(config_lib.TrainConfig(), eval_train_examples=n)
    labels = np.arange(640) % 10
    idx = evaluate_lib.train_eval_indices(train, labels)
    facts = evaluate_lib.train_eval_facts(train, 640)
    assert (idx is not None) == subset
    assert facts["train_eval_examples"] == (n if subset else 640)
    assert ("train_eval_subset_seed" in facts) == subset
    assert evaluate_lib.train_eval_facts(dataclasses.replace(train, eval_train=False), 640) == {}


class EpochParams(Callback):
    """Each epoch's record and the first member's parameters, as the epoch left them."""

    def __init__(self):
        self.seen = []

    def on_epoch_end(self, end):
        params = jax.device_get(end.population.member_params(end.states, 0))
        self.seen.append((dict(end.record), params))


def test_run_evaluates_the_same_recorded_subset_every_epoch(tiny_dataset, tiny_data_dir, tmp_path):
    ds = tiny_dataset
    cfg = tiny_cfg(epochs=3, eval_train_examples=100)
    spy = EpochParams()
    summary = train_and_evaluate(cfg, tmp_path / "run", dataset=ds, callbacks=[spy])
    idx = evaluate_lib.subset_indices(ds.train_labels, 100, evaluate_lib.SUBSET_SEED)
    x, y = ds.train_images[idx], ds.train_labels[idx]
    assert len(spy.seen) == 3
    for record, params in spy.seen:  # each epoch: exactly these 100 examples, exactly counted
        assert record["train_eval_examples"] == 100
        loss, accuracy = numpy_mlp_figures(params, x, y)
        assert record["train_accuracy"] == pytest.approx(accuracy)
        assert record["train_set_loss"] == pytest.approx(loss, rel=1e-4)
        assert record["eval_seconds"] >= record["train_eval_seconds"] > 0
    assert summary["train_eval_examples"] == 100 and summary["train_eval_subset_seed"] == 0
    environment = json.loads((tmp_path / "run" / "environment.json").read_text())
    assert environment["train_eval_examples"] == 100
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["train_eval_examples"] for line in lines] == [100] * 3

    # `jaxmnist eval` evaluates that subset again, and says so; the report names it too.
    again = evaluate_run(tmp_path / "run", tiny_data_dir)
    assert again["train_set"] == "train subset of 100" and again["num_train_examples"] == 100
    assert again["train_accuracy"] == pytest.approx(summary["train_accuracy"])
    rows = {label: text for label, text, _ in summary_rows(load_run(tmp_path / "run"))}
    assert "train subset of 100, seed 0" in rows["Train accuracy"]


def test_full_set_run_is_recorded_as_the_full_set(tiny_dataset, tiny_data_dir, tmp_path):
    cfg = tiny_cfg(epochs=1, eval_train_examples=640)
    summary = train_and_evaluate(cfg, tmp_path / "run", dataset=tiny_dataset)
    assert summary["train_eval_examples"] == 640 and "train_eval_subset_seed" not in summary
    again = evaluate_run(tmp_path / "run", tiny_data_dir)
    assert again["train_set"] == "full training set" and again["num_train_examples"] == 640
    rows = {label: text for label, text, _ in summary_rows(load_run(tmp_path / "run"))}
    assert "(full training set)" in rows["Train accuracy"]


def test_estimate_shapes_match_the_placed_subset(tiny_dataset, tiny_data_dir):
    from jaxmnist.training import memory, parallel

    cfg = tiny_cfg(eval_train_examples=100)
    _, evals = memory.abstract_data(cfg, tiny_dataset, parallel.build_layout(1))
    run = setup_run(cfg, seed_members(cfg), tiny_dataset)
    placed = run.eval_sets["train"].blocks
    for a, b in zip(jax.tree.leaves(evals["train"]), jax.tree.leaves(placed), strict=True):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
    assert run.eval_sets["train"].count == 100


# --- bad values and old runs --------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_bad_subset_size_exits_2_with_one_line(value, train_argv, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(train_argv(run_dir, f"train.eval_train_examples={value}"))
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and "train.eval_train_examples" in err, err
    assert not run_dir.exists()


def test_configs_and_runs_without_the_field_still_load(tiny_dataset, tiny_data_dir, tmp_path):
    old = tiny_cfg(epochs=1).to_dict()
    del old["train"]["eval_train_examples"]  # a config.json written before the field
    assert config_lib.from_dict(old).train.eval_train_examples is None

    path = tmp_path / "run"
    train_and_evaluate(config_lib.from_dict(old), path, dataset=tiny_dataset)
    (path / "config.json").write_text(json.dumps(old))
    assert evaluate_run(path, tiny_data_dir)["train_set"] == "full training set"
    # A resume may set it (each metrics line says what it covers) and extend the run.
    cfg, extended = resume.prepare(path, {"train.epochs": 2, "train.eval_train_examples": 100})
    assert cfg.train.eval_train_examples == 100 and extended


# --- host memory: aligned, padded once, shared ---------------------------------------------


def test_padded_and_subset_arrays_are_aligned_and_go_to_the_device_in_place(tiny_dataset):
    images, labels = tiny_dataset.test_images, tiny_dataset.test_labels
    ragged = evaluate_lib.pad_eval_data(images[:37], labels[:37], 8)  # 3 padded rows
    subset = evaluate_lib.pad_eval_data(images, labels, 64, indices=np.arange(0, 150, 3))
    for data in (ragged, subset):
        for x in data:
            assert x.ctypes.data % formats.ALIGNMENT == 0 and not x.flags.writeable
            assert np.shares_memory(np.asarray(jax.device_put(x)), x)
    np.testing.assert_array_equal(subset.images.reshape(-1, 28, 28)[:50], images[::3])
    np.testing.assert_array_equal(subset.labels.reshape(-1)[:50], labels[::3])
    assert int(subset.mask.sum()) == 50 and not subset.images.reshape(-1, 28, 28)[50:].any()


def test_unpadded_training_set_evaluation_shares_the_training_data(tiny_dataset):
    images = formats.aligned(tiny_dataset.train_images)  # as load_dataset returns it
    train = place_train_data(images, tiny_dataset.train_labels)
    placed = evaluate_lib.place_eval_data(images, tiny_dataset.train_labels, 64)  # 10 x 64
    assert placed.arrays.images.shape == (10, 64, 28, 28)
    host = np.asarray(placed.arrays.images)
    assert np.shares_memory(host, images) and np.shares_memory(host, np.asarray(train.images))
    # As a run places it: 5 blocks of 2 x 64, each a view of the training data.
    layout = parallel.build_layout(1)
    blocks = evaluate_lib.place_eval_blocks(images, tiny_dataset.train_labels, (64, 2), layout)
    assert len(blocks.blocks) == 5 and blocks.count == 640
    for i, block in enumerate(blocks.blocks):
        assert block.images.shape == (2, 64, 28, 28)
        host = np.asarray(block.images)
        assert np.shares_memory(host, images[i * 128 : (i + 1) * 128])


@pytest.mark.parametrize(
    ("counts", "batch", "expected"),
    [
        ((150, 640), 64, (64, 3)),  # the smallest set fills 3 batches
        ((150, 640, 100), 64, (64, 2)),
        ((37, 20), 64, (37, 1)),  # batches capped at the largest set
        ((20, 37), 8, (8, 3)),
        ((10000, 60000), 2000, (2000, 5)),
    ],
)
def test_every_set_is_cut_into_blocks_of_one_shape(counts, batch, expected):
    assert evaluate_lib.block_shape(counts, batch) == expected
    assert evaluate_lib.block_shape(counts, batch, multiple=4)[0] % 4 == 0


def test_blocks_hold_every_real_example_once_in_order_and_mask_the_padding(tiny_dataset):
    images, labels = tiny_dataset.train_images, tiny_dataset.train_labels
    for indices in (None, np.arange(0, 640, 7)):
        n = 640 if indices is None else len(indices)
        blocks = evaluate_lib.eval_blocks(images, labels, 64, 3, indices)
        assert all(b.images.shape == (3, 64, 28, 28) for b in blocks)
        assert len(blocks) == -(-n // 192)
        mask = np.concatenate([b.mask for b in blocks]).reshape(-1)
        got = np.concatenate([b.images for b in blocks]).reshape(-1, 28, 28)
        got_labels = np.concatenate([b.labels for b in blocks]).reshape(-1)
        assert mask[:n].all() and not mask[n:].any()
        want = slice(None) if indices is None else indices
        np.testing.assert_array_equal(got[:n], images[want])
        np.testing.assert_array_equal(got_labels[:n], labels[want])
        assert not got[n:].any()


def test_terminal_and_eval_say_train_subset(train_argv, tiny_data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(train_argv(run_dir, "--epochs", "1", "train.eval_train_examples=100")) == 0
    out = capsys.readouterr().out
    assert "train acc: train subset of 100 examples (stratified, seed 0" in out, out
    assert main(["eval", str(run_dir), "--data-dir", str(tiny_data_dir)]) == 0
    assert "(train subset of 100, seed 0)" in capsys.readouterr().out
    assert main(["eval", str(run_dir), "--data-dir", str(tiny_data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["train_set"] == "train subset of 100" and result["num_train_examples"] == 100


def test_eval_draws_the_subset_from_what_the_validation_split_left(
    tiny_dataset, tiny_data_dir, tmp_path
):
    """With data.validation too, training's subset is drawn from the examples left after
    the split; `jaxmnist eval` draws the same one (drawn from the whole set, it evaluated
    other examples, and on some runs indexed past the end)."""
    ds = tiny_dataset
    cfg = tiny_cfg(epochs=1, eval_train_examples=500)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, validation=100))
    summary = train_and_evaluate(cfg, tmp_path / "run", dataset=ds)
    assert summary["train_eval_examples"] == 500 and summary["num_val_examples"] == 100
    again = evaluate_run(tmp_path / "run", tiny_data_dir)
    assert again["num_train_examples"] == 500
    assert again["train_accuracy"] == pytest.approx(summary["train_accuracy"])
    assert again["train_loss"] == pytest.approx(summary["train_set_loss"], rel=1e-5)
