"""The validation split (`data.validation`): held out of training, stratified and fixed by
a recorded seed, evaluated every epoch as `val_*`; sweeps rank by it, and
`--target-split val` stops on it."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import numpy_mlp_figures

from jaxmnist import config as config_lib
from jaxmnist.cli import main
from jaxmnist.runs import resume
from jaxmnist.search import sweep
from jaxmnist.train import train_and_evaluate
from jaxmnist.training import validation
from jaxmnist.training.hooks import Callback, EpochEnd, Evaluation
from jaxmnist.training.loop import TargetAccuracy, setup_run
from jaxmnist.training.population import seed_members
from jaxmnist.use.reevaluate import evaluate_run


def tiny_cfg(validation=100, **train) -> config_lib.Config:
    """tpu101 on the tiny dataset (640 training examples), `validation` held out."""
    cfg = config_lib.get_preset("tpu101")
    train = {"batch_size": 32, "epochs": 2, "eval_batch_size": 64, **train}
    return dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, dataset="tiny", validation=validation),
        train=dataclasses.replace(cfg.train, **train),
        compile_cache=False,
    )


# --- the split ----------------------------------------------------------------------------


def test_held_out_examples_are_stratified_and_fixed_by_the_recorded_seed():
    labels = np.repeat(np.arange(10, dtype=np.uint8), [50, 80, 30, 100, 60, 70, 90, 40, 20, 100])
    labels = np.random.default_rng(3).permutation(labels)
    idx = validation.validation_indices(labels, 64)
    assert idx.shape == (64,) and np.all(np.diff(idx) > 0)
    share = np.bincount(labels, minlength=10) * 64 / len(labels)
    assert np.all(np.abs(np.bincount(labels[idx], minlength=10) - share) < 1)
    np.testing.assert_array_equal(idx, validation.validation_indices(labels, 64))  # fixed
    facts = validation.validation_facts(64)
    assert facts == {"validation_examples": 64, "validation_seed": validation.VALIDATION_SEED}
    from jaxmnist.training.evaluate import subset_indices

    np.testing.assert_array_equal(idx, subset_indices(labels, 64, facts["validation_seed"]))
    assert validation.validation_indices(labels, 0) is None and validation.validation_facts(0) == {}


def test_the_run_trains_on_the_rest_only(tiny_dataset):
    ds = tiny_dataset
    cfg = tiny_cfg(validation=100, eval_train_examples=200)
    run = setup_run(cfg, seed_members(cfg), ds)
    val_idx = validation.validation_indices(ds.train_labels, 100)
    rest = np.setdiff1d(np.arange(640), val_idx)
    placed = np.asarray(run.train_data.images)
    assert placed.shape == (540, 28, 28) and len(np.asarray(run.train_data.labels)) == 540
    np.testing.assert_array_equal(placed, ds.train_images[rest])  # none of the 100 is there
    np.testing.assert_array_equal(np.asarray(run.train_data.labels), ds.train_labels[rest])
    assert run.plan.steps_per_epoch == 540 // 32  # fewer steps: the set is smaller
    assert run.eval_sets["val"].count == 100
    val = run.eval_sets["val"].blocks
    images, mask = (
        np.concatenate([np.asarray(getattr(b, f)) for b in val]) for f in ("images", "mask")
    )
    got = images.reshape(-1, 28, 28)[mask.reshape(-1)]
    np.testing.assert_array_equal(got, ds.train_images[val_idx])
    # The training subset evaluated each epoch is drawn from the rest, never from the 100.
    train = run.eval_sets["train"].blocks
    images, mask = (
        np.concatenate([np.asarray(getattr(b, f)) for b in train]) for f in ("images", "mask")
    )
    subset = images.reshape(-1, 28, 28)[mask.reshape(-1)]
    assert len(subset) == 200
    held = {ds.train_images[i].tobytes() for i in val_idx}
    assert not held & {x.tobytes() for x in subset}
    assert run.info["validation_examples"] == 100 and run.info["validation_seed"] == 1
    # The memory estimate's shapes are the placed ones.
    from jaxmnist.training import memory, parallel

    abstract_train, evals = memory.abstract_data(cfg, ds, parallel.build_layout(1))
    assert abstract_train.images.shape == placed.shape
    for a, b in zip(jax.tree.leaves(evals["val"]), jax.tree.leaves(val), strict=True):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)


class EpochParams(Callback):
    """Each epoch's record and every member's parameters, as the epoch left them."""

    def __init__(self):
        self.seen = []

    def on_epoch_end(self, end):
        pop = end.population
        params = [jax.device_get(pop.member_params(end.states, i)) for i in range(len(pop))]
        self.seen.append((dict(end.record), params))


@pytest.mark.slow
def test_val_metrics_are_the_models_figures_on_the_held_out_examples(
    tiny_dataset, tiny_data_dir, tmp_path
):
    ds = tiny_dataset
    cfg = tiny_cfg(validation=100, seeds=2)
    spy = EpochParams()
    summary = train_and_evaluate(cfg, tmp_path / "run", dataset=ds, callbacks=[spy])
    idx = validation.validation_indices(ds.train_labels, 100)
    x, y = ds.train_images[idx], ds.train_labels[idx]
    for record, params in spy.seen:
        figures = [numpy_mlp_figures(p, x, y) for p in params]
        assert record["val_accuracy_per_seed"] == pytest.approx([a for _, a in figures])
        assert record["val_loss_per_seed"] == pytest.approx([lo for lo, _ in figures], rel=1e-4)
        assert record["val_accuracy"] == pytest.approx(np.mean([a for _, a in figures]))
        assert record["val_loss"] == pytest.approx(np.mean([lo for lo, _ in figures]), rel=1e-4)
    last = spy.seen[-1][0]
    assert summary["val_accuracy"] == last["val_accuracy"]
    assert summary["val_accuracy_per_seed"] == last["val_accuracy_per_seed"]
    for key in ("mean", "std", "ci95", "min", "max"):  # as the test figures have them
        assert f"val_accuracy_{key}" in summary and f"test_accuracy_{key}" in summary
    assert summary["num_val_examples"] == 100 and summary["validation_seed"] == 1
    assert summary["steps"] == 2 * (540 // 32)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert all("val_accuracy" in json.loads(line) for line in lines)
    # `jaxmnist eval` evaluates the same held-out examples again.
    again = evaluate_run(tmp_path / "run", tiny_data_dir)
    assert again["val_accuracy"] == pytest.approx(summary["val_accuracy"])
    assert again["num_val_examples"] == 100 and again["num_train_examples"] == 540


def test_a_run_without_the_split_has_no_val_figures(tiny_dataset, tiny_data_dir):
    summary = train_and_evaluate(tiny_cfg(validation=0, epochs=1), None, dataset=tiny_dataset)
    assert not any(k.startswith("val_") for k in summary) and summary["steps"] == 20


# --- sweeps rank by validation ------------------------------------------------------------


def _point(index, val, test):
    """A sweep point's result whose validation and test accuracies are `val` and `test`."""
    x = {"point": index, "values": {"optimizer.lr": 0.001 * (index + 1)}, "group": 0}
    x.update(seeds=[0, 1, 2], diverged_seeds=[], epochs_to_target=None)
    for prefix, accs in (("val_accuracy", val), ("test_accuracy", test)):
        x.update(**sweep.stats.spread(accs).to_json(prefix), **{f"{prefix}_per_seed": accs})
    return x


