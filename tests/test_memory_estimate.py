"""The memory estimate reads the compiled programs, plans chunks from them, and the run
uses the programs it compiled (nothing compiles twice)."""

import dataclasses
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.errors import ConfigError
from jaxmnist.models import onednn
from jaxmnist.training import memory, parallel, population
from jaxmnist.training.loop import train_population

MB = memory.MB


def make_pop(cfg, n_train: int, seeds: int):
    cfg = config_lib.apply_overrides(cfg, {"train.seeds": seeds})
    plan = config_lib.plan_steps(cfg.train, n_train)
    pop = population.Population(
        cfg, optim.make_optimizer(cfg.optimizer, plan.total_steps),
        population.seed_members(cfg), (seeds,), (28, 28), 10, len(plan.epoch_steps),
        parallel.build_layout(1),
    )  # fmt: skip
    return cfg, pop, plan.steps_per_epoch


def shapes_only(n_train: int, n_test: int):
    """A dataset's arrays as the estimate reads them (shapes, dtypes), nothing allocated."""
    zeros = np.zeros((), np.uint8)
    return SimpleNamespace(
        train_images=np.broadcast_to(zeros, (n_train, 28, 28)),
        train_labels=np.broadcast_to(zeros, (n_train,)),
        test_images=np.broadcast_to(zeros, (n_test, 28, 28)),
        test_labels=np.broadcast_to(zeros, (n_test,)),
    )


def tiny_cfg(**train):
    base = config_lib.get_preset("tpu101")
    t = {"batch_size": 32, "epochs": 1, **train}
    return dataclasses.replace(
        base, compile_cache=False, train=dataclasses.replace(base.train, **t)
    )


def stats(temp=0, out=0, alias=0, arg=0, code=0):
    return SimpleNamespace(
        temp_size_in_bytes=temp, output_size_in_bytes=out, alias_size_in_bytes=alias,
        argument_size_in_bytes=arg, generated_code_size_in_bytes=code,
    )  # fmt: skip


class Program:
    def __init__(self, s, hlo=""):
        self.s, self.hlo = s, hlo

    def memory_analysis(self):
        return self.s

    def as_text(self):
        return self.hlo

    @property
    def args_info(self):  # one argument of all its bytes: the plan's raw keys
        return ((SimpleNamespace(shape=(self.s.argument_size_in_bytes,), dtype=np.uint8),), {})


# Optimised HLO as XLA:CPU prints it: a YNNPACK fusion whose inner arrays (a 4 KB convert,
# a 2 KB multiply) XLA does not assign, one more with a pred array (a byte each), and an
# ordinary loop fusion, whose larger inner array XLA's own buffers hold.
HLO = """\
%fused_computation (param_0: bf16[32,32], param_1: f32[]) -> f32[32] {
  %param_0 = bf16[32,32]{1,0} parameter(0)
  %convert.1 = f32[32,32]{1,0} convert(%param_0)
  %mul.1 = bf16[32,32]{1,0} multiply(%param_0, %param_0), metadata={op_name="mul"}
  %param_1 = f32[] parameter(1)
  %broadcast.1 = f32[64,64]{1,0} broadcast(%param_1), dimensions={}
  ROOT %reduce.1 = f32[32]{0} reduce(%convert.1, %param_1), dimensions={0}, to_apply=%add
}

%fused_computation.1 (param_0.1: f32[300]) -> f32[] {
  %param_0.1 = f32[300]{0} parameter(0)
  %compare.1 = pred[300]{0} compare(%param_0.1, %param_0.1), direction=EQ
  ROOT %reduce.2 = f32[] reduce(%compare.1), dimensions={0}, to_apply=%add
}

%fused_computation.2 (param_0.2: f32[100,100]) -> f32[100] {
  %param_0.2 = f32[100,100]{1,0} parameter(0)
  %exp.1 = f32[100,100]{1,0} exponential(%param_0.2)
  ROOT %reduce.3 = f32[100]{0} reduce(%exp.1), dimensions={1}, to_apply=%add
}

ENTRY %main (x: bf16[32,32], y: f32[300]) -> f32[32] {
  %ynn_fusion = f32[32]{0} fusion(%x, %c), kind=kCustom, calls=%fused_computation, \
backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
  %ynn_fusion.1 = f32[] fusion(%y), kind=kCustom, calls=%fused_computation.1, \
backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %loop_fusion = f32[100] fusion(%z), kind=kLoop, calls=%fused_computation.2
  ROOT %r = f32[32]{0} add(%ynn_fusion, %ynn_fusion)
}
"""


