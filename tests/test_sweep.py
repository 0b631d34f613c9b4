"""Sweeps: grid syntax, grouping into programs, traced hyperparameters, outputs, the CLI."""

import csv
import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist.cli import main
from jaxmnist.errors import ConfigError
from jaxmnist.search import sweep
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import Member

BASE = config_lib.get_preset("tpu101")


def test_parse_grid_types_values_and_tuple_fields():
    axes = sweep.parse_grid(
        ["optimizer.lr=1e-3, 3e-3,0.01", "model.hidden=64,128x32", "train.eval_train=true,false"],
        BASE,
    )
    assert axes[0] == sweep.Axis("optimizer.lr", (1e-3, 3e-3, 0.01))
    assert axes[1] == sweep.Axis("model.hidden", ((64,), (128, 32)))
    assert axes[2].values == (True, False)
    assert [sweep.format_value(v) for v in axes[1].values] == ["64", "128x32"]


@pytest.mark.parametrize(
    "specs, message",
    [
        ([], "needs at least one --grid"),
        (["optimizer.lr"], "is not of the form section.field=v1,v2"),
        (["optimizer.lr="], "is not of the form"),
        (["=1,2"], "is not of the form"),
        (["optimizer.lr=1e-3,,3e-3"], "an empty value"),
        (["optimizer.nope=1,2"], "unknown config field 'optimizer.nope'"),
        (["optimizer.lr=fast,slow"], "expected float"),
        (["optimizer.lr=1e-3", "optimizer.lr=3e-3"], "given twice"),
        (["optimizer.lr=1e-3,0.001"], "repeated"),
        (["train.seeds=1,2"], "--seeds N"),
    ],
)
def test_bad_grids_are_config_errors(specs, message):
    with pytest.raises(ConfigError, match=message):
        sweep.parse_grid(specs, BASE)


def test_invalid_points_name_the_point():
    axes = sweep.parse_grid(["optimizer.weight_decay=0,1e-4"], BASE)  # adam has no weight decay
    with pytest.raises(
        ConfigError, match=r"grid point optimizer.weight_decay=0.0001: optimizer adam has no"
    ):
        sweep.expand_grid(BASE, axes)


def test_grouping_by_shape():
    axes = sweep.parse_grid(
        ["optimizer.lr=1e-3,3e-3", "optimizer.momentum=0.5,0.9", "train.seed=0,1"],
        config_lib.apply_overrides(BASE, {"optimizer.name": "sgd"}),
    )
    assert [len(g) for g in sweep.group_points(sweep.expand_grid(BASE, axes))] == [8]
    axes = sweep.parse_grid(
        ["train.batch_size=32,64", "optimizer.lr=1e-3,3e-3", "model.hidden=16,8x8"], BASE
    )
    groups = sweep.group_points(sweep.expand_grid(BASE, axes))
    assert [len(g) for g in groups] == [2, 2, 2, 2]
    assert {tuple(p.values["optimizer.lr"] for p in g) for g in groups} == {(1e-3, 3e-3)}


def small_cfg(**optimizer):
    cfg = config_lib.get_preset("tpu101")
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, hidden=(32,)),
        optimizer=dataclasses.replace(cfg.optimizer, **optimizer),
        train=dataclasses.replace(
            cfg.train, batch_size=32, epochs=1, eval_batch_size=64, eval_train=False
        ),
        compile_cache=False,
    )


