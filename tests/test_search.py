"""`jaxmnist search`: the --param syntax, batches as vmapped programs, pruning, the
objective on validation, outputs, and two workers sharing a PostgreSQL study."""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna", reason="needs the search extra")
import sqlalchemy.engine
import sqlalchemy.exc
from optuna.trial import TrialState

from jaxmnist import config as config_lib
from jaxmnist.cli import build_parser, main
from jaxmnist.commands import options
from jaxmnist.errors import ConfigError
from jaxmnist.search import batch as batch_lib
from jaxmnist.search import outputs, space
from jaxmnist.search import study as study_lib
from jaxmnist.search import worker as search_run
from jaxmnist.timing import compile_count

BASE = config_lib.get_preset("tpu101")
TESTS = Path(__file__).parent


def small(**fields) -> config_lib.Config:
    cfg = config_lib.apply_overrides(
        BASE,
        {
            "data.dataset": "tiny",
            "train.batch_size": 32,
            "train.epochs": 2,
            "model.hidden": (16,),
            "optimizer.name": "adamw",
            "compile_cache": False,
            **fields,
        },
    )
    return search_run.with_validation(cfg, 100)


def study_opts(tmp_path, name="s", **kw) -> study_lib.StudyOptions:
    return study_lib.StudyOptions(
        name=name, storage=f"sqlite:///{tmp_path / 'search.db'}", **{"trials": 3, **kw}
    )


# --- the --param syntax ---------------------------------------------------------------


def test_params_parse_to_typed_distributions():
    ps = space.parse_params(
        [
            "optimizer.lr=log:1e-4:1e-1",
            "optimizer.momentum = uniform:0.8:0.99",
            "train.batch_size=uniform:32:256:32",
            "model.hidden=choice:128x64, 256x128,512",
        ],
        BASE,
    )
    d = [p.distribution() for p in ps]
    assert d[0] == optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    assert d[1] == optuna.distributions.FloatDistribution(0.8, 0.99)
    assert d[2] == optuna.distributions.IntDistribution(32, 256, step=32)
    assert d[3] == optuna.distributions.CategoricalDistribution(("128x64", "256x128", "512"))
    assert [p.spec for p in ps][3] == "model.hidden=choice:128x64,256x128,512"
    cfg = space.trial_config(BASE, {"model.hidden": "256x128", "train.batch_size": 64})
    assert cfg.model.hidden == (256, 128) and cfg.train.batch_size == 64
    assert ps[2].grid_values() == [32, 64, 96, 128, 160, 192, 224, 256]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("optimizer.lr", "is not KEY=log:LOW:HIGH"),
        ("optimizer.lr=loglog:1:2", "is not KEY=log:LOW:HIGH"),
        ("optimizer.lr=log:", "is not KEY=log:LOW:HIGH"),
        ("optimizer.nope=log:1e-4:1e-1", "unknown config field 'optimizer.nope'"),
        ("optimizer.lr=log:1e-1:1e-4", "LOW must be below HIGH"),
        ("optimizer.lr=log:0:1e-1", "learning rate"),  # the config's own check
        ("optimizer.lr=log:1e-4:1e-1:2", "takes no STEP"),
        ("optimizer.lr=uniform:1e-4:abc", "expected float"),
        ("optimizer.lr=uniform:1e-4:1e-1:1", "STEP must be above 0 and at most"),
        ("model.hidden=choice:64,,32", "an empty choice"),
        ("model.hidden=choice:64,64", "a choice is repeated"),
        ("model.hidden=uniform:1:2", "is not a number; give its values with choice"),
        ("optimizer.name=choice:adam,nadam", "unknown optimizer"),
        ("train.seeds=uniform:1:4", "--seeds N"),
        ("train.target_accuracy=uniform:0.5:0.9", "never by the test set"),
        ("train.epochs=uniform:1:4", "every trial trains --epochs"),
        ("train.target_split=choice:test,val", "never by the test set"),
        ("train.eval_train=choice:true,false", "not what a trial learns"),
        ("compile_cache=choice:true,false", "not what a trial learns"),
        ("tensorboard=choice:true,false", "not what a trial learns"),
        ("parallel.devices=choice:1,2", "not what a trial learns"),
        ("optimizer.name=choice:adam", "one choice searches nothing"),
        ("model.hidden=choice:128x,256", "'128x' has an empty size"),
        ("model.hidden=choice:x128,256", "'x128' has an empty size"),
        ("model.hidden=choice:256x128", "one choice searches nothing"),
    ],
)
def test_bad_params_are_one_line_config_errors(spec, message):
    with pytest.raises(ConfigError, match=None) as e:
        space.parse_params([spec], BASE)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "needs at least one --param"),
        (["--param", "optimizer.lr=log:1e-1:1e-4"], "LOW must be below HIGH"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--param", "optimizer.lr=log:1e-3:1e-1"],
         "given twice"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--sampler", "grid"], "no grid; give its"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--trials", "0"], "must be at least 1"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--sampler", "bayes"], "invalid choice"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--storage", "nosuchdb://x"],
         "--storage nosuchdb://x:"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--validation", "100", "data.validation=50"],
         "give the validation split once"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--validation", "0"],
         "ranks its trials on a validation split: --validation must be at least 1"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "data.validation=0"],
         "ranks its trials on a validation split"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "train.target_accuracy=0.9"],
         "never lets the test set decide"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--sampler-seed", "-1"], "must be 0 or more"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--sampler-seed", "99999999999"],
         "must be at most 4294967295"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--storage", ""], "must not be empty"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--study", " "], "must not be empty"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--retries", "-1"], "must be 0 or more"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--target-accuracy", "0.9"],
         "unrecognized arguments: --target-accuracy"),
        (["--param", "optimizer.lr=log:1e-4:1e-1", "--out", "FILE"],
         "is a file, not a folder; give a folder to write into"),
    ],
)  # fmt: skip
def test_cli_bad_searches_exit_2_in_one_line(extra, message, tmp_path, capsys):
    out = tmp_path / "search"
    if "FILE" in extra:  # an existing file where the folder should go
        (tmp_path / "FILE").write_text("mine")
        extra = [str(tmp_path / "FILE") if e == "FILE" else e for e in extra]
    by_parser = False  # argparse's refusals exit with its usage line before the message
    try:
        code = main(["search", "--out", str(out), *extra])
    except SystemExit as e:
        code, by_parser = e.code, True
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err.splitlines()[-1], err
    if not by_parser:
        assert len(err.splitlines()) == 1 and err.startswith("jaxmnist search: error:")
    assert not out.exists()  # no folder either: nothing was tried
    if (tmp_path / "FILE").exists():
        assert (tmp_path / "FILE").read_text() == "mine"