def test_a_ynnpack_fusion_counts_its_largest_inner_array():
    assert memory.ynn_fusion_bytes(HLO) == 32 * 32 * 4  # the convert; not the broadcast
    assert memory.ynn_fusion_bytes(HLO.replace("%convert.1 = f32", "%convert.1 = bf16")) == (
        32 * 32 * 2
    )  # its element's width
    swapped = HLO.replace("calls=%fused_computation,", "calls=%fused_computation.2,")
    assert memory.ynn_fusion_bytes(swapped) == 100 * 100 * 4  # now the YNNPACK fusion's
    assert memory.ynn_fusion_bytes(HLO.replace("__ynn_fusion", "other")) == 0
    pred = HLO.replace("pred[300]", "pred[9000]")
    assert memory.ynn_fusion_bytes(pred) == 9000  # a byte each


def test_a_real_ynnpack_fusion_is_read():
    """What XLA:CPU compiles is read as the text above is: a reduction of a product whose
    product array XLA leaves to YNNPACK."""
    x = jax.ShapeDtypeStruct((64, 28, 28, 16), np.float32)
    compiled = jax.jit(lambda x: (x * x).sum(axis=(0, 1, 2))).lower(x).compile()
    hlo = compiled.as_text()
    if "__ynn_fusion" not in hlo:
        pytest.skip("this XLA:CPU build makes no YNNPACK fusion of a reduction")
    assert memory.ynn_fusion_bytes(hlo) == 64 * 28 * 28 * 16 * 4


def test_chunk_memory_reads_every_program():
    programs = {
        "plan": Program(stats(temp=5, out=40, arg=8, code=1)),  # its output is the plan
        "metrics": Program(stats(temp=1, out=3, code=1)),
        "steps": Program(stats(temp=100, out=30, alias=30, arg=500, code=1)),  # donated
        "rate": Program(stats(out=4, code=1)),
        "eval": Program(stats(temp=120, out=7, arg=50, code=1)),
    }
    m = memory.chunk_memory({k: v for k, v in programs.items()}, models=2, num_epochs=3)
    assert m == memory.ChunkMemory(2, 30 + 40 + 8 * 4, 127, 5)
    programs["steps"].s.temp_size_in_bytes = 200  # the compiled program's temps decide
    assert memory.chunk_memory(programs, 2, 3).transient == 200
    programs["steps"].s.alias_size_in_bytes = 0  # outputs not written over donated inputs
    assert memory.chunk_memory(programs, 2, 3).transient == 230
    programs["eval"].hlo = HLO  # its YNNPACK fusions' arrays, beside its temporaries
    assert memory.chunk_memory(programs, 2, 3).transient == 120 + 7 + 32 * 32 * 4


def test_estimate_from_one_or_two_chunk_sizes():
    one = memory.ChunkMemory(models=1, resident=10, transient=300, code=4)
    eight = memory.ChunkMemory(models=8, resident=80, transient=1000, code=6)
    alone = memory.estimate_memory(1000, eight)
    assert alone.total(8, 8) == 1000 + 6 + 80 + 1000  # exact at the size compiled
    both = memory.estimate_memory(1000, eight, one)
    assert both.total(8, 8) == alone.total(8, 8) and both.total(8, 1) == 1006 + 80 + 300
    assert both.total(8, 4) == 1006 + 80 + 300 + 3 * 100  # affine in between
    doubled = memory.estimate_memory(1000, eight, one, factor=2.0)
    assert doubled.total(8, 4) == 2 * both.total(8, 4)
    runtime = memory.estimate_memory(1000, eight, one, factor=2.0, runtime_bytes=50)
    assert runtime.total(8, 4) == doubled.total(8, 4) + 50  # once, however many models
    assert runtime.total(16, 8) == doubled.total(16, 8) + 50


