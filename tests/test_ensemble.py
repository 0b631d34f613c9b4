"""The ensemble of a run of several seeds: the mean of its members' softmax probabilities.

`eval`, `predict`, `export` and `serve` use it by default and one member with
`--member I`; training records its test accuracy and loss after every epoch, the
same whether the population ran in one chunk or in several.
"""

import json
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_export import check_matches_eval
from test_seeds import small_cfg

from jaxmnist.cli import main
from jaxmnist.data import registry
from jaxmnist.errors import ConfigError
from jaxmnist.models.ensemble import ensemble_log_probs
from jaxmnist.report import run_report
from jaxmnist.report.rundata import load_run
from jaxmnist.runs.predictions import PREDICTIONS_FILE, load_test_predictions
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training import memory, population
from jaxmnist.training.loop import train_population
from jaxmnist.use import chunks as chunks_lib
from jaxmnist.use import export, predict, reevaluate

SEEDS = 3
# An exported model's probabilities, by batches of 7, where jaxmnist cannot be imported.
PROBABILITIES = textwrap.dedent(
    """
    import sys
    sys.modules["jaxmnist"] = None

    import json
    import jax
    import numpy as np

    with open(sys.argv[1], "rb") as f:
        header = json.loads(f.readline())
        model = jax.export.deserialize(bytearray(f.read()))
    images = np.load(sys.argv[2])
    probs = [np.asarray(model.call(images[i : i + 7])) for i in range(0, len(images), 7)]
    np.save(sys.argv[3], np.concatenate(probs))
    """
)