@pytest.mark.parametrize("folder", ["q?mode=ro", "pct%41", "sp ace#1"])
def test_the_default_study_file_is_in_the_out_folder_whatever_its_name(tmp_path, folder):
    path = tmp_path / folder / "search.db"
    path.parent.mkdir()
    url = study_lib.sqlite_url(path)
    assert sqlalchemy.engine.make_url(url).database == str(path)
    storage = study_lib.open_storage(study_lib.StudyOptions(name="s", storage=url, trials=1))
    optuna.create_study(storage=storage, study_name="s")
    assert path.is_file() and sorted(p.name for p in tmp_path.iterdir()) == [folder]


def test_search_help_lists_no_flag_that_means_nothing_to_a_search(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    out = capsys.readouterr().out
    for flag in ("--target-accuracy", "--target-split", "--steps", "--tensorboard"):
        assert flag not in out, flag
    assert "--retries" in out and "--sampler-seed" in out
    # How to resume, that a finished search is not extended, how workers share a study.
    assert "run the same command again" in out and "is not extended" in out
    assert "one --storage" in out and "one --study" in out


def test_a_presets_target_never_stops_a_searchs_trials(tmp_path, tiny_dataset, tiny_data_dir):
    """`speedrun` stops a training run at 99% test accuracy; its trials in a search train
    their epochs. With a target on the validation split (explicit), the trials follow it."""
    from jaxmnist.commands import search as command

    args = build_parser().parse_args(
        ["search", "--preset", "speedrun", "--param", "optimizer.lr=log:1e-4:1e-1"]
    )
    args.argv = []
    seen = []
    real = space.check_rankable
    with pytest.MonkeyPatch.context() as m:
        m.setattr(space, "check_rankable", lambda cfg: seen.append(cfg) or real(cfg))
        m.setattr(command, "Path", lambda *a: (_ for _ in ()).throw(RuntimeError("stop")))
        with pytest.raises(RuntimeError, match="stop"):
            command.run(args)
    assert config_lib.get_preset("speedrun").train.target_accuracy is not None
    assert seen[0].train.target_accuracy is None
    cfg = config_lib.apply_overrides(
        small(), {"train.target_accuracy": 0.5, "train.target_split": "val"}
    )
    space.check_rankable(search_run.with_validation(cfg, 100))  # allowed


def test_the_command_names_the_same_samplers_and_pruners_as_the_study():
    from jaxmnist.commands import search as command

    assert command.SAMPLERS == study_lib.SAMPLERS and command.PRUNERS == study_lib.PRUNERS


# --- searches on the tiny dataset -----------------------------------------------------


@pytest.mark.slow
def test_cli_search_end_to_end_with_sqlite_and_the_best_trains_again(
    tiny_data_dir, tmp_path, capsys
):
    out = tmp_path / "search"
    args = [
        "search", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--out", str(out),
        "--batch-size", "32", "--epochs", "2", "--hidden", "16", "--no-compile-cache",
        "--optimizer", "adamw", "--validation", "100", "--seeds", "2", "--trials", "4",
        "--batch", "4", "--pruner", "none",
        "--param", "optimizer.lr=log:1e-4:1e-1", "--param", "optimizer.weight_decay=log:1e-6:1e-2",
    ]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "batch 1: trials 0, 1, 2, 3" in captured.err
    assert "program 1/1: 8 models in one program" in captured.err
    assert "4 complete, 0 pruned, 0 failed trials in study 'search'" in captured.out
    result = json.loads((out / "search.json").read_text())
    assert result["counts"]["COMPLETE"] == 4 and result["sampler"] == "tpe"
    assert (out / "search.db").exists() and result["storage"].startswith("sqlite:///")
    ranked = [r for r in result["trials"] if r["state"] == "COMPLETE"]
    assert [r["rank"] for r in ranked] == [1, 2, 3, 4]
    assert [r["value"] for r in ranked] == sorted((r["value"] for r in ranked), reverse=True)
    rows = list(csv.DictReader((out / "search.csv").read_text().splitlines()))
    assert len(rows) == 4 and rows[0]["trial"] == str(result["best"]["number"])
    page = (out / "search.html").read_text()
    assert page.count("data:image/png;base64,") == 3  # history, importances, parallel
    assert "optuna-dashboard sqlite:///" in page and "Optimisation history" in page

    # The best trial's command trains exactly the best trial's config.
    best = result["best"]
    argv = shlex.split(best["command"])
    assert argv[:2] == ["jaxmnist", "train"] and best["command"] in captured.out
    parsed, extra = build_parser().parse_known_args(argv[1:])
    parsed.overrides = [*parsed.overrides, *extra]
    cfg, _ = options.resolve_config(parsed)
    base, _ = options.resolve_config(build_parser().parse_known_args(args)[0])
    want = space.trial_config(search_run.with_validation(base, 100), best["values"])
    assert cfg == want and cfg.optimizer.lr == best["values"]["optimizer.lr"]


def _search(tmp_path, tiny_dataset, params, *, name="s", cfg=None, batch=8, **kw):
    opts = study_opts(tmp_path, name=name, **kw)
    ps = space.parse_params(params, cfg or small())
    study = search_run.run_search(cfg or small(), ps, opts, batch=batch, dataset=tiny_dataset)
    return study, ps, opts


@pytest.mark.slow
def test_a_batch_of_trials_of_one_shape_is_one_vmapped_program(
    tmp_path, tiny_dataset, tiny_data_dir
):
    """Four trials over traced values compile what one trial compiles: one program."""
    params = ["optimizer.lr=log:1e-4:1e-1"]
    # First, what a process compiles once for any search (alone, this test counted it in one).
    _search(tmp_path, tiny_dataset, params, name="warm", trials=1, pruner="none")
    before = compile_count()
    _search(tmp_path, tiny_dataset, params, name="one", trials=1, pruner="none")
    one = compile_count() - before
    before = compile_count()
    study, _, _ = _search(tmp_path, tiny_dataset, params, name="four", trials=4, pruner="none")
    four = compile_count() - before
    assert one > 0 and four == one
    attrs = [t.user_attrs for t in study.trials]
    assert {a["batch"] for a in attrs} == {1} and {a["models_in_program"] for a in attrs} == {4}


def test_trials_of_two_shapes_train_as_two_programs_in_one_batch(
    tmp_path, tiny_dataset, tiny_data_dir
):
    study, _, _ = _search(
        tmp_path,
        tiny_dataset,
        ["model.hidden=choice:8,16"],
        trials=2,
        sampler="grid",
        pruner="none",
    )
    attrs = sorted((t.params["model.hidden"], t.user_attrs["program"]) for t in study.trials)
    assert attrs == [("16", "model.hidden=16"), ("8", "model.hidden=8")]


def test_grid_search_visits_each_point_once_and_stops_at_the_grid(
    tmp_path, tiny_dataset, tiny_data_dir
):
    ps = space.parse_params(["optimizer.lr=choice:1e-3,3e-3,1e-2"], small())
    trials = search_run.grid_trials(ps, 10)
    study, _, _ = _search(
        tmp_path, tiny_dataset, [ps[0].spec], trials=trials, sampler="grid", pruner="none"
    )
    assert trials == 3 and sorted(t.params["optimizer.lr"] for t in study.trials) == [
        "0.001",
        "0.003",
        "0.01",
    ]


def test_pruned_trials_stop_their_program_early(tmp_path, tiny_dataset, tiny_data_dir, monkeypatch):
    """A pruner that prunes every trial whenever asked: every trial PRUNED after epoch 2
    of 3 (the first epoch is never pruned on), and the program ran two epochs, not three."""
    monkeypatch.setattr(
        study_lib, "make_pruner", lambda kind, epochs: optuna.pruners.ThresholdPruner(lower=2.0)
    )
    ran = []
    real = batch_lib.train_population

    def spy(*args, **kw):
        r = real(*args, **kw)
        ran.append(len(r.records))
        return r

    monkeypatch.setattr(batch_lib, "train_population", spy)
    study, ps, opts = _search(
        tmp_path, tiny_dataset, ["optimizer.lr=log:1e-4:1e-1"], cfg=small(**{"train.epochs": 3}),
        trials=3, batch=3,
    )  # fmt: skip
    assert [t.state for t in study.trials] == [TrialState.PRUNED] * 3
    assert ran == [2] and all(t.user_attrs["epochs"] == 2 for t in study.trials)
    assert all(list(t.intermediate_values) == [1, 2] for t in study.trials)
    result = outputs.summarize(study, ps, small(), opts, preset="tpu101", wall_seconds=1.0)
    assert result["counts"]["PRUNED"] == 3 and result["best"] is None


@pytest.mark.parametrize("epochs", [1, 2])
def test_neither_the_first_nor_the_last_epoch_is_pruned_on(
    tmp_path, tiny_dataset, tiny_data_dir, monkeypatch, epochs
):
    """A pruner that prunes whenever asked: with one or two epochs it is never asked, and
    every trial that trained them all is COMPLETE and ranked."""
    monkeypatch.setattr(
        study_lib, "make_pruner", lambda kind, epochs: optuna.pruners.ThresholdPruner(lower=2.0)
    )
    study, ps, opts = _search(
        tmp_path, tiny_dataset, ["optimizer.lr=log:1e-4:1e-1"],
        cfg=small(**{"train.epochs": epochs}), trials=2, batch=2,
    )  # fmt: skip
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert all(list(t.intermediate_values) == list(range(1, epochs + 1)) for t in study.trials)
    result = outputs.summarize(study, ps, small(), opts, preset="tpu101", wall_seconds=1.0)
    assert result["counts"]["COMPLETE"] == 2 and result["best"] is not None


def test_the_objective_is_validation_accuracy_never_test(tmp_path, tiny_dataset, tiny_data_dir):
    study, ps, opts = _search(
        tmp_path, tiny_dataset, ["optimizer.lr=log:1e-3:1e-1"], trials=3, pruner="none",
        cfg=small(**{"train.seeds": 2}),
    )  # fmt: skip
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 3
    for t in done:
        val, test = t.user_attrs["val_accuracy_per_seed"], t.user_attrs["test_accuracy_per_seed"]
        assert len(val) == 2 and t.value == pytest.approx(sum(val) / 2)
        assert t.user_attrs["test_accuracy_mean"] == pytest.approx(sum(test) / 2)
    assert any(t.value != pytest.approx(t.user_attrs["test_accuracy_mean"]) for t in done)
    result = outputs.summarize(study, ps, small(), opts, preset="tpu101", wall_seconds=1.0)
    assert result["best"]["number"] == max(done, key=lambda t: t.value).number
    # What the pruner is fed each epoch: the validation accuracy too, never the test's.
    for t in done:
        last = t.intermediate_values[max(t.intermediate_values)]
        assert last == pytest.approx(t.value)
        assert list(t.intermediate_values.values()) == pytest.approx(
            t.user_attrs["val_accuracy_by_epoch"]
        )
    assert any(
        t.intermediate_values[max(t.intermediate_values)]
        != pytest.approx(t.user_attrs["test_accuracy_mean"])
        for t in done
    )


def test_a_space_of_refused_combinations_stops_in_one_line(
    tmp_path, tiny_dataset, tiny_data_dir, monkeypatch
):
    """Every drawn combination refused by the config: the search stops with a ConfigError
    after twice its trials (at least 10), instead of drawing for ever."""

    def refuse(cfg):
        raise ConfigError("model.hidden: this combination is refused")

    ps = space.parse_params(["optimizer.lr=log:1e-3:1e-1"], small())  # each end is valid
    opts = study_opts(tmp_path, trials=2, pruner="none")
    monkeypatch.setattr(batch_lib.config_lib, "validate", refuse)
    with pytest.raises(ConfigError, match=r"1[12] drawn combinations were not valid configs \(the"):
        search_run.run_search(small(), ps, opts, dataset=tiny_dataset)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_workers_and_resumed_searches_never_draw_the_same_values_again(tmp_path, sampler):
    """Two workers with the same --sampler-seed on one study, asking in turn, then a
    third that resumes it: every trial's values are new. Seeded alike, the second worker
    drew the first's values trial after trial."""
    lr = space.parse_params(["optimizer.lr=log:1e-4:1e-1"], BASE)
    opts = study_opts(tmp_path, trials=12, sampler=sampler)
    workers = [study_lib.open_study(opts, lr, 2) for _ in range(2)]
    drawn = []
    for _ in range(4):
        for study in workers:
            trial = study_lib.ask(study)
            drawn.append(trial.suggest_float("optimizer.lr", 1e-4, 1e-1, log=True))
            study.tell(trial, 0.5)
    resumed = study_lib.open_study(opts, lr, 2)
    for _ in range(4):
        trial = study_lib.ask(resumed)
        drawn.append(trial.suggest_float("optimizer.lr", 1e-4, 1e-1, log=True))
        resumed.tell(trial, 0.5)
    assert len(set(drawn)) == len(drawn) == 12, drawn


def test_a_fresh_search_repeats_itself_with_its_seed(tmp_path):
    lr = space.parse_params(["optimizer.lr=log:1e-4:1e-1"], BASE)
    values = []
    for name in ("a", "b"):
        study = study_lib.open_study(study_opts(tmp_path, name=name, sampler="random"), lr, 2)
        trial = study_lib.ask(study)
        values.append(trial.suggest_float("optimizer.lr", 1e-4, 1e-1, log=True))
    assert values[0] == values[1]


def test_joining_a_study_with_another_space_or_size_is_refused(tmp_path):
    opts = study_opts(tmp_path)
    study_lib.open_study(opts, space.parse_params(["optimizer.lr=log:1e-4:1e-1"], BASE), 2)
    other = space.parse_params(["optimizer.lr=log:1e-3:1e-1"], BASE)
    with pytest.raises(ConfigError, match="searches optimizer.lr=log:0.0001:0.1, not"):
        study_lib.open_study(opts, other, 2)
    same = space.parse_params(["optimizer.lr=log:1e-4:1e-1"], BASE)
    with pytest.raises(ConfigError, match="give --trials 3"):
        study_lib.open_study(study_opts(tmp_path, trials=5), same, 2)


def test_a_study_declares_its_space_and_size_in_one_write(tmp_path):
    """A worker joining while the first one declares finds the whole declaration or none
    (written as two attributes, one worker found the space without the size: KeyError);
    a study an older jaxmnist declared in two is still joined, or refused, by them."""
    lr = space.parse_params(["optimizer.lr=log:1e-4:1e-1"], BASE)
    study = study_lib.open_study(study_opts(tmp_path), lr, 2)
    assert study.user_attrs == {"search": {"space": ["optimizer.lr=log:0.0001:0.1"], "trials": 3}}
    old = optuna.create_study(
        study_name="old", storage=study_opts(tmp_path).storage, direction="maximize"
    )
    old.set_user_attr("space", ["optimizer.lr=log:0.0001:0.1"])
    old.set_user_attr("trials", 3)
    with pytest.raises(ConfigError, match="give --trials 3"):
        study_lib.open_study(study_opts(tmp_path, name="old", trials=4), lr, 2)
    study_lib.open_study(study_opts(tmp_path, name="old"), lr, 2)


def test_a_trial_asked_past_the_budget_is_failed_and_marked(tmp_path):
    opts = study_opts(tmp_path, trials=2)
    study = study_lib.open_study(opts, space.parse_params(["optimizer.lr=log:1e-4:1e-1"], BASE), 2)
    asked = [study_lib.ask(study) for _ in range(3)]  # two workers racing for the last place
    assert [study_lib.admitted(study, t, 2) for t in asked] == [True, True, False]
    last = study.trials[2]
    assert last.state == TrialState.FAIL and last.user_attrs[study_lib.OVER_BUDGET] is True
    # It never ran: not counted as failed, in the progress, the table or the page.
    c = study_lib.counts(study)
    assert c["FAIL"] == 0 and c["OVER_BUDGET"] == 1 and c["RUNNING"] == 2
    text = study_lib.counts_text(c)
    assert text == "0 complete, 0 pruned, 0 failed trials (1 more asked past the budget, never run)"
    for t in asked[:2]:
        study.tell(t, 0.5)
    ps = space.parse_params(["optimizer.lr=log:1e-4:1e-1"], BASE)
    result = outputs.summarize(study, ps, small(), opts, preset="tpu101", wall_seconds=1.0)
    assert result["counts"]["FAIL"] == 0 and result["counts"]["OVER_BUDGET"] == 1
    assert "2 complete, 0 pruned, 0 failed trials (1 more" in outputs.format_table(result)


# --- two workers on PostgreSQL, one killed --------------------------------------------

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres_url():
    """A private PostgreSQL server on a free loopback port, in a data folder of its own,
    run as the `postgres` user (initdb refuses root); stopped afterwards."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(
            f"PostgreSQL's server binaries are not in {PG_BIN} (apt-get install postgresql)"
        )
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: initdb would refuse to start")
    where = Path(tempfile.mkdtemp(prefix="jaxmnist-pg-"))
    if as_postgres:
        shutil.chown(where, "postgres")
    data, port = where / "data", _free_port()
    run = lambda *a: subprocess.run([*as_postgres, *a], check=True, capture_output=True)
    run(PG_BIN / "initdb", "-D", data, "-U", "postgres", "--auth=trust")
    run(PG_BIN / "pg_ctl", "-D", data, "-l", where / "log", "-w", "-o",
        f"-k {where} -p {port} -h 127.0.0.1", "start")  # fmt: skip
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(PG_BIN / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.postgres
@pytest.mark.slow
def test_two_workers_share_a_postgres_study_and_a_killed_ones_trials_are_retried(
    postgres_url, tiny_data_dir, tmp_path
):
    common = [
        "search", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--batch-size", "32",
        "--epochs", "2", "--hidden", "16", "--no-compile-cache", "--validation", "100",
        "--trials", "6", "--batch", "2", "--pruner", "none", "--heartbeat", "1",
        "--storage", postgres_url, "--study", "shared", "--param", "optimizer.lr=log:1e-4:1e-1",
    ]  # fmt: skip
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def start(name: str, seed: int):
        log = open(tmp_path / f"{name}.err", "w")  # noqa: SIM115 (closed below)
        argv = [
            sys.executable,
            str(TESTS / "run_tiny_cli.py"),
            *common,
            "--out",
            str(tmp_path / name),
        ]
        argv += ["--sampler-seed", str(seed)]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env), log

    doomed, doomed_log = start("doomed", 0)
    survivor, survivor_log = start("survivor", 1)
    try:
        deadline = time.monotonic() + 240
        while "batch 1: trials" not in (tmp_path / "doomed.err").read_text():
            assert doomed.poll() is None and time.monotonic() < deadline, (
                tmp_path / "doomed.err"
            ).read_text()
            time.sleep(0.05)
        doomed.send_signal(signal.SIGKILL)  # mid-batch: its trials are RUNNING
        doomed.wait()
        assert survivor.wait(timeout=180) == 0, (tmp_path / "survivor.err").read_text()
    finally:
        for worker in (doomed, survivor):
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        doomed_log.close()
        survivor_log.close()

    storage = optuna.storages.RDBStorage(postgres_url)
    try:
        study = optuna.load_study(study_name="shared", storage=storage)
        trials = study.trials
    finally:
        storage.engine.dispose()  # before the server stops: no connection left to collect
    study_done(trials, tmp_path)


def study_done(trials, tmp_path) -> None:
    """Six trials COMPLETE; each one the killed worker held FAILED and ran again, once."""
    by_state = {s: [t for t in trials if t.state == s] for s in TrialState}
    assert len(by_state[TrialState.COMPLETE]) == 6 and not by_state[TrialState.RUNNING]
    lost = [t for t in by_state[TrialState.FAIL] if not t.user_attrs.get(study_lib.OVER_BUDGET)]
    assert lost, "the killed worker held running trials"
    retries = {t.system_attrs.get("failed_trial"): t for t in by_state[TrialState.COMPLETE]}
    for t in lost:  # each lost trial ran again, with the same parameters, exactly once
        assert retries[t.number].params == t.params
    assert sum("failed_trial" in t.system_attrs for t in trials) == len(lost)
    assert "(retrying" in (tmp_path / "survivor.err").read_text()
    result = json.loads((tmp_path / "survivor" / "search.json").read_text())
    assert result["counts"]["COMPLETE"] == 6 and result["storage"].startswith("postgresql://")


class _DuplicateTable(Exception):
    sqlstate = "42P07"  # PostgreSQL's duplicate_table, as psycopg reports it


@pytest.mark.parametrize(
    "lost",
    [
        sqlalchemy.exc.ProgrammingError("CREATE TABLE", {}, _DuplicateTable("exists")),
        sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("unique")),
    ],
    ids=["duplicate table", "unique name"],
)
def test_a_worker_that_loses_the_race_to_create_the_tables_tries_again(lost, monkeypatch):
    """Two workers started together on a new PostgreSQL database both create Optuna's
    tables; the one that finds a table made is told so as a ProgrammingError
    (duplicate_table), not an IntegrityError, and must try again all the same."""
    calls = []

    def storage(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise lost
        return "storage"

    monkeypatch.setattr(study_lib, "RDBStorage", storage)
    monkeypatch.setattr(study_lib.time, "sleep", lambda s: None)
    opts = study_lib.StudyOptions("s", "postgresql://db/s", trials=4)
    assert study_lib.open_storage(opts) == "storage" and len(calls) == 2


def test_a_database_error_that_is_not_the_race_is_one_line_at_once(monkeypatch):
    calls = []

    def storage(*args, **kwargs):
        calls.append(args)
        raise sqlalchemy.exc.ProgrammingError("SELECT", {}, Exception("permission denied\nmore"))

    monkeypatch.setattr(study_lib, "RDBStorage", storage)
    opts = study_lib.StudyOptions("s", "postgresql://u:secret@db/s", trials=4)
    with pytest.raises(ConfigError, match="permission denied") as e:
        study_lib.open_storage(opts)
    assert len(calls) == 1 and "\n" not in str(e.value) and "secret" not in str(e.value)


# Opens (creates) the study in each SQLite file of argv[1::2] once the time that follows
# it is reached, so that several processes start creating its tables in the same instant.
CREATE_AT_ONCE = """
import sys, time
from jaxmnist.search import space, study
from jaxmnist import config
lr = space.parse_params(["optimizer.lr=log:1e-4:1e-1"], config.get_preset("tpu101"))
for path, at in zip(sys.argv[1::2], sys.argv[2::2]):
    opts = study.StudyOptions(name="s", storage=f"sqlite:///{path}", trials=4)
    time.sleep(max(0.0, float(at) - time.time()))
    study.open_study(opts, lr, 2)
    print("ok", path, flush=True)
"""


@pytest.mark.slow
def test_workers_started_together_on_a_new_sqlite_file_all_join(tmp_path):
    """Four workers creating one new study file at the same instant, three times (three
    files, 3 s apart, the same four processes): every one joins (one failed on `table
    studies already exists` in 2 of 5 tries)."""
    start = time.time() + 4.0  # after every interpreter has started and imported Optuna
    paths = [tmp_path / f"s{attempt}.db" for attempt in range(3)]
    argv = [str(x) for i, path in enumerate(paths) for x in (path, start + 3.0 * i)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CREATE_AT_ONCE, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert out.splitlines() == [f"ok {path}" for path in paths], err[-2000:]
    for path in paths:
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{path}")
        assert study_lib.declared(study)["trials"] == 4


def test_a_table_another_worker_made_first_on_sqlite_is_a_race_lost_not_an_error():
    import sqlite3

    def raised(sql):
        try:
            connection = sqlite3.connect(":memory:")
            connection.execute("create table t(x)")
            connection.execute(sql)
        except sqlite3.Error as e:
            return sqlalchemy.exc.OperationalError(sql, None, e)

    assert study_lib._lost_creation_race(raised("create table t(x)"))
    assert not study_lib._lost_creation_race(raised("select * from nosuch"))


def test_workers_open_a_new_sqlite_file_one_at_a_time(tmp_path):
    """SQLite commits each `CREATE` on its own: a worker that saw the studies table made
    skipped its unique index, and two workers each added the study. Opening the file
    waits for the lock beside it, and then makes the whole schema."""
    import threading

    import filelock

    path = tmp_path / "s.db"
    opts = study_lib.StudyOptions(name="s", storage=study_lib.sqlite_url(path), trials=1)
    opened = threading.Event()
    with filelock.FileLock(f"{path}.lock"):
        worker = threading.Thread(
            target=lambda: (study_lib.open_storage(opts), opened.set()), daemon=True
        )
        worker.start()
        assert not opened.wait(1.0)  # another worker holds the file: this one waits
        assert not path.exists()
    assert opened.wait(30.0)
    worker.join()
    study = optuna.create_study(study_name="s", storage=opts.storage)
    with pytest.raises(optuna.exceptions.DuplicatedStudyError):
        optuna.create_study(study_name="s", storage=opts.storage)
    assert study.study_name == "s"


def test_a_study_file_in_a_folder_not_made_yet_gets_its_folder(tmp_path):
    path = tmp_path / "new" / "s.db"
    opts = study_lib.StudyOptions(name="s", storage=study_lib.sqlite_url(path), trials=1)
    study_lib.open_storage(opts)
    assert path.is_file()


def _stopped_search(tmp_path, tiny_data_dir, monkeypatch, capsys, stop):
    """`jaxmnist search` on the tiny data, `stop()` called inside its first batch; (exit
    code, stderr, the study)."""
    from jaxmnist.search import worker as run_lib

    real = run_lib.run_batch

    def stopping(*args, **kw):
        stop()
        return real(*args, **kw)

    monkeypatch.setattr(run_lib, "run_batch", stopping)
    out = tmp_path / "s"
    argv = ["search", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--out", str(out)]
    argv += ["--param", "optimizer.lr=log:1e-4:1e-1", "--trials", "2", "--batch", "2"]
    argv += ["--validation", "100", "--epochs", "1", "--no-compile-cache", "--pruner", "none"]
    code = main(argv)
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{out / 'search.db'}")
    return code, capsys.readouterr().err, study


def test_sigterm_stops_a_search_as_ctrl_c_does(tmp_path, tiny_data_dir, monkeypatch, capsys):
    """Exit 143, one line with the command that resumes it, and the batch's trials failed
    and queued at once (it exited silently with them RUNNING)."""
    code, err, study = _stopped_search(
        tmp_path, tiny_data_dir, monkeypatch, capsys,
        lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(5)),
    )  # fmt: skip
    assert code == 143
    last = err.strip().splitlines()[-1]
    assert last.startswith("jaxmnist search: SIGTERM: stopped;") and "resume with: jaxmnist" in last
    assert "--trials 2" in last and "Traceback" not in err
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and states.count(TrialState.FAIL) == 2
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2  # queued to run again
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_a_storage_that_stops_answering_is_one_line_with_the_resume_command(
    tmp_path, tiny_data_dir, monkeypatch, capsys
):
    def gone():
        raise sqlalchemy.exc.OperationalError("SELECT 1", None, Exception("server closed"))

    code, err, _ = _stopped_search(tmp_path, tiny_data_dir, monkeypatch, capsys, gone)
    assert code == 1
    lines = err.strip().splitlines()
    assert lines[-1].startswith("jaxmnist search: error: the study's storage sqlite:///")
    assert "stopped answering (server closed)" in lines[-1] and "resume with:" in lines[-1]
    assert "Traceback" not in err


def test_the_heartbeat_stops_quietly_when_the_storage_stops_answering(capfd):
    class Gone:
        def record_heartbeat(self, trial_id):
            raise sqlalchemy.exc.OperationalError("UPDATE", None, Exception("no server"))

    with study_lib.Heartbeat(Gone(), [1, 2], interval=0.01) as beat:
        beat.thread.join(timeout=5)
    assert not beat.thread.is_alive() and "no server" in str(beat.error)
    assert "Traceback" not in capfd.readouterr().err


def test_the_trials_draw_what_the_param_declares(tmp_path):
    """Not only the declared distribution: the values drawn. A log range puts half its
    draws below the geometric mean of its ends (a linear draw puts about 3% there); a
    uniform one half below the midpoint; an integer range draws integers on its step."""
    ps = space.parse_params(
        [
            "optimizer.lr=log:1e-4:1e-1",
            "optimizer.momentum=uniform:0.8:0.99",
            "train.batch_size=uniform:32:256:32",
        ],
        BASE,
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = []
    for _ in range(400):
        trial = study.ask()
        drawn.append(space.suggest(trial, ps))
        study.tell(trial, 0.0)
    lrs = np.array([d["optimizer.lr"] for d in drawn])
    assert 0.4 < np.mean(lrs < np.sqrt(1e-4 * 1e-1)) < 0.6
    assert lrs.min() >= 1e-4 and lrs.max() <= 1e-1
    momenta = np.array([d["optimizer.momentum"] for d in drawn])
    assert 0.4 < np.mean(momenta < 0.895) < 0.6
    batches = {d["train.batch_size"] for d in drawn}
    assert batches == set(range(32, 257, 32))


@pytest.mark.parametrize("keys", [1, 2, 4])
def test_the_parallel_coordinates_figure_fits_its_canvas(keys):
    """Its title was cut off with two parameters."""
    from jaxmnist.search import page

    names = ["optimizer.lr", "optimizer.weight_decay", "optimizer.momentum", "optimizer.b1"]
    params = [f"{k}=log:1e-4:1e-1" for k in names[:keys]]
    rng = np.random.default_rng(0)
    trials = [
        {"state": "COMPLETE", "value": float(rng.uniform(0.8, 0.99)),
         "values": {k: float(10 ** rng.uniform(-4, -1)) for k in names[:keys]}}
        for _ in range(6)
    ]  # fmt: skip
    fig = page.parallel_figure({"trials": trials, "params": params})
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    width, height = fig.get_size_inches()
    assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, box