def test_the_estimate_is_the_compilers(monkeypatch):
    """On a real compile: the estimate covers what XLA says the largest program needs,
    and moves with it (memory_analysis is what it reads)."""
    cfg, pop, steps = make_pop(tiny_cfg(), 640, seeds=2)
    data = shapes_only(640, 150)
    _, about = memory.chunks_for(cfg, pop, steps, data)
    programs = pop.programs[2]
    factor = memory.CPU_RUNTIME_FACTOR  # the tests run on CPU
    for name, p in programs.items():
        s = p.memory_analysis()
        peak = s.argument_size_in_bytes + s.temp_size_in_bytes
        peak += s.output_size_in_bytes - s.alias_size_in_bytes
        assert about["memory_estimate_mb"] * MB >= factor * peak, name
    everything = sum(
        s.argument_size_in_bytes + s.temp_size_in_bytes + s.output_size_in_bytes
        for s in (p.memory_analysis() for p in programs.values())
    )  # every program's every buffer at once: more than any moment needs
    fusions = sum(memory.ynn_fusion_bytes(p.as_text()) for p in programs.values())
    assert (
        about["memory_estimate_mb"] * MB
        <= factor * (everything + fusions) + memory.CPU_RUNTIME_BYTES
    )
    analysis = type(programs["steps"]).memory_analysis

    def more_temps(self):
        s = analysis(self)
        return SimpleNamespace(**{
            k: getattr(s, k) for k in dir(s) if k.endswith("_in_bytes")
        } | {"temp_size_in_bytes": s.temp_size_in_bytes + 100 * MB})  # fmt: skip

    monkeypatch.setattr(type(programs["steps"]), "memory_analysis", more_temps)
    _, bigger = memory.chunks_for(cfg, pop, steps, data)
    grown = bigger["memory_estimate_mb"] - about["memory_estimate_mb"]
    assert grown == pytest.approx(factor * 100, abs=1)


def test_native_kernels_add_what_they_hold_outside_the_programs(monkeypatch):
    """Programs that call jaxmnist's native kernels (oneDNN's) are estimated with what
    those hold beside them, once per process; other programs are not."""
    cfg, pop, steps = make_pop(tiny_cfg(), 640, seeds=2)
    data = shapes_only(640, 150)
    plain = memory.estimate_for(cfg, pop, steps, data, (2,))
    assert not any(  # an MLP: XLA's own code
        memory.calls_native_kernels(p.as_text()) for p in pop.programs[2].values()
    )
    monkeypatch.setattr(memory, "calls_native_kernels", lambda hlo_text: True)
    native = memory.estimate_for(cfg, pop, steps, data, (2,))
    assert native.total(2, 2) - plain.total(2, 2) == memory.NATIVE_KERNEL_BYTES
    assert native.total(8, 1) - plain.total(8, 1) == memory.NATIVE_KERNEL_BYTES


def test_a_call_to_a_native_kernel_is_seen_in_the_compiled_program():
    if not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    x, w = jax.numpy.ones((1, 4, 4, 1)), jax.numpy.ones((3, 3, 1, 2))
    conv = jax.jit(onednn.conv_onednn).lower(x, w).compile()
    xla = jax.jit(lambda x, w: x.sum() * w.sum()).lower(x, w).compile()
    assert memory.calls_native_kernels(conv.as_text())
    assert not memory.calls_native_kernels(xla.as_text())


def test_eight_batch_norm_speedrun_seeds_plan_as_one_chunk():
    """On MNIST's shapes, within 16 GB: one chunk (the traced sum planned two)."""
    speedrun = config_lib.apply_overrides(
        config_lib.get_preset("speedrun"), {"model.batch_norm": "true", "memory_budget_mb": 16000}
    )
    cfg, pop, steps = make_pop(speedrun, 60_000, seeds=8)
    chunks, about = memory.chunks_for(cfg, pop, steps, shapes_only(60_000, 10_000))
    assert chunks == (8,) and about["memory_budget_mb"] == 16000
    assert about["memory_estimate_mb"] < 16000
    assert set(pop.programs) == {8}  # fits whole: nothing else compiled


