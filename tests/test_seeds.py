"""Many seeds in one program: same result as alone, chunks, memory, time to target, the CLI."""

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist.cli import main
from jaxmnist.errors import ConfigError
from jaxmnist.training import memory, pacing, parallel, population
from jaxmnist.training.hooks import Callback
from jaxmnist.training.loop import train_population


def small_cfg(**train):
    cfg = config_lib.get_preset("tpu101")
    train = {"batch_size": 32, "epochs": 2, "eval_batch_size": 64, "eval_train": False, **train}
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, hidden=(32,)),
        train=dataclasses.replace(cfg.train, **train),
        compile_cache=False,
    )


def test_member_keys_are_those_of_a_single_run():
    init_key, shuffle_key = jax.random.split(jax.random.key(5))
    k_init, k_epochs = population.member_keys(5, 3)
    assert np.array_equal(jax.random.key_data(k_init), jax.random.key_data(init_key))
    assert np.array_equal(
        jax.random.key_data(k_epochs), jax.random.key_data(jax.random.split(shuffle_key, 3))
    )
    cfg = small_cfg(seed=7, seeds=3)
    assert [m.seed for m in population.seed_members(cfg)] == [7, 8, 9]


@pytest.mark.parametrize("block", [population.KEY_BLOCK, 2])
def test_population_keys_are_each_members_own_whatever_its_seed(block, monkeypatch):
    monkeypatch.setattr(population, "KEY_BLOCK", block)  # 2: three calls, the last padded
    seeds = [0, 5, 2**31 - 1, 2**31, 2**32 - 1]  # config.MAX_SEED is the last
    init, epochs = population.population_keys(seeds, 3)
    assert init.shape[0] == epochs.shape[0] == len(seeds) and epochs.shape[1] == 3
    for i, seed in enumerate(seeds):
        k_init, k_epochs = population.member_keys(seed, 3)
        assert np.array_equal(init[i], jax.random.key_data(k_init)), seed
        assert np.array_equal(epochs[i], jax.random.key_data(k_epochs)), seed


def test_a_long_runs_epoch_keys_are_computed_member_by_member(monkeypatch):
    """Epoch keys cost N x epochs, whatever KEY_BLOCK is: a one-seed run of 100,000 epochs
    (train until stopped) once computed them for a padded block of 1,024 seeds."""
    shapes, real = [], population._epoch_keys

    def spy(raw, num_epochs):
        shapes.append(np.shape(raw))
        return real(raw, num_epochs)

    monkeypatch.setattr(population, "_epoch_keys", spy)
    init, epochs = population.population_keys([3, 4], 100_000)
    assert shapes == [(2,), (2,)]  # one member's raw key per call
    assert epochs.shape == (2, 100_000, 2)
    for i, seed in enumerate((3, 4)):
        k_init, k_epochs = population.member_keys(seed, 100_000)
        assert np.array_equal(init[i], jax.random.key_data(k_init))
        assert np.array_equal(epochs[i], jax.random.key_data(k_epochs))


def _params(result, index):
    return jax.device_get(result.population.member_params(result.states, index))


@pytest.fixture(scope="module")
def four_seeds(tiny_dataset):
    """Seeds 0-3 of a small config trained together, in one chunk."""
    cfg = small_cfg(seeds=4, epochs=1, progress_every=10)
    return train_population(cfg, population.seed_members(cfg), tiny_dataset)


