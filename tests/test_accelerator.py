"""What the hardware a run trains on must not change: the data order, the training
trajectory against recorded values, determinism, epoch plans drawn on the host against
the device's own, programs compiled at once against one by one.

These run in the accelerator lane (`make test-accelerator`: `-m accelerator`, one
process), on a TPU or GPU as on the CPU in CI. The recorded values below were taken on
a CPU before plans could be drawn on the host, so the data order is pinned exactly and
the training figures within a stated tolerance (an accelerator's arithmetic and the
CPU's differ in their last bits; `conftest.py` sets the highest matmul precision on an
accelerator, as the CPU computes).
"""

from __future__ import annotations

import dataclasses
import threading

import jax
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.training import parallel, population
from jaxmnist.training.loop import train_population

pytestmark = pytest.mark.accelerator

# tpu101 on the tests' learnable set (640 examples), batch 32, 2 epochs, seed 0,
# recorded on a CPU at the commit before host-drawn plans: epoch 2's first two batches
# (first 8 indices each), each epoch's mean training loss, and each parameter's sum and
# fourth element.
RECORDED_PLAN = [[143, 390, 38, 420, 616, 329, 258, 205], [139, 460, 276, 27, 201, 34, 127, 73]]
RECORDED_LOSSES = [0.9451009035110474, 0.03893378749489784]
RECORDED_PARAMS = {
    "[0]['b']": [0.4885023114911746, 0.00500120734795928],
    "[0]['w']": [280.8657389974482, 0.07190369814634323],
    "[1]['b']": [-0.004740755603052094, 0.002921332838013768],
    "[1]['w']": [-9.551251631448395, 0.09221336990594864],
}
# Relative. On a CPU, float32 sums in another order (another CPU's vector width) stay
# well within the first; an accelerator's exp, log and rsqrt differ in more bits, and
# forty Adam steps carry the difference on, hence the second. A different data order
# or step moves these figures by far more than either.
TOLERANCE = 1e-4 if jax.default_backend() == "cpu" else 1e-3


def tpu101(**train) -> config_lib.Config:
    cfg = config_lib.get_preset("tpu101")
    fields = {"batch_size": 32, "epochs": 2, "steps": None, "eval_batch_size": 150, **train}
    return dataclasses.replace(
        cfg, compile_cache=False, train=dataclasses.replace(cfg.train, **fields)
    )


def host_plans(monkeypatch, on: bool) -> None:
    """Plans drawn on the host's CPU (`on`), as on a TPU, or on the mesh, on any backend."""
    device = jax.local_devices(backend="cpu")[0] if on else None
    monkeypatch.setattr(population, "plan_device", lambda backend=None: device)


def params_of(result) -> dict:
    leaves = jax.tree_util.tree_leaves_with_path(result.population.params(result.states))
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


def test_the_data_order_and_the_trajectory_are_the_recorded_ones(tiny_dataset):
    cfg = tpu101()
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    plan = np.asarray(result.population.plan_epoch(1)[0].indices)
    np.testing.assert_array_equal(plan[0, :2, :8], RECORDED_PLAN)
    losses = [r["train_loss"] for r in result.records]
    np.testing.assert_allclose(losses, RECORDED_LOSSES, rtol=TOLERANCE)
    params = params_of(result)
    assert params.keys() == RECORDED_PARAMS.keys()
    for name, (total, fourth) in RECORDED_PARAMS.items():
        got = params[name].astype(np.float64)
        np.testing.assert_allclose(got.sum(), total, rtol=TOLERANCE, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got.reshape(-1)[3], fourth, rtol=TOLERANCE, err_msg=name)


def test_the_same_seed_twice_gives_the_same_parameters_bit_for_bit(tiny_dataset):
    cfg = tpu101(epochs=1)
    first, second = (
        params_of(train_population(cfg, population.seed_members(cfg), tiny_dataset))
        for _ in range(2)
    )
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


@pytest.mark.parametrize("seeds", [1, 3])
@pytest.mark.slow
def test_plans_drawn_on_the_host_train_exactly_as_plans_drawn_on_the_mesh(
    tiny_dataset, monkeypatch, seeds
):
    cfg = tpu101(seeds=seeds, epochs=3)
    runs = {}
    for on in (False, True):
        host_plans(monkeypatch, on)
        result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
        assert (result.population.plan_device is not None) == on
        runs[on] = result
    for epoch in range(cfg.train.epochs):
        np.testing.assert_array_equal(
            *(np.asarray(r.population.plan_epoch(epoch)[0].indices) for r in runs.values())
        )
    mesh, host = (params_of(r) for r in runs.values())
    losses = [[r["train_loss"] for r in run.records] for run in runs.values()]
    if jax.default_backend() == "cpu":  # one machine draws and trains: bit for bit
        for name in mesh:
            np.testing.assert_array_equal(mesh[name], host[name], err_msg=name)
        assert losses[0] == losses[1]
        return
    # Where plans are drawn on the host, the initial states are made there too: the same
    # random bits (threefry), turned into floats by the host's arithmetic, not the chip's.
    # Adam's step is about the learning rate wherever a gradient is near zero, whatever
    # its size, so a last-bit difference there moves single weights by up to twice that:
    # each parameter is compared by its sum and its norm, as against the recorded values.
    for name in mesh:
        for measure in (np.sum, np.linalg.norm):
            np.testing.assert_allclose(
                measure(mesh[name].astype(np.float64)),
                measure(host[name].astype(np.float64)),
                rtol=TOLERANCE,
                atol=1e-5,
                err_msg=f"{name} {measure.__name__}",
            )
    np.testing.assert_allclose(*losses, rtol=TOLERANCE)