def test_a_population_that_does_not_fit_is_split_and_fails_in_one_line():
    cfg, pop, steps = make_pop(tiny_cfg(), 640, seeds=4)
    data = shapes_only(640, 150)
    _, whole = memory.chunks_for(cfg, pop, steps, data)
    # A budget for about two at a time: split into equal chunks, after compiling one model.
    budget = int(whole["memory_estimate_mb"] * 0.8)
    tight = dataclasses.replace(cfg, memory_budget_mb=budget)
    chunks, about = memory.chunks_for(tight, pop, steps, data)
    assert 1 < len(chunks) and sum(chunks) == 4 and max(chunks) - min(chunks) <= 1
    assert about["memory_estimate_mb"] <= budget
    assert set(pop.programs) == {4, 1}
    with pytest.raises(ConfigError, match=r"^not even one model fits: one needs about .* MB") as e:
        memory.chunks_for(dataclasses.replace(cfg, memory_budget_mb=1), pop, steps, data)
    assert "\n" not in str(e.value)


def test_an_accelerators_budget_leaves_out_what_its_runtime_reserves(monkeypatch):
    """A TPU keeps programs' working memory as `bytes_reserved`, outside `bytes_in_use`
    (its `memory_stats()` after a program with 256 MB of temporaries ran: 256 MB reserved,
    the peak in use only its arrays'): the budget is what neither holds, and the measured
    peak counts both."""
    mb = memory.MB
    stats = {
        "bytes_limit": 16_000 * mb,
        "bytes_in_use": 1_000 * mb,
        "bytes_reserved": 3_000 * mb,
        "peak_bytes_in_use": 1_200 * mb,
        "peak_bytes_reserved": 3_000 * mb,
    }
    device = SimpleNamespace(device_kind="TPU v5 lite", memory_stats=lambda: stats)
    monkeypatch.setattr(memory.jax, "local_devices", lambda: [device])
    cfg = config_lib.get_preset("cnn")
    budget, source = memory.device_budget(cfg)
    assert budget == int(12_000 * mb * memory.DEVICE_FRACTION)
    assert source == "85% of the free memory of TPU v5 lite"
    assert memory.device_peak_bytes(stats) == 4_200 * mb
    # A backend that reports no reservation (a GPU's allocator holds everything in use).
    gpu = {k: v for k, v in stats.items() if "reserved" not in k}
    assert memory.device_bytes_held(gpu) == 1_000 * mb
    assert memory.device_peak_bytes(gpu) == 1_200 * mb


@pytest.mark.accelerator
def test_abstract_data_matches_what_the_run_places(tiny_dataset):
    from jaxmnist.training import evaluate

    cfg = tiny_cfg(eval_batch_size=64)
    layout = parallel.build_layout(1)
    train, evals = memory.abstract_data(cfg, tiny_dataset, layout)
    assert train.images.shape == tiny_dataset.train_images.shape
    sets = {
        "test": (tiny_dataset.test_images, tiny_dataset.test_labels),
        "train": (tiny_dataset.train_images, tiny_dataset.train_labels),
    }
    shape = evaluate.block_shape([len(y) for _, y in sets.values()], 64)
    for name, (x, y) in sets.items():
        placed = evaluate.eval_blocks(x, y, *shape)
        assert len(evals[name]) == len(placed), name
        for a, b in zip(jax.tree.leaves(evals[name]), jax.tree.leaves(placed), strict=True):
            assert (a.shape, a.dtype) == (b.shape, b.dtype), name


@pytest.mark.accelerator
def test_the_run_uses_the_programs_the_estimate_compiled(tiny_dataset):
    cfg = tiny_cfg(seeds=2)
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    pop = result.population
    assert set(pop.programs) == {2}  # compiled once, for the estimate
    assert pop.steps_fns[2] is pop.programs[2]["steps"]
    # one evaluation program, every set's
    assert pop.eval_fns[2, "test"] is pop.eval_fns[2, "train"] is pop.programs[2]["eval"]
    assert result.compile_seconds >= pop.compile_seconds > 0
    assert isinstance(pop.programs[2]["steps"], jax.stages.Compiled)