def test_sweep_point_equals_that_config_alone_with_a_schedule(tiny_dataset):
    """Learning rate (the peak of a warmup-cosine schedule), weight decay and
    momentum are arrays in one program; each point matches its config trained alone."""
    base = small_cfg(
        name="sgd",
        lr=0.05,
        momentum=0.9,
        weight_decay=0.0,
        schedule="warmup_cosine",
        warmup_steps=5,
    )
    other = dataclasses.replace(base.optimizer, lr=0.2, momentum=0.5, weight_decay=1e-3)
    members = [Member.of(base), Member(0, other.lr, other.weight_decay, other.momentum)]
    group = train_population(base, members, tiny_dataset, points=[0, 1])
    alone_cfg = dataclasses.replace(base, optimizer=other)
    alone = train_population(alone_cfg, [Member.of(alone_cfg)], tiny_dataset)
    grouped = jax.device_get(group.population.member_params(group.states, 1))
    for a, b in zip(
        jax.tree.leaves(alone.population.member_params(alone.states, 0)), jax.tree.leaves(grouped)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    lrs = group.population.learning_rates(group.states)
    assert lrs[1] / lrs[0] == pytest.approx(0.2 / 0.05, rel=1e-5)  # same schedule, its own peak
    assert lrs[1] == pytest.approx(
        float(alone.population.learning_rates(alone.states)[0]), rel=1e-6
    )


def sweep_args(data_dir, out, *extra):
    return [
        "sweep",
        "--dataset",
        "tiny",
        "--data-dir",
        str(data_dir),
        "--out",
        str(out),
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--hidden",
        "32",
        "--no-compile-cache",
        *extra,
    ]


def test_cli_two_by_two_grid_in_one_program_writes_files(tiny_data_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = sweep_args(
        tiny_data_dir,
        out,
        "--optimizer",
        "adamw",
        "--grid",
        "optimizer.lr=1e-3,3e-3",
        "--grid",
        "optimizer.weight_decay=0,1e-4",
        "--seeds",
        "2",
    )
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "program 1/1: 8 models in one program" in captured.err
    assert "rank" in captured.out and "4 points x 2 seeds in 1 program" in captured.out
    assert "≈ best" in captured.out.splitlines()[0]  # two seeds: marked against the best
    assert "Holm-corrected over the 3 comparisons" in captured.out

    result = json.loads((out / "sweep.json").read_text())
    assert (
        result["num_points"] == 4 and result["num_programs"] == 1 and result["seeds_per_point"] == 2
    )
    assert result["axes"] == {"optimizer.lr": [1e-3, 3e-3], "optimizer.weight_decay": [0.0, 1e-4]}
    means = [x["test_accuracy_mean"] for x in result["results"]]
    assert means == sorted(means, reverse=True) and [x["rank"] for x in result["results"]] == [
        1,
        2,
        3,
        4,
    ]
    for x in result["results"]:
        assert x["seeds"] == [0, 1] and len(x["test_accuracy_per_seed"]) == 2
        assert x["test_accuracy_mean"] == pytest.approx(np.mean(x["test_accuracy_per_seed"]))
        assert len(x["test_accuracy_ci95"]) == 2 and len(x["test_accuracy_by_epoch"]) == 2
    assert result["command"].startswith("jaxmnist sweep") and result["preset"] == "tpu101"
    rows = list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))
    assert (
        len(rows) == 4
        and rows[0]["rank"] == "1"
        and float(rows[0]["test_accuracy_mean"]) == means[0]
    )
    assert (out / "sweep.png").read_bytes().startswith(b"\x89PNG")
    page = (out / "sweep.html").read_text()
    assert "Mean test accuracy of every pair of values" in page and "<table" in page
    assert "≈ best</th>" in page


def test_cli_shape_changing_grid_runs_separate_programs(tiny_data_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = sweep_args(
        tiny_data_dir, out, "--grid", "train.batch_size=32,64", "--target-accuracy", "0.3", "--json"
    )
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_programs"] == 2 and [g["fixed"] for g in result["groups"]] == [
        {"train.batch_size": "32"},
        {"train.batch_size": "64"},
    ]
    assert all(g["models"] == 1 and g["steps"] > 0 for g in result["groups"])
    assert all(x["test_accuracy_std"] is None and x["epochs_to_target"] for x in result["results"])
    assert "epochs_to_target" in (out / "sweep.csv").read_text().splitlines()[0]
    mask = os.umask(0o022)
    os.umask(mask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert modes == {p.name: oct(0o666 & ~mask) for p in out.iterdir()}  # shareable


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "needs at least one --grid"),
        (["--grid", "optimizer.lr"], "is not of the form"),
        (["--grid", "optimizer.nope=1,2"], "unknown config field"),
        (["--grid", "optimizer.lr=1e-3", "--seeds", "0"], "seeds must be a positive number"),
        (["--grid", "optimizer.lr=1e-3,-1"], "grid point optimizer.lr=-1: learning rate"),
        # Steps win over epochs (train's rule): every point would train 20 steps.
        (["--steps", "20", "--grid", "train.epochs=1,2"], "steps win over epochs"),
        (["train.steps=20", "--grid", "train.epochs=1,2"], "steps win over epochs"),
        (["--grid", "train.epochs=1,2", "--grid", "train.steps=5,9"], "steps win over epochs"),
    ],
)
def test_cli_bad_sweeps_exit_2_in_one_line(extra, message, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and message in err and err.startswith("jaxmnist sweep: error:")
    )
    assert not out.exists()