def test_sweep_ranks_by_validation_not_test(tiny_data_dir):
    # Point 0 is best on the test set, point 1 on the validation split.
    results = [_point(0, [0.90, 0.91, 0.92], [0.99, 0.98, 0.99]), _point(1, [0.97] * 3, [0.9] * 3)]
    sweep.rank_points(results, "val_accuracy")
    assert [x["point"] for x in results] == [1, 0] and [x["rank"] for x in results] == [1, 2]
    sweep.rank_points(results, "test_accuracy")
    assert [x["point"] for x in results] == [0, 1]
    sweep.rank_points(results, "val_accuracy")
    table = {
        "axes": {"optimizer.lr": [0.001, 0.002]},
        "target_accuracy": None,
        "results": results,
        "ranked_by": "val_accuracy",
        "config": {"data": {"validation": 10000}},
        "seeds_per_point": 3,
        "num_points": 2,
        "num_programs": 1,
        "wall_seconds": 1.0,
    }
    text = sweep.format_table(table)
    header, first = text.splitlines()[:2]
    assert "validation accuracy (mean ± std)" in header and "test accuracy" in header
    assert first.split()[:2] == ["1", "0.002"]  # the validation-best point first
    assert "ranked by validation accuracy (10,000 training examples held out" in text
    from jaxmnist.report.sweep_report import results_table

    page = results_table(table)
    assert "Validation accuracy</th>" in page and "Ranked by validation accuracy" in page
    assert sweep.ranking_metric(tiny_cfg(validation=100)) == "val_accuracy"
    assert sweep.ranking_metric(tiny_cfg(validation=0)) == "test_accuracy"
    from jaxmnist.report.spread_plots import sweep_figure

    (ax,) = sweep_figure(table).axes  # the sweep's plot shows what it ranks by
    assert ax.get_title() == "Validation accuracy across the sweep"
    means = next(line for line in ax.get_lines() if len(line.get_ydata()) == 2).get_ydata()
    assert list(means) == pytest.approx([91.0, 97.0])  # by lr: validation means, not test