def test_the_hosts_plan_is_the_devices_own_permutation(tiny_dataset, monkeypatch):
    """On an accelerator this compares the host's radix sort with the device's sort."""
    cfg = tpu101(epochs=2, seeds=2)
    host_plans(monkeypatch, True)
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    pop = result.population
    n, steps = len(tiny_dataset.train_labels), result.plan.steps_per_epoch
    for epoch in range(2):
        keys = pop.epoch_keys[:, epoch]
        # Drawn as the library draws it, on the run's own device.
        expected = [
            np.asarray(jax.random.permutation(jax.random.wrap_key_data(k), n))[: steps * 32]
            for k in keys
        ]
        got = np.asarray(pop.plan_epoch(epoch)[0].indices).reshape(len(keys), -1)
        np.testing.assert_array_equal(got, np.stack(expected))


def test_the_next_epochs_plan_is_drawn_ahead_and_used(tiny_dataset, monkeypatch):
    cfg = tpu101(epochs=3)
    host_plans(monkeypatch, True)
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    pop = result.population
    drawn = []
    real = pop._draw_plans
    monkeypatch.setattr(pop, "_draw_plans", lambda e: drawn.append(e) or real(e))
    pop._next_plans = None
    first = np.asarray(pop.plan_epoch(0)[0].indices)
    ahead = pop._next_plans[1].result()  # drawn and copied to the mesh on a thread
    assert drawn == [0, 1]  # this epoch's, then the next one's, ahead
    assert ahead[0].indices.sharding == pop.layout.by_member  # already on the mesh
    second = pop.plan_epoch(1)
    assert second is ahead  # epoch 1's was taken as drawn ahead
    pop._next_plans[1].result()
    assert drawn == [0, 1, 2]
    second = np.asarray(second[0].indices)
    assert not (first == second).all()
    pop.plan_epoch(0)  # out of turn (a resumed run): drawn afresh, the same plan
    np.testing.assert_array_equal(np.asarray(pop.plan_epoch(0)[0].indices), first)
    pop.plan_epoch(2)
    assert pop._next_plans is None  # the last epoch draws none ahead


@pytest.mark.parametrize("on", [True, False])
def test_initial_states_are_made_where_plans_are_drawn(tiny_dataset, monkeypatch, on):
    """On the host's CPU where plans are drawn there (as on a TPU), then placed on the
    mesh; on the mesh otherwise. Either way the same states (the host and mesh runs'
    parameters are compared bit for bit above)."""
    cfg = tpu101(epochs=1, seeds=2)
    host_plans(monkeypatch, on)
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    pop = result.population
    made_on = pop.programs[2]["init"].input_shardings[0][0]
    assert isinstance(made_on, jax.sharding.SingleDeviceSharding) == on
    assert made_on.device_set == ({pop.plan_device} if on else set(pop.layout.mesh.devices.flat))
    state = pop.init_states()[0]
    assert all(x.sharding == pop.layout.by_member for x in jax.tree.leaves(state))


def test_plans_go_to_the_host_only_on_a_tpu():
    assert population.plan_device("cpu") is None
    assert population.plan_device("gpu") is None
    host = population.plan_device("tpu")
    assert host is not None and host.platform == "cpu"


def test_programs_compiled_at_once_are_those_compiled_one_by_one():
    def lowered():
        return {
            f"p{i}": jax.jit(lambda x, i=i: (x * i).sum()).lower(np.ones((4, 4), np.float32))
            for i in range(5)
        }

    serial, serial_seconds = population.compile_all(lowered(), workers=1)
    together, seconds = population.compile_all(lowered(), workers=4)
    assert serial.keys() == together.keys() == seconds.keys() == serial_seconds.keys()
    x = np.ones((4, 4), np.float32)
    for name in serial:
        assert float(serial[name](x)) == float(together[name](x)) == 16.0 * int(name[1:])
    assert all(s > 0 for s in seconds.values())


def test_a_failed_compile_among_many_is_raised(monkeypatch):
    class Broken:
        def compile(self):
            raise RuntimeError("no such program")

    good = jax.jit(lambda x: x + 1).lower(np.float32(1))
    with pytest.raises(RuntimeError, match="no such program"):
        population.compile_all({"good": good, "bad": Broken()}, workers=2)