@pytest.mark.accelerator
def test_vmapped_seed_equals_that_seed_alone(tiny_dataset, four_seeds):
    alone_cfg = small_cfg(seed=1, epochs=1, progress_every=10)
    alone = train_population(alone_cfg, population.seed_members(alone_cfg), tiny_dataset)
    assert len(four_seeds.population) == 4 and len(alone.population) == 1
    for a, b in zip(jax.tree.leaves(_params(alone, 0)), jax.tree.leaves(_params(four_seeds, 1))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for key in ("train_loss", "test_loss"):
        assert four_seeds.records[-1][f"{key}_per_seed"][1] == pytest.approx(
            alone.records[-1][key], rel=1e-4
        )
    assert four_seeds.test.accuracy[1] == pytest.approx(alone.test.accuracy[0], abs=1 / 150)
    # The seeds really differ from each other.
    assert not np.allclose(
        jax.tree.leaves(_params(four_seeds, 0))[0], jax.tree.leaves(_params(four_seeds, 1))[0]
    )


class CountingReporter(Callback):
    def __init__(self):
        self.totals, self.seen = [], []

    def on_epoch_start(self, epoch, num_steps, first_step):
        self.totals.append(num_steps)

    def on_steps(self, end):
        self.seen.append((end.step, end.epoch_step))


@pytest.mark.accelerator
def test_memory_chunks_give_the_same_result(tiny_dataset, four_seeds, paced_by_steps, monkeypatch):
    cfg = four_seeds.population.cfg
    # Two chunks of two, as a budget with room for two at a time gives them (the memory
    # estimate's own tests say which budgets do; a device's estimate differs from a CPU's).
    monkeypatch.setattr(memory, "chunks_for", lambda *a, **k: ((2, 2), {"chunks": [2, 2]}))
    chunked_cfg = cfg
    reporter = CountingReporter()
    chunked = train_population(
        chunked_cfg, population.seed_members(chunked_cfg), tiny_dataset, reporter
    )
    assert chunked.population.chunks == (2, 2) and four_seeds.population.chunks == (4,)
    assert chunked.info["chunks"] == [2, 2]
    for i in range(4):
        for a, b in zip(
            jax.tree.leaves(_params(four_seeds, i)), jax.tree.leaves(_params(chunked, i))
        ):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # Both chunks take each call's steps together: one bar of 20 steps. The first call
    # is one step (to time it), and calls end at every progress_every=10 steps.
    assert reporter.totals == [20]
    assert reporter.seen == [(1, 1), (10, 10)]


def test_plan_chunks_and_the_too_small_message():
    est = memory.MemoryEstimate(
        shared_bytes=100 * memory.MB,
        resident_per_model=10 * memory.MB,
        transient_per_model=50 * memory.MB,
    )
    assert memory.plan_chunks(8, est, None) == (8,)
    assert memory.plan_chunks(8, est, 10_000 * memory.MB) == (8,)
    assert memory.plan_chunks(8, est, 300 * memory.MB) == (2, 2, 2, 2)  # room 120 MB: 2 per chunk
    assert memory.plan_chunks(8, est, 380 * memory.MB) == (4, 4)
    assert memory.plan_chunks(7, est, 270 * memory.MB) == (2, 2, 2, 1)
    message = (
        r"8 models need about 230 MB even one at a time .* "
        r"but memory_budget_mb is 200 MB; train at most 5 seeds"
    )
    with pytest.raises(ConfigError, match=message):
        memory.plan_chunks(8, est, 200 * memory.MB, "memory_budget_mb")


def test_target_accuracy_stops_early_and_records_times(tiny_dataset, tmp_path):
    from jaxmnist.train import train_and_evaluate

    summary = train_and_evaluate(
        small_cfg(seeds=2, epochs=6, target_accuracy=0.5), tmp_path / "run", dataset=tiny_dataset
    )
    assert summary["target_reached"] is True and summary["epochs_planned"] == 6
    assert summary["epochs_to_target"] == summary["epochs"] < 6
    assert summary["test_accuracy_mean"] >= 0.5
    assert 0 < summary["time_to_target_seconds"] <= summary["train_seconds"]
    assert summary["time_to_target_with_compile_seconds"] == pytest.approx(
        summary["time_to_target_seconds"] + summary["compile_seconds"]
    )
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == summary["epochs"]


SMALL = ("--epochs", "2", "--hidden", "32")  # a quick model for the CLI tests


@pytest.mark.slow
def test_cli_seeds_end_to_end_with_report_and_eval(tiny_data_dir, train_argv, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_argv(run, *SMALL, "--seeds", "3", "--seed", "4")) == 0
    out = capsys.readouterr().out
    assert "3 models, seeds 4-6" in out and "test accuracy over 3 seeds:" in out and "95% CI" in out

    summary = json.loads((run / "summary.json").read_text())
    assert summary["seeds"] == [4, 5, 6] and len(summary["test_accuracy_per_seed"]) == 3
    assert summary["test_accuracy"] == pytest.approx(np.mean(summary["test_accuracy_per_seed"]))
    assert summary["test_accuracy_mean"] == summary["test_accuracy"]
    assert summary["test_accuracy_std"] == pytest.approx(
        np.std(summary["test_accuracy_per_seed"], ddof=1)
    )
    lo, hi = summary["test_accuracy_ci95"]
    assert lo <= summary["test_accuracy_mean"] <= hi
    assert summary["test_accuracy_min"] == min(summary["test_accuracy_per_seed"])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(len(r["test_accuracy_per_seed"]) == 3 and "test_accuracy_std" in r for r in records)
    with np.load(run / "params.npz") as f:
        assert f["[0]['w']"].shape == (3, 784, 32)
    confusion = json.loads((run / "confusion_matrix.json").read_text())
    assert confusion["seed"] == 4 and np.asarray(confusion["matrix_per_seed"]).shape == (3, 10, 10)
    page = (run / "report.html").read_text()
    assert (
        'id="seeds"' in page
        and "95% CI of the mean" in page
        and (run / "plots" / "seed_accuracy.png").exists()
    )

    assert main(["eval", str(run), "--data-dir", str(tiny_data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(result["test_accuracy_per_seed"], summary["test_accuracy_per_seed"])
    assert main(["eval", str(run), "--data-dir", str(tiny_data_dir)]) == 0
    assert "seeds        3: test accuracy" in capsys.readouterr().out


def test_cli_target_not_reached_exits_3_after_writing(train_argv, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(
        train_argv(run, *SMALL, "--steps", "2", "--target-accuracy", "0.999", "--no-report")
    )
    captured = capsys.readouterr()
    assert code == 3
    assert (
        len(captured.err.strip().splitlines()) == 1
        and "target test accuracy 99.90% not reached" in captured.err
    )
    assert "NOT reached" in captured.out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["target_reached"] is False and summary["epochs_to_target"] is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "0"], "seeds must be a positive number"),
        (["--seeds", "-2"], "seeds must be a positive number"),
        (["--seeds", "two"], "expected int"),
        (["--target-accuracy", "97.3"], "target accuracy is a fraction"),
        (["memory_budget_mb=0"], "memory_budget_mb must be positive"),
    ],
)
def test_bad_seed_arguments_exit_2(args, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not run.exists()


def test_too_many_seeds_for_the_memory_fail_before_training(train_argv, tmp_path, capsys):
    code = main(
        train_argv(tmp_path / "run", *SMALL, "--seeds", "50", "memory_budget_mb=2", "--no-report")
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "not even one model fits" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_one_model_that_cannot_fit_is_refused_before_allocating(tiny_dataset):
    """Every run is estimated, one model too (it once compiled, then died out of memory)."""
    cfg = dataclasses.replace(small_cfg(), memory_budget_mb=1)
    with pytest.raises(ConfigError, match=r"^this model needs about .* memory_budget_mb is 1 MB"):
        train_population(cfg, population.seed_members(cfg), tiny_dataset)


def test_not_even_one_of_many_models_fits():
    est = memory.MemoryEstimate(100 * memory.MB, 10 * memory.MB, 50 * memory.MB)
    with pytest.raises(ConfigError, match=r"^not even one model fits: one needs about 160 MB"):
        memory.plan_chunks(8, est, 150 * memory.MB, "memory_budget_mb")


@pytest.mark.slow
def test_memory_estimate_counts_what_the_model_computes():
    """The estimate comes from the compiled programs, so a CNN's im2col buffers (k² times
    the activation they are cut from) count for more than an MLP's widths."""
    from types import SimpleNamespace

    from jaxmnist import optim

    zeros = np.zeros((), np.uint8)
    data = SimpleNamespace(
        train_images=np.broadcast_to(zeros, (640, 28, 28)),
        train_labels=np.broadcast_to(zeros, (640,)),
        test_images=np.broadcast_to(zeros, (150, 28, 28)),
        test_labels=np.broadcast_to(zeros, (150,)),
    )

    def transient(preset, **model):
        cfg = config_lib.get_preset(preset)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model))
        opt = optim.make_optimizer(cfg.optimizer, 10)
        pop = population.Population(
            cfg, opt, population.seed_members(cfg), (1,), (28, 28), 10, 1,
            parallel.build_layout(1),
        )  # fmt: skip
        return memory.estimate_for(cfg, pop, 2, data, (1,)).transient_per_model

    im2col = 256 * (28 * 28 * 1 * 9 + 14 * 14 * 16 * 9) * 4  # a batch's two patch buffers
    cnn = transient("cnn", conv_impl="im2col")
    assert cnn >= im2col
    assert cnn > 2 * transient("tpu101")


class EstimateWatch(Callback):
    def __init__(self):
        self.events = []

    def on_estimate(self, epoch_seconds, seconds_per_step):
        self.events.append(("estimate", epoch_seconds / seconds_per_step))

    def on_steps(self, end):
        self.events.append(("steps", end.step))


def test_the_epoch_estimate_comes_once_after_the_second_call(tiny_dataset, paced_by_steps):
    """The first call (one step) still warms up, so the estimate waits for the second;
    it is the full epoch's steps at the speed measured so far."""
    cfg = small_cfg(epochs=2, progress_every=7)
    watch = EstimateWatch()
    train_population(cfg, population.seed_members(cfg), tiny_dataset, watch)
    assert watch.events[:3] == [("steps", 1), ("estimate", pytest.approx(20)), ("steps", 7)]
    assert [e for e, _ in watch.events].count("estimate") == 1


class SpeedWatch(Callback):
    def __init__(self):
        self.seconds_per_step, self.epoch_seconds = [], []

    def on_estimate(self, epoch_seconds, seconds_per_step):
        self.seconds_per_step.append(seconds_per_step)

    def on_epoch_end(self, end):
        self.epoch_seconds.append(end.record["epoch_seconds"])


def test_an_epochs_plan_is_not_timed_as_its_first_steps(tiny_dataset, paced_by_steps, monkeypatch):
    """The epoch's plan (its shuffles, for every member) runs on the device before the
    first call's step. When drawing it is slow (256 members of a small model took
    seconds), the first call must not report it as the speed of a step: the estimate
    once announced a 20-step run as taking 47 minutes."""
    # A call of half a second is settled (not 2 s): the plan below is then slower than
    # that for about 1.25 s of spinning, not 5.
    monkeypatch.setattr(pacing, "SLOW_SECONDS", 0.5)
    # Device work that takes longer than a call the pacer takes as settled, sized here.
    spin = jax.jit(lambda m, n: jax.lax.fori_loop(0, n, lambda _, m: jnp.tanh(m @ m), m))
    delayed = jax.jit(lambda i, m, n: i + (spin(m, n)[0, 0] * 0).astype(i.dtype))
    m, probe = jnp.full((256, 256), 0.01, jnp.float32), jnp.zeros((4,), jnp.int32)
    jax.block_until_ready(delayed(probe, m, 1))
    start = time.perf_counter()
    jax.block_until_ready(delayed(probe, m, 100))
    n = jnp.asarray(int(100 * 2.5 * pacing.SLOW_SECONDS / (time.perf_counter() - start)))
    planned = population.Population.plan_epoch

    def slow_plan(self, epoch_index, steps=None, data=None):  # drawn after this returns
        plans = planned(self, epoch_index, steps, data)
        return [p._replace(indices=delayed(p.indices, m, n)) for p in plans]

    monkeypatch.setattr(population.Population, "plan_epoch", slow_plan)
    cfg = small_cfg(epochs=1, progress_every=7)
    watch = SpeedWatch()
    train_population(cfg, population.seed_members(cfg), tiny_dataset, watch)
    assert watch.epoch_seconds[0] > pacing.SLOW_SECONDS  # the plan was slow, and is counted
    assert len(watch.seconds_per_step) == 1
    assert watch.seconds_per_step[0] < pacing.SLOW_SECONDS / 2  # a step of a tiny MLP: ms


def test_an_accuracy_exactly_at_the_target_reaches_it():
    """The target is reached at `mean >= target`, so an epoch whose mean test accuracy
    equals the target exactly stops the run there (live and when a resume replays)."""
    from jaxmnist.training.loop import TargetAccuracy

    points = np.array([0, 0, 1])
    rule = TargetAccuracy(0.75, points)
    assert rule.update(1, np.array([0.5, 1.0, 0.74]), 2.0) is False  # point 0's mean: 0.75
    assert rule.reached[0] == {"epoch": 1, "train_seconds": 2.0} and rule.reached[1] is None
    assert rule.update(2, np.array([0.5, 0.5, 0.75]), 4.0) is True  # point 1 exactly at 0.75
    assert rule.reached[1] == {"epoch": 2, "train_seconds": 4.0}
    records = [{"epoch": 1, "epoch_seconds": 1.5, "test_accuracy": 0.75}]
    assert TargetAccuracy(0.75, np.array([0])).replay(records) is True


def test_a_run_whose_first_epoch_lands_exactly_on_the_target_stops_there(tiny_dataset, tmp_path):
    from jaxmnist.train import train_and_evaluate

    free = train_and_evaluate(small_cfg(epochs=3), tmp_path / "free", dataset=tiny_dataset)
    records = (tmp_path / "free" / "metrics.jsonl").read_text().splitlines()
    first = json.loads(records[0])["test_accuracy"]
    assert free["epochs"] == 3 and 0 < first < 1
    summary = train_and_evaluate(
        small_cfg(epochs=3, target_accuracy=first), tmp_path / "exact", dataset=tiny_dataset
    )
    assert summary["target_reached"] is True
    assert summary["epochs_to_target"] == summary["epochs"] == 1


def test_the_epoch_estimate_waits_for_a_steady_call():
    """Fake timings shaped like a real CNN run's warm-up (the first step slowest, the
    second still slow, then steady): the second call (one step) would announce an epoch
    far longer than it takes, so the estimate waits for a call of several steps (or the
    third call); a call slow enough to keep the user waiting is enough."""
    from jaxmnist.training import pacing

    pacer = pacing.Pacer(target_seconds=0.5)
    pacer.record(1, 0.270)
    assert not pacer.settled()
    assert pacer.next_stop(1, 234, 1) == 2  # the first step's speed fits one step in a call
    pacer.record(1, 0.069)
    assert not pacer.settled()
    pacer.record(7, 0.220)
    assert pacer.settled()
    assert pacer.epoch_seconds(234) == pytest.approx(234 * 0.220 / 7)

    slow = pacing.Pacer(target_seconds=0.5)
    slow.record(1, 0.9)
    slow.record(1, 0.3)
    assert not slow.settled()
    slow.record(1, 0.3)
    assert slow.settled()  # steps too slow for several in a call: the third call

    first = pacing.Pacer(target_seconds=0.5)
    first.record(1, 2.5)
    assert first.settled()