def test_set_hyperparams_reaches_through_gradient_clipping():
    import jax.numpy as jnp

    from jaxmnist import optim

    cfg = config_lib.OptimizerConfig(
        name="adamw", lr=1e-3, weight_decay=1e-4, schedule="cosine", grad_clip=1.0
    )
    opt = optim.make_optimizer(cfg, total_steps=10)
    params = {"w": jnp.ones((3,))}
    state = optim.set_hyperparams(
        opt.init(params), lr=4e-3, weight_decay=0.0, momentum=0.5
    )  # momentum: unused
    assert isinstance(state, tuple) and len(state) == 2
    _, state = opt.update({"w": jnp.ones((3,))}, state, params)
    _, state = opt.update({"w": jnp.ones((3,))}, state, params)
    expected = optim.make_schedule(dataclasses.replace(cfg, lr=4e-3), 10)(1)
    assert float(optim.current_learning_rate(state)) == pytest.approx(float(expected), rel=1e-6)
    assert float(state[1].hyperparams["weight_decay"]) == 0.0


def test_programs_table_says_what_its_chunks_are():
    from jaxmnist.report.sweep_report import programs_table

    group = {"group": 0, "fixed": {}, "points": [0], "models": 24, "epochs": 1}
    group.update(compile_seconds=1.0, train_seconds=2.0, eval_seconds=0.5)
    one = programs_table({"groups": [{**group, "chunks": [24]}]})
    assert "Memory chunks" in one and "1 of 24 models" in one
    two = programs_table({"groups": [{**group, "chunks": [16, 8]}]})
    assert "2: 16 + 8 models" in two


def test_a_grid_over_epochs_replaces_the_presets_steps_and_says_so(tiny_data_dir, tmp_path, capsys):
    """codelab plans 400 steps; a grid over train.epochs wins over it, as train's --epochs
    does, and sweep.json's config records what the points ran."""
    out = tmp_path / "sweep"
    args = ["sweep", "--preset", "codelab", "--dataset", "tiny", "--data-dir", str(tiny_data_dir)]
    args += ["--out", str(out), "--batch-size", "32", "--hidden", "16", "--no-compile-cache"]
    args += ["data.validation=0"]  # all 640 examples trained on: 20 steps an epoch
    assert main([*args, "--grid", "train.epochs=1,2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(g["epochs"], g["steps"]) for g in result["groups"]] == [(1, 20), (2, 40)]
    assert result["config"]["train"]["steps"] is None  # not codelab's 400
    assert result == json.loads((out / "sweep.json").read_text())


def test_the_group_line_says_the_steps_of_a_run_shorter_than_an_epoch():
    """`sweep --steps 100` over 117-step epochs runs 100 steps, and says so."""
    from jaxmnist.training.hooks import Progress, RunStart

    lines = []
    reporter = sweep.SweepReporter(lines.append, "group 1", np.zeros(2, int), 1)
    info = {"models": 2, "epochs": 1, "steps_per_epoch": 117, "total_steps": 100}
    reporter.on_start(RunStart(None, info, Progress()))
    assert lines == ["group 1: 2 models in one program; 100 steps"]
    info.update(total_steps=117)
    reporter.on_start(RunStart(None, info, Progress()))
    assert lines[-1] == "group 1: 2 models in one program; 1 epoch x 117 steps"
    info.update(models=1)
    reporter.on_start(RunStart(None, info, Progress()))
    assert lines[-1] == "group 1: 1 model in one program; 1 epoch x 117 steps"