def test_the_keys_drawn_on_the_host_are_the_devices_own():
    seeds = [0, 7, 2**31]
    on_device = population.population_keys(seeds, 3)
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        on_host = population.population_keys(seeds, 3)
    for a, b in zip(on_device, on_host, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_population_draws_its_keys_where_it_draws_its_plans(monkeypatch):
    host = jax.local_devices(backend="cpu")[0]
    drawn_on = []
    real = population.population_keys

    def keys(*args):
        drawn_on.append(jax.config.jax_default_device)
        return real(*args)

    monkeypatch.setattr(population, "population_keys", keys)
    cfg = tpu101()
    for device in (None, host):
        monkeypatch.setattr(population, "plan_device", lambda platform, d=device: d)
        pop = population.Population(
            cfg, optim.make_optimizer(cfg.optimizer, 40), population.seed_members(cfg), (1,),
            (28, 28), 10, 2, parallel.build_layout(1),
        )  # fmt: skip
        assert pop.plan_device is device
    assert drawn_on == [None, host]


def test_each_program_compiles_as_soon_as_it_is_lowered():
    """The next program is lowered while the first compiles: the first compile is under
    way before the second program is handed over, and ends only after it was."""
    started, handed_over = threading.Event(), threading.Event()

    class Slow:
        def compile(self):
            started.set()
            return "first" if handed_over.wait(5) else "compiled alone"

    class Quick:
        def compile(self):
            return "second"

    with population.Compiles(workers=2) as compiles:
        compiles.add("first", Slow())
        assert started.wait(5), "the first compile had not started when the next came"
        compiles.add("second", Quick())
        handed_over.set()
        programs, seconds = compiles.results()
    assert programs == {"first": "first", "second": "second"}
    assert seconds.keys() == programs.keys()


def test_the_device_opens_on_a_thread_in_a_process_that_joins_no_other(monkeypatch):
    opened = []

    def devices():
        opened.append(threading.current_thread().name)
        raise RuntimeError("TPU in use")  # said again where the run asks for devices

    hooked = []
    monkeypatch.setattr(jax, "devices", devices)
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    parallel.open_devices_ahead(None)
    for thread in threading.enumerate():
        if thread.name == "jaxmnist-open-devices":
            thread.join(10)
    assert opened == ["jaxmnist-open-devices"] and not hooked
    parallel.open_devices_ahead("127.0.0.1:1234")  # before jax.distributed: nothing
    parallel.open_devices_ahead(None, auto=True)
    assert opened == ["jaxmnist-open-devices"]


def test_a_run_says_how_long_each_program_compiled(tiny_dataset):
    cfg = tpu101(epochs=1)
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    programs = result.info["compile_programs"]
    assert {"steps", "init", "plan", "metrics", "rate", "eval"} <= set(programs)
    assert all(seconds > 0 for seconds in programs.values())
    # Compiled one by one on a CPU, at once elsewhere: never longer than the wall clock.
    assert max(programs.values()) <= result.compile_seconds


def test_the_run_trains_on_every_local_device_it_is_given(tiny_dataset):
    from jaxmnist.training import parallel

    layout = parallel.build_layout(jax.local_device_count())
    cfg = tpu101(epochs=1, batch_size=32 * jax.local_device_count())
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset, layout=layout)
    assert result.info["devices"] == [str(d) for d in jax.local_devices()]
    assert np.isfinite(result.test.loss).all() and result.test.accuracy.mean() > 0.2


def test_the_saved_predictions_program_compiles_ahead_where_programs_compile_at_once(
    tiny_dataset, tmp_path, monkeypatch
):
    from jaxmnist.train import train_and_evaluate
    from jaxmnist.training import evaluate

    cfg = tpu101(epochs=1)
    programs = []
    real = evaluate.predict_probabilities

    def spy(*args):
        programs.append(args[4])
        return real(*args)

    monkeypatch.setattr(evaluate, "predict_probabilities", spy)
    saved = {}
    for workers in (1, 4):  # a CPU's one by one, then an accelerator's four at once
        monkeypatch.setattr(population, "compile_workers", lambda platform, w=workers: w)
        train_and_evaluate(cfg, tmp_path / f"w{workers}", dataset=tiny_dataset)
        saved[workers] = np.load(tmp_path / f"w{workers}" / "test_predictions.npz")["probs"]
    assert programs[0] is None and isinstance(programs[1], jax.stages.Compiled)
    np.testing.assert_array_equal(saved[1], saved[4])


def test_orbax_loads_on_the_writers_thread_as_the_checkpointer_is_made(tmp_path):
    from jaxmnist.runs.checkpoint import Checkpointer, CheckpointOptions

    saver = Checkpointer(tmp_path, CheckpointOptions())
    try:
        assert saver.pending is not None
        assert saver.pending.result().__name__ == "orbax.checkpoint"
    finally:
        saver.close()
    assert not (tmp_path / "checkpoints").exists()  # nothing written before a save