@pytest.fixture(scope="module")
def module_data_dir(shared_data_dir, tiny_spec):
    """`tiny_data_dir` for the whole module: the shared runs' data, registered as `tiny`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.DATASETS, "tiny", tiny_spec)
        yield shared_data_dir


@pytest.fixture(autouse=True)
def _tiny_registered(tiny_registered):
    """The shared run of seeds names dataset `tiny`: loading its model needs it known."""


def tiny_train_argv(data_dir, run_dir, *extra):
    return [
        "train", "--dataset", "tiny", "--data-dir", str(data_dir), "--run-dir", str(run_dir),
        "--batch-size", "32", "--epochs", "2", "--no-compile-cache", "--no-report", "--quiet",
        *extra,
    ]  # fmt: skip


def test_the_ensembles_probabilities_are_the_mean_of_the_members(tiny_seeds_run, tiny_arrays):
    images = tiny_arrays["test_images"]
    ensemble = predict.load_trained(tiny_seeds_run)
    assert ensemble.ensemble and ensemble.members == SEEDS and ensemble.member is None
    assert "ensemble of 3" in ensemble.describe()
    members = [predict.load_trained(tiny_seeds_run, i) for i in range(SEEDS)]
    assert [m.seed for m in members] == [0, 1, 2] and not any(m.ensemble for m in members)
    probs = [predict.compile_predict(m, 64)(images) for m in members]
    together = predict.compile_predict(ensemble, 64)(images)
    np.testing.assert_allclose(together, np.mean(probs, axis=0), rtol=1e-5, atol=1e-6)
    # The members differ (else the mean would hold trivially).
    assert np.abs(probs[0] - probs[1]).max() > 1e-3


def test_an_ensemble_of_identical_members_is_that_member(tiny_seeds_run, tiny_arrays):
    member = predict.load_trained(tiny_seeds_run, 1)
    copies = jax.tree.map(lambda x: jnp.stack([x] * SEEDS), member.params)
    model_cfg, classes = member.config.model, len(member.class_names)
    images = tiny_arrays["test_images"]
    ensemble = jnp.exp(ensemble_log_probs(model_cfg, copies, images))
    alone = predict.probabilities_fn(model_cfg)(member.params, images)
    np.testing.assert_allclose(ensemble, alone, rtol=1e-5, atol=1e-6)

    data = evaluate_lib.place_eval_data(images, tiny_arrays["test_labels"], 64)
    one = evaluate_lib.compile_evaluate(model_cfg, member.params, data, classes)(
        member.params, data
    )
    members, together = evaluate_lib.evaluate_stacked(model_cfg, copies, data, classes, True)
    assert together.accuracy == one.accuracy and together.count == one.count == 150
    assert [m.accuracy for m in members] == [one.accuracy] * SEEDS
    assert together.loss == pytest.approx(one.loss, rel=1e-5)
    np.testing.assert_array_equal(together.confusion, one.confusion)


def test_eval_reports_the_ensemble_beside_each_member(
    tiny_seeds_run, module_data_dir, tiny_arrays, capsys
):
    labels = tiny_arrays["test_labels"]
    argv = ["eval", str(tiny_seeds_run), "--data-dir", str(module_data_dir), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ensemble_members"] == SEEDS and len(result["test_accuracy_per_seed"]) == SEEDS
    # The ensemble's figures are those of the mean probabilities, from another code path.
    probs = predict.compile_predict(predict.load_trained(tiny_seeds_run), 64)(
        tiny_arrays["test_images"]
    )
    assert result["ensemble_test_accuracy"] == np.mean(probs.argmax(-1) == labels)
    nll = -np.log(probs[np.arange(len(labels)), labels]).mean()
    assert result["ensemble_test_loss"] == pytest.approx(nll, rel=1e-4)
    confusion = np.zeros((10, 10), int)
    np.add.at(confusion, (labels, probs.argmax(-1)), 1)
    assert result["confusion_matrix"] == confusion.tolist()
    # eval repeats what training measured after its last epoch.
    summary = json.loads((tiny_seeds_run / "summary.json").read_text())
    assert result["ensemble_test_accuracy"] == summary["ensemble_test_accuracy"]
    assert result["ensemble_test_loss"] == pytest.approx(summary["ensemble_test_loss"], rel=1e-5)

    assert main([*argv, "--member", "2"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["member"] == 2 and one["seed"] == 2 and "ensemble_test_accuracy" not in one
    assert one["test_accuracy"] == pytest.approx(result["test_accuracy_per_seed"][2])
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "ensemble     accuracy" in out and "the confusion matrix is the ensemble's" in out


def test_the_exported_ensemble_runs_without_jaxmnist_and_matches_eval(
    tiny_seeds_run, tiny_arrays, tmp_path, capsys
):
    header, evaluated = check_matches_eval(
        tiny_seeds_run, tiny_arrays["test_images"], tiny_arrays["test_labels"], tmp_path, capsys
    )
    assert header["trained"]["ensemble"]["members"] == SEEDS
    assert header["output"]["shape"] == ["batch", 10]
    assert "ensemble of 3" in header["output_meaning"]
    assert evaluated["ensemble_members"] == SEEDS  # eval's figures were the ensemble's
    labels = tiny_arrays["test_labels"]
    accuracy = np.trace(evaluated["confusion_matrix"]) / len(labels)
    assert accuracy == evaluated["ensemble_test_accuracy"]
    # Its probabilities, in another fresh process: eval's ensemble loss, and the members' mean.
    np.save(tmp_path / "images.npy", tiny_arrays["test_images"])
    done = subprocess.run(
        [sys.executable, "-c", PROBABILITIES, str(tmp_path / "model.jaxexport"),
         str(tmp_path / "images.npy"), str(tmp_path / "probs.npy")],
        check=False, capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    probs = np.load(tmp_path / "probs.npy")
    nll = -np.log(probs[np.arange(len(labels)), labels]).mean()
    assert nll == pytest.approx(evaluated["ensemble_test_loss"], rel=1e-4)
    members = [predict.load_trained(tiny_seeds_run, i) for i in range(SEEDS)]
    mean = np.mean([predict.compile_predict(m, 64)(tiny_arrays["test_images"]) for m in members], 0)
    np.testing.assert_allclose(probs, mean, rtol=1e-4, atol=1e-6)


def test_serve_describes_and_serves_the_ensemble(tiny_seeds_run, tiny_arrays):
    from starlette.testclient import TestClient

    from jaxmnist.use.serve import app as app_lib

    image = tiny_arrays["test_images"][0]
    for member, expected in ((None, "ensemble of 3"), ("1", "member 1 of the run's 3")):
        model = predict.load_trained(tiny_seeds_run, member)
        with TestClient(app_lib.create_app(model), base_url="http://127.0.0.1") as client:
            info = client.get("/api/model").json()
            answer = client.post("/api/predict", json={"image": image.tolist()}).json()
        assert expected in info["which"] and info["seeds_in_run"] == SEEDS
        assert (info["ensemble"] or {}).get("members") == (SEEDS if member is None else None)
        want = predict.compile_predict(model, 1)(image[None])[0]
        np.testing.assert_allclose(answer["probabilities"], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad", ["-1", "3", "1.5", "one"])
def test_a_bad_member_exits_2_in_one_line_naming_the_range(
    tiny_seeds_run, module_data_dir, tmp_path, capsys, bad
):
    out = tmp_path / "model.jaxexport"
    commands = {
        "eval": ["eval", str(tiny_seeds_run), "--data-dir", str(module_data_dir)],
        "predict": ["predict", str(tiny_seeds_run), str(tmp_path / "x.npy")],
        "export": ["export", str(tiny_seeds_run), "--out", str(out)],
        "serve": ["serve", str(tiny_seeds_run), "--port", "0"],
    }
    np.save(tmp_path / "x.npy", np.zeros((1, 28, 28), np.uint8))
    for name, argv in commands.items():
        assert main([*argv, "--member", bad]) == 2, name
        captured = capsys.readouterr()
        err = captured.err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"jaxmnist {name}: error: --member"), err
        assert "0..2" in err[0] and not captured.out
    assert not out.exists()


def test_member_0_is_a_one_model_runs_only_model(tiny_model_run, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 28, 28), np.uint8))
    argv = ["predict", str(tiny_model_run), str(tmp_path / "x.npy"), "--json"]
    assert main(argv) == 0
    default = capsys.readouterr().out
    assert main([*argv, "--member", "0"]) == 0
    assert capsys.readouterr().out == default
    assert main([*argv, "--member", "1"]) == 2
    assert "within 0..0 (the run has one model)" in capsys.readouterr().err
    model = predict.load_trained(tiny_model_run)
    assert not model.ensemble and model.info()["ensemble"] is None


@pytest.mark.accelerator
@pytest.mark.slow
def test_chunks_of_a_population_make_one_ensemble(tiny_dataset, tiny_arrays, monkeypatch):
    cfg = small_cfg(seeds=SEEDS)
    whole = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    monkeypatch.setattr(memory, "chunks_for", lambda *a, **k: ((2, 1), {"chunks": [2, 1]}))
    chunked = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    assert whole.population.chunks == (3,) and chunked.population.chunks == (2, 1)
    assert len(whole.records) == len(chunked.records) == 2
    for a, b in zip(whole.records, chunked.records, strict=True):
        assert a["ensemble_test_accuracy"] == pytest.approx(b["ensemble_test_accuracy"], abs=1e-9)
        assert a["ensemble_test_loss"] == pytest.approx(b["ensemble_test_loss"], rel=1e-4)
    # The chunks' ensemble is the one of every member's parameters in one call.
    data = evaluate_lib.place_eval_data(tiny_arrays["test_images"], tiny_arrays["test_labels"], 64)
    params = chunked.population.params(chunked.states)
    _, direct = evaluate_lib.evaluate_stacked(cfg.model, params, data, 10, ensemble=True)
    assert chunked.ensemble.accuracy == direct.accuracy
    # One sum of every member's log-probabilities against per-chunk sums: the same to the
    # CPU's float32 rounding, an accelerator's transcendental functions round differently.
    rel = 1e-5 if jax.default_backend() == "cpu" else 1e-4
    assert chunked.ensemble.loss == pytest.approx(direct.loss, rel=rel)
    np.testing.assert_array_equal(chunked.ensemble.confusion, direct.confusion)
    assert chunked.records[-1]["ensemble_test_loss"] == chunked.ensemble.loss
    # ... and not any member's, nor their mean's.
    assert direct.loss not in chunked.records[-1]["test_loss_per_seed"]


@pytest.mark.parametrize("chunks", [(3,), (2, 1)])
def test_the_ensemble_compiles_beside_the_chunks_programs(tiny_dataset, monkeypatch, chunks):
    """The program that finishes the ensemble is compiled with the first chunk's programs,
    at once (on an accelerator, each on a thread of its own), not after them: once a run,
    for as many chunks as it trains."""
    batches: list[tuple[population.Compiles, list[str]]] = []
    add = population.Compiles.add

    def recorded(self, name, lowered):
        if not batches or batches[-1][0] is not self:
            batches.append((self, []))
        batches[-1][1].append(name)
        return add(self, name, lowered)

    monkeypatch.setattr(population.Compiles, "add", recorded)
    monkeypatch.setattr(memory, "chunks_for", lambda *a, **k: (chunks, {"chunks": list(chunks)}))
    cfg = small_cfg(seeds=SEEDS, epochs=1)
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    assert result.population.chunks == chunks and result.ensemble is not None
    assert [n for _, names in batches for n in names].count("ensemble") == 1
    assert {"steps", "eval", "ensemble"} <= set(batches[0][1])
    assert result.population.finish_chunks == len(chunks)


@pytest.mark.slow
def test_eval_repeats_the_val_ensemble_training_measured(module_data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    argv = tiny_train_argv(module_data_dir, run, "--seeds", "2", "data.validation=50")
    assert main(argv) == 0
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(run), "--data-dir", str(module_data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ensemble_val_accuracy"] == summary["ensemble_val_accuracy"]
    assert result["ensemble_val_loss"] == pytest.approx(summary["ensemble_val_loss"], rel=1e-5)
    assert result["ensemble_test_accuracy"] == summary["ensemble_test_accuracy"]
    assert main(["eval", str(run), "--data-dir", str(module_data_dir)]) == 0
    shown = f"  on val     accuracy {summary['ensemble_val_accuracy']:.2%}"
    assert shown in capsys.readouterr().out


def test_a_run_with_tta_is_measured_with_it_and_eval_can_choose(module_data_dir, tmp_path, capsys):
    """`model.tta_shift` is the model's inference: training's evaluations use it, eval
    repeats them by default, and `eval --tta-shift N` evaluates the same parameters with
    another (the run left as it was)."""
    run = tmp_path / "run"
    assert main(tiny_train_argv(module_data_dir, run, "--seeds", "2", "model.tta_shift=1")) == 0
    summary = json.loads((run / "summary.json").read_text())
    config = (run / "config.json").read_text()
    capsys.readouterr()

    def evaluate(*extra):
        argv = ["eval", str(run), "--data-dir", str(module_data_dir), "--json", *extra]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)

    default, none = evaluate(), evaluate("--tta-shift", "0")
    assert default["tta_shift"] == 1 and none["tta_shift"] == 0
    assert default["ensemble_test_accuracy"] == summary["ensemble_test_accuracy"]
    assert default["ensemble_test_loss"] == pytest.approx(summary["ensemble_test_loss"], rel=1e-5)
    assert none["ensemble_test_loss"] != pytest.approx(default["ensemble_test_loss"], rel=1e-3)
    assert (run / "config.json").read_text() == config
    assert main(["eval", str(run), "--data-dir", str(module_data_dir), "--tta-shift", "2"]) == 0
    assert "its four moves by 2 pixel(s)" in capsys.readouterr().out
    assert main(["eval", str(run), "--data-dir", str(module_data_dir), "--tta-shift", "5"]) == 2
    assert "model.tta_shift: 0 (none) to 4 pixels" in capsys.readouterr().err


@pytest.mark.accelerator
def test_the_ensemble_takes_no_second_pass_over_a_set(tiny_dataset, monkeypatch):
    """Each chunk's evaluation program gives its members' figures and its part of the
    ensemble from one forward pass: the model is traced once, for the one program that
    evaluates every set's blocks, as in a sweep that evaluates no ensemble, and the
    members' figures are the sweep's."""
    traced: list[int] = []
    apply = evaluate_lib.apply_uint8

    def counted(*args, **kwargs):
        traced.append(1)
        return apply(*args, **kwargs)

    monkeypatch.setattr(evaluate_lib, "apply_uint8", counted)
    cfg = small_cfg(seeds=SEEDS, epochs=1, eval_train=True, eval_train_examples=64)
    members = population.seed_members(cfg)
    together = train_population(cfg, members, tiny_dataset)
    assert together.ensemble is not None and len(traced) == 1  # the test and training sets
    traced.clear()
    alone = train_population(cfg, members, tiny_dataset, ensemble=False)
    assert alone.ensemble is None and len(traced) == 1
    for key in ("test_accuracy_per_seed", "test_loss_per_seed", "train_accuracy"):
        assert together.records[-1][key] == alone.records[-1][key]


def test_a_seeds_run_records_the_ensemble_and_a_sweep_does_not(tiny_dataset):
    cfg = small_cfg(seeds=2, epochs=1)
    points = train_population(cfg, population.seed_members(cfg), tiny_dataset, points=[0, 1])
    assert points.ensemble is None and "ensemble_test_accuracy" not in points.records[-1]
    one = train_population(small_cfg(epochs=1), population.seed_members(small_cfg()), tiny_dataset)
    assert one.ensemble is None and "ensemble_test_loss" not in one.records[-1]


def test_summary_and_metrics_carry_the_ensemble(tiny_seeds_run):
    summary = json.loads((tiny_seeds_run / "summary.json").read_text())
    records = [json.loads(x) for x in (tiny_seeds_run / "metrics.jsonl").read_text().splitlines()]
    assert summary["ensemble_members"] == SEEDS
    assert all("ensemble_test_accuracy" in r and "ensemble_test_loss" in r for r in records)
    assert summary["ensemble_test_accuracy"] == records[-1]["ensemble_test_accuracy"]
    assert summary["ensemble_test_loss"] == records[-1]["ensemble_test_loss"]
    # The exported and served ensemble says the accuracy training measured.
    assert predict.load_trained(tiny_seeds_run).test_accuracy == summary["ensemble_test_accuracy"]


def test_report_compare_and_tensorboard_show_the_ensemble(tiny_seeds_run, tmp_path):
    import shutil

    from jaxmnist.report import plots
    from jaxmnist.report.compare import render_comparison
    from jaxmnist.report.run_report import figure_makers, write_run_report
    from jaxmnist.report.rundata import load_run

    run = load_run(tiny_seeds_run)
    confusion = json.loads((tiny_seeds_run / "confusion_matrix.json").read_text())
    assert run.ensemble_confusion.tolist() == confusion["ensemble_matrix"]
    summary = run.summary
    assert np.trace(run.ensemble_confusion) / 150 == summary["ensemble_test_accuracy"]
    assert "ensemble_confusion_matrix" in figure_makers(run)
    copy = shutil.copytree(tiny_seeds_run, tmp_path / "run")  # the report adds its plots
    page = write_run_report(copy, tmp_path / "report.html").read_text()
    assert "Ensemble confusion matrix" in page and "Ensemble of 3" in page
    axes = plots.accuracy_curves(run.records).axes[0]
    ensemble_line = [x for x in axes.get_lines() if x.get_label() == "test, ensemble"]
    assert len(ensemble_line) == 1
    np.testing.assert_allclose(
        ensemble_line[0].get_ydata(), [100 * r["ensemble_test_accuracy"] for r in run.records]
    )

    # Compare: the ensemble's row beside a run that has none.
    single = tmp_path / "single"
    shutil.copytree(tiny_seeds_run, single)
    s = json.loads((single / "summary.json").read_text())
    for key in ("ensemble_test_accuracy", "ensemble_test_loss", "ensemble_members"):
        del s[key]
    (single / "summary.json").write_text(json.dumps(s))
    page = render_comparison([run, load_run(single)])
    assert "Ensemble test accuracy" in page and "(ensemble of 3)" in page

    tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from jaxmnist.report.tensorboard import EVENTS_DIR, EventWriter

    writer = EventWriter(tmp_path / "tb")
    for record in run.records:
        writer.write_epoch(record)
    writer.close()
    events = tb.EventAccumulator(str(tmp_path / "tb" / EVENTS_DIR))
    events.Reload()
    values = [e.value for e in events.Scalars("accuracy/ensemble_test")]
    assert values == pytest.approx([r["ensemble_test_accuracy"] for r in run.records])
    assert len(events.Scalars("loss/ensemble_test")) == len(run.records)


def test_the_terminal_shows_the_ensemble(module_data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    argv = tiny_train_argv(module_data_dir, run, "--seeds", "2", "--epochs", "1")
    assert main([a for a in argv if a != "--quiet"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    epoch_line = next(line for line in out.splitlines() if "(mean of 2)" in line)
    assert f"ensemble {summary['ensemble_test_accuracy']:.2%}" in epoch_line
    assert "ensemble of 2 (the mean of their probabilities): test accuracy" in out


def test_an_ensemble_runs_saved_predictions_are_the_ensembles(tiny_seeds_run, tiny_arrays):
    saved = load_test_predictions(tiny_seeds_run)
    assert saved.predicted_by == f"the ensemble of {SEEDS} members"
    # The probabilities of its last evaluation: those of the ensemble the use path makes.
    probs = predict.compile_predict(predict.load_trained(tiny_seeds_run), 64)(
        tiny_arrays["test_images"]
    )
    np.testing.assert_allclose(saved.probs, probs, rtol=1e-5, atol=1e-7)
    summary = json.loads((tiny_seeds_run / "summary.json").read_text())
    labels = tiny_arrays["test_labels"]
    assert np.mean(saved.predicted == labels) == summary["ensemble_test_accuracy"]
    first = predict.compile_predict(predict.load_trained(tiny_seeds_run, 0), 64)(
        tiny_arrays["test_images"]
    )
    assert not np.allclose(saved.probs, first, atol=1e-4)  # not the first member's
    # The report's grids say whose predictions they show.
    makers = run_report.figure_makers(load_run(tiny_seeds_run))
    assert f"the ensemble of {SEEDS} members" in makers["predictions"][1]
    assert f"the ensemble of {SEEDS} members" in makers["confident_mistakes"][1]


def test_a_one_model_runs_saved_predictions_are_its_own(tiny_cli_run, tiny_arrays):
    saved = load_test_predictions(tiny_cli_run)
    assert saved.predicted_by == "seed 0"
    probs = predict.compile_predict(predict.load_trained(tiny_cli_run), 64)(
        tiny_arrays["test_images"]
    )
    np.testing.assert_allclose(saved.probs, probs, rtol=1e-5, atol=1e-7)


def test_predictions_saved_before_they_said_whose_are_the_first_seeds(tiny_seeds_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_seeds_run, run)
    with np.load(run / PREDICTIONS_FILE) as f:
        arrays = {k: f[k] for k in f.files if k != "predicted_by"}
    np.savez_compressed(run / PREDICTIONS_FILE, **arrays)
    assert load_test_predictions(run).predicted_by == ""
    makers = run_report.figure_makers(load_run(run))
    assert "seed 0 predicted" in makers["predictions"][1]


def test_an_ensemble_in_chunks_is_the_same_ensemble(tiny_seeds_run, tiny_arrays):
    params = predict.load_trained(tiny_seeds_run).params
    cfg = predict.load_trained(tiny_seeds_run).config
    images = jnp.asarray(tiny_arrays["test_images"])
    whole = ensemble_log_probs(cfg.model, params, images)
    apart = jax.jit(lambda p, x: ensemble_log_probs(cfg.model, p, x, SEEDS))(params, images)
    np.testing.assert_allclose(apart, whole, atol=1e-6)
    assert (apart.argmax(-1) == whole.argmax(-1)).all()
    with pytest.raises(ValueError, match="2 chunks do not divide an ensemble of 3"):
        ensemble_log_probs(cfg.model, params, images, 2)


BIG_BATCH = 8192  # activations of three members at once: megabytes, whatever the model


def _budget_between(tiny_seeds_run) -> int:
    """A memory budget (MB) the ensemble fits one member at a time, not all at once, at
    `BIG_BATCH`; the footprints as `use.chunks` reads them."""
    model = predict.load_trained(tiny_seeds_run)
    shape = jax.ShapeDtypeStruct((BIG_BATCH, *model.image_shape), jnp.uint8)
    bytes_in = {}
    for chunks in (1, SEEDS):
        fn = predict.probabilities_fn(model.config.model, True, chunks)
        compiled = jax.jit(fn).lower(model.params, shape).compile()
        bytes_in[chunks] = chunks_lib.program_bytes(compiled)
    lower, upper = bytes_in[SEEDS] // memory.MB + 1, bytes_in[1] // memory.MB
    assert lower <= upper, bytes_in  # the chunks hold less: a budget fits between
    return lower


def test_predict_runs_an_ensemble_in_the_fewest_chunks_that_fit(tiny_seeds_run, tiny_arrays):
    budget = _budget_between(tiny_seeds_run)
    images = tiny_arrays["test_images"]
    whole = predict.compile_predict(predict.load_trained(tiny_seeds_run), BIG_BATCH)
    model = predict.load_trained(tiny_seeds_run, memory_budget_mb=budget)
    apart = predict.compile_predict(model, BIG_BATCH)
    assert (whole.chunks, apart.chunks) == (1, SEEDS)
    np.testing.assert_allclose(apart(images), whole(images), rtol=1e-5, atol=1e-7)
    assert (apart(images).argmax(-1) == whole(images).argmax(-1)).all()
    # A budget below one member's program: one line, before anything is predicted.
    small = predict.load_trained(tiny_seeds_run, memory_budget_mb=1)
    with pytest.raises(ConfigError, match="^the ensemble of 3 members needs about .* MB even "):
        predict.compile_predict(small, BIG_BATCH)


def test_eval_runs_an_ensemble_in_the_chunks_chosen(tiny_seeds_run, module_data_dir, monkeypatch):
    whole = reevaluate.evaluate_run(tiny_seeds_run, module_data_dir)
    asked, used = [], []
    monkeypatch.setattr(  # as a budget that fits one member at a time would choose
        reevaluate, "fewest_chunks", lambda members, footprint, *a: asked.append(a) or members
    )
    real, program = reevaluate.evaluate_stacked, evaluate_lib.stacked_program
    monkeypatch.setattr(reevaluate, "evaluate_stacked", lambda *a: used.append(a[5]) or real(*a))
    sizes = []  # the members each call of the evaluation gets

    def recording(*a):
        run = program(*a)
        return lambda params, data: (
            sizes.append(len(jax.tree.leaves(params)[0])) or run(params, data)
        )

    monkeypatch.setattr(evaluate_lib, "stacked_program", recording)
    apart = reevaluate.evaluate_run(tiny_seeds_run, module_data_dir, memory_budget_mb=15)
    assert asked[0][0] == 15 * memory.MB and set(used) == {SEEDS}
    assert sizes and set(sizes) == {1}  # one member at a time, on every set
    for key in ("test_accuracy_per_seed", "ensemble_test_accuracy", "confusion_matrix"):
        assert apart[key] == whole[key], key
    assert apart["ensemble_test_loss"] == pytest.approx(whole["ensemble_test_loss"], rel=1e-6)
    assert apart["test_loss_per_seed"] == pytest.approx(whole["test_loss_per_seed"], rel=1e-6)


def test_the_fewest_chunks_that_fit_divide_the_members():
    footprints = {1: 90, 2: 50, 3: 40, 6: 25}
    assert chunks_lib.fewest_chunks(6, footprints.get, 100, "the budget") == 1
    assert chunks_lib.fewest_chunks(6, footprints.get, 45, "the budget") == 3
    assert chunks_lib.fewest_chunks(6, footprints.get, None, "unknown") == 1
    with pytest.raises(ConfigError, match="even one member at a time, but the budget is"):
        chunks_lib.fewest_chunks(6, footprints.get, 20, "the budget")


def test_an_exported_ensemble_runs_in_the_chunks_chosen(
    tiny_seeds_run, tiny_arrays, monkeypatch, tmp_path
):
    model = predict.load_trained(tiny_seeds_run)
    images = tiny_arrays["test_images"]
    expected = predict.compile_predict(model, 64)(images)
    monkeypatch.setattr(chunks_lib, "fewest_chunks", lambda members, *a: members)
    path = tmp_path / "chunked.jaxmnist"
    header = export.export_model(model, path, platforms=("cpu",))
    assert header["ensemble_chunks"] == SEEDS
    _, blob = path.read_bytes().split(b"\n", 1)
    exported = jax.export.deserialize(bytearray(blob))
    np.testing.assert_allclose(exported.call(images), expected, rtol=1e-5, atol=1e-7)
    assert "stablehlo.while" in exported.mlir_module()  # the chunks' loop, in the program