def test_cli_sweep_holds_out_a_split_by_default_and_ranks_by_it(tiny_data_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--out", str(out)]
    args += ["--batch-size", "32", "--epochs", "1", "--hidden", "32", "--no-compile-cache"]
    assert main([*args, "--grid", "optimizer.lr=1e-3,3e-3", "--seeds", "2"]) == 0
    captured = capsys.readouterr()
    held = sweep.default_validation(640)
    assert f"holding out {held:,} training examples" in captured.err
    assert "ranked by validation accuracy" in captured.out
    result = json.loads((out / "sweep.json").read_text())
    assert result["ranked_by"] == "val_accuracy" and result["config"]["data"]["validation"] == held
    means = [x["val_accuracy_mean"] for x in result["results"]]
    assert means == sorted(means, reverse=True)
    for x in result["results"]:
        assert len(x["val_accuracy_per_seed"]) == 2 and len(x["val_accuracy_by_epoch"]) == 1
        assert x["val_accuracy_mean"] == pytest.approx(np.mean(x["val_accuracy_per_seed"]))
    assert "val_accuracy_mean" in (out / "sweep.csv").read_text().splitlines()[0]
    assert "Ranked by validation accuracy" in (out / "sweep.html").read_text()
    # Given explicitly, 0 turns it off: ranked by test, and said to be biased.
    assert main([*args, "--out", str(tmp_path / "s0"), "--grid", "optimizer.lr=1e-3,3e-3",
                 "data.validation=0"]) == 0  # fmt: skip
    assert "ranked by test accuracy: no validation split" in capsys.readouterr().out


# --- the target's split -------------------------------------------------------------------


def _end(record, test_accuracy):
    test = Evaluation(np.zeros(1), np.array([test_accuracy]), np.zeros((1, 2, 2)), 10)
    return EpochEnd(1, 10, record, None, None, test, None, None, False)


def test_target_split_val_watches_the_validation_accuracy():
    record = {"epoch": 1, "test_accuracy": 0.5, "val_accuracy": 0.95, "epoch_seconds": 1.0}
    assert TargetAccuracy(0.9, np.zeros(1, int), "val")(_end(record, 0.5), 1.0)
    assert not TargetAccuracy(0.9, np.zeros(1, int), "test")(_end(record, 0.5), 1.0)
    record = {"epoch": 1, "test_accuracy": 0.95, "val_accuracy": 0.5, "epoch_seconds": 1.0}
    assert not TargetAccuracy(0.9, np.zeros(1, int), "val")(_end(record, 0.95), 1.0)
    assert TargetAccuracy(0.9, np.zeros(1, int), "val").replay([{**record, "val_accuracy": 0.9}])


def test_cli_target_split_val_stops_on_it_and_says_so(train_argv, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = train_argv(run_dir, "--epochs", "5", "--target-accuracy", "0.5", "--no-report")
    assert main([*argv, "--target-split", "val", "data.validation=100"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["target_split"] == "val" and summary["target_reached"]
    assert summary["epochs_to_target"] < 5
    assert "target validation accuracy 50.00% reached" in out
    assert "val loss" in out and "val: 100 training examples held out" in out


def test_compare_shows_the_validation_curves_and_figures(train_argv, tmp_path, capsys):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run_dir, lr in zip(runs, ("1e-3", "3e-3")):
        argv = train_argv(run_dir, "--epochs", "2", "--no-report", f"optimizer.lr={lr}")
        assert main([*argv, "data.validation=100"]) == 0
    out = tmp_path / "c.html"
    assert main(["compare", *map(str, runs), "--out", str(out)]) == 0
    page = out.read_text()
    assert "Validation accuracy of every run after each epoch" in page
    assert "Validation accuracy</th>" in page and "100 held out" in page


# --- bad values and old runs --------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["data.validation=-1"], "data.validation"),
        (["data.validation=640"], "data.validation"),
        (["data.validation=10.5"], "data.validation: expected int"),
        (["data.validation=many"], "data.validation: expected int"),
        (["data.validation=630"], "less the 630 held out"),  # 10 left: batch 32 cannot fit
        (["--target-split", "val"], "--target-split val"),
        (["--target-split", "train"], "unknown target split"),
    ],
)
def test_bad_values_exit_2_with_one_line(extra, message, train_argv, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([*train_argv(run_dir), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err
    assert not run_dir.exists()


def test_old_configs_load_without_the_split_and_resume_may_not_add_one(
    tiny_dataset, tiny_data_dir, tmp_path
):
    old = tiny_cfg(validation=0, epochs=1).to_dict()
    del old["data"]["validation"]  # a config.json written before the field
    del old["train"]["target_split"]
    cfg = config_lib.from_dict(old)
    assert cfg.data.validation == 0 and cfg.train.target_split == "test"
    path = tmp_path / "run"
    train_and_evaluate(cfg, path, dataset=tiny_dataset)
    (path / "config.json").write_text(json.dumps(old))
    extended, more = resume.prepare(path, {"train.epochs": 2})
    assert extended.data.validation == 0 and more
    with pytest.raises(config_lib.ConfigError, match="data.validation"):
        resume.prepare(path, {"train.epochs": 2, "data.validation": 100})


def test_run_sweep_ranks_its_points_by_validation(tiny_dataset, tiny_data_dir, monkeypatch):
    """Points whose test and validation figures disagree (faked after training): the sweep's
    order follows the validation split."""
    real = sweep._point_result

    def disagreeing(point, *args):
        x = real(point, *args)
        val, test = ([0.5] * 2, [0.9] * 2) if point.index == 0 else ([0.8] * 2, [0.6] * 2)
        x.update(**sweep.stats.spread(val).to_json("val_accuracy"), val_accuracy_per_seed=val)
        x.update(**sweep.stats.spread(test).to_json("test_accuracy"), test_accuracy_per_seed=test)
        return x

    monkeypatch.setattr(sweep, "_point_result", disagreeing)
    cfg = tiny_cfg(validation=100, epochs=1, seeds=2)
    axes = sweep.parse_grid(["optimizer.lr=1e-3,3e-3"], cfg)
    result = sweep.run_sweep(cfg, axes, dataset=tiny_dataset)
    assert result["ranked_by"] == "val_accuracy"
    assert [x["point"] for x in result["results"]] == [1, 0]
    assert "ranked by validation accuracy (100 training examples" in sweep.format_table(result)
