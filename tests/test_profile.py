"""`jaxmnist profile` and `--profile-steps`: the trace JAX's reader opens, a table whose
shares add up to the measured time, the classification of operations, the CLI."""

import dataclasses
import gzip
import json
import re
import shlex
from types import SimpleNamespace as NS

import jax
import pytest

from jaxmnist import cli
from jaxmnist import config as config_lib
from jaxmnist.profiling import breakdown as breakdown_lib
from jaxmnist.profiling import flops as flops_lib
from jaxmnist.profiling.classify import OpEvent, read_hlo
from jaxmnist.profiling.recipe import profile_config
from jaxmnist.profiling.trace import call_steps, read_ops

# A cuBLAS GEMM's backend config as a GPU's optimized HLO prints it (abridged).
GEMM_CONFIG = (
    'backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":'
    '{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],'
    '"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"DEFAULT"}}'
)
# A module as `Compiled.as_text()` prints one: a stack-frame table (XLA prints each
# frame's parent one above its id), fusions and what they call, oneDNN's custom calls
# (each dot's $DOT: its dimension numbers; $ONEDNN: the targets' common prefix).
HLO = (
    """HloModule jit_step, is_scheduled=true

FileNames
1 "/x/jaxmnist/training/step.py"
2 "/x/jaxmnist/models/conv.py"
3 "/x/site-packages/optax/_src/transform.py"
4 "/x/site-packages/optax/losses/_classification.py"
5 "/x/jaxmnist/models/layers.py"

FunctionNames
1 "body"
2 "_im2col_fwd"
3 "update_fn"
4 "softmax_cross_entropy"
5 "wide_dot"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=20 end_line=20 column=1 end_column=2}
3 {file_name_id=3 function_name_id=3 line=30 end_line=30 column=1 end_column=2}
4 {file_name_id=4 function_name_id=4 line=40 end_line=40 column=1 end_column=2}
5 {file_name_id=5 function_name_id=5 line=50 end_line=50 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=1}
4 {file_location_id=4 parent_frame_id=2}
5 {file_location_id=5 parent_frame_id=3}

%fused_computation (param_0: f32[4], param_1: f32[4]) -> f32[4] {
  %param_0 = f32[4]{0} parameter(0)
  %param_1 = f32[4]{0} parameter(1)
  %multiply.1 = f32[4]{0} multiply(%param_0, %param_1), metadata={op_name="mul" stack_frame_id=1}
  ROOT %add.1 = f32[4]{0} add(%multiply.1, %param_1), metadata={op_name="add" stack_frame_id=1}
}

%fused_computation.1 (param_0.1: f32[4,4], param_1.1: f32[4,4]) -> f32[4,4] {
  %param_0.1 = f32[4,4]{1,0} parameter(0)
  %param_1.1 = f32[4,4]{1,0} parameter(1)
  ROOT %dot.9 = f32[4,4]{1,0} dot(%param_0.1, %param_1.1), $DOT
}

%fused_computation.2 (param_0.2: f32[4]) -> f32[4] {
  %param_0.2 = f32[4]{0} parameter(0)
  ROOT %sqrt.1 = f32[4]{0} sqrt(%param_0.2), metadata={op_name="sqrt" stack_frame_id=3}
}

%fused_computation.3 (param_0.3: f32[4]) -> f32[4] {
  %param_0.3 = f32[4]{0} parameter(0)
  ROOT %log.1 = f32[4]{0} log(%param_0.3), metadata={op_name="log" stack_frame_id=4}
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %g = f32[4]{0} get-tuple-element(%p), index=1
  ROOT %t = (s32[], f32[4]{0}) tuple(%g, %g)
}

ENTRY %main (a: f32[4,4], b: f32[4,4], x: f32[1,8,8,1], w: f32[3,3,1,2], v: f32[4]) -> f32[4] {
  %a = f32[4,4]{1,0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %x = f32[1,8,8,1]{3,2,1,0} parameter(2)
  %w = f32[3,3,1,2]{3,2,1,0} parameter(3)
  %v = f32[4]{0} parameter(4)
  %dot.1 = f32[4,4]{1,0} dot(%a, %b), $DOT, metadata={op_name="d" stack_frame_id=1}
  %dot.2 = f32[4,4]{1,0} dot(%a, %b), $DOT, metadata={op_name="d" stack_frame_id=2}
  %dot.3 = f32[4,4]{1,0} dot(%a, %b), $DOT, metadata={op_name="d" stack_frame_id=5}
  %convolution.1 = f32[1,8,8,2]{3,2,1,0} convolution(%x, %w), dim_labels=b01f_01io->b01f
  %convolution.2 = f32[4,4]{1,0} convolution(%a, %b), dim_labels=bf_io->bf
  %ffi_call.1 = f32[1,8,8,2] custom-call(%x, %w), custom_call_target="$ONEDNN_forward"
  %y = f32[1,8,8,2]{3,2,1,0} negate(%convolution.1)
  %ffi_call.2 = f32[1,8,8,1] custom-call(%y, %w), custom_call_target="$ONEDNN_backward_data"
  %ffi_call.3 = f32[3,3,1,2] custom-call(%x, %y), custom_call_target="$ONEDNN_backward_weights"
  %ffi_call.4 = (f32[1,2,2,2], u8[1,2,2,2]) custom-call(%x), custom_call_target="$POOL_forward"
  %gemm.1 = f32[4,4]{1,0} custom-call(%a, %b), custom_call_target="__cublas$gemm"
  %gemm.2 = (f32[4,4]{1,0}, s8[8]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", $GEMM
  %ynn_fusion.1 = f32[4,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_computation.1
  %multiply_add_fusion = f32[4] fusion(%v, %v), calls=%fused_computation, metadata={op_name="a"}
  %sqrt_fusion = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused_computation.2
  %log_fusion = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused_computation.3
  %copy.1 = f32[4]{0} copy(%v)
  %sort.1 = f32[4]{0} sort(%v), dimensions={0}, to_apply=%body
  %while.1 = (s32[], f32[4]{0}) while(%t0), condition=%body, body=%body
  ROOT %add.2 = f32[4]{0} add(%v, %v)
}
""".replace("$DOT", "lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    .replace("$ONEDNN", "jaxmnist_onednn_conv")
    .replace("$POOL", "jaxmnist_onednn_pool")
    .replace("$GEMM", GEMM_CONFIG)
)

KNOWN = {
    "dot.1": "matmul",
    "ynn_fusion.1": "matmul",
    "dot.2": "conv_im2col",
    "dot.3": "conv_im2col",  # a shared matmul helper, called by conv.py (frame 5's parent)
    "convolution.1": "conv_xla",
    "convolution.2": "matmul",  # XLA:TPU writes a dot as a convolution without spatial dims
    "ffi_call.1": "conv_onednn",
    "ffi_call.2": "conv_onednn",
    "ffi_call.3": "conv_onednn",
    "ffi_call.4": "pool_onednn",
    "gemm.1": "matmul",
    "gemm.2": "matmul",
    "multiply_add_fusion": "elementwise",
    "add.2": "elementwise",
    "log_fusion": "elementwise",  # the loss is Optax's too, but not its update
    "sqrt_fusion": "optimizer",
    "copy.1": "copies",
    "sort.1": "other",
    "while.1": None,  # a container: its body's operations are timed themselves
}


@pytest.mark.parametrize("name", KNOWN)
def test_operations_are_classified_by_what_they_compute(name):
    assert read_hlo(HLO).kind(name) == KNOWN[name]


def test_unknown_events_are_not_operations_but_device_copies_are():
    index = read_hlo(HLO)
    assert index.kind("ThunkExecutor::Execute") is None
    assert index.kind("MemcpyH2D") == "copies"


def _rows_of_100ns(ops: list[OpEvent], steps: int) -> dict:
    """The table's rows by kind for `ops` in a window of 100 ns, all of it measured."""
    table = breakdown_lib.breakdown(
        ops, read_hlo(HLO), (0, 100), wall_seconds=100e-9, steps=steps,
        flops_per_step=None, peak_flops_per_second=None,
    )  # fmt: skip
    return {r["kind"]: r for r in table["rows"]}


def test_busy_time_is_shared_and_the_rest_is_host_overhead():
    """A dot alone 0-20 ns, a dot and a convolution at once 20-40 (half each), the
    convolution alone 40-60; a copy outside the window; 100 ns measured."""
    ops = [
        OpEvent("dot.1", 0, 40),
        OpEvent("convolution.1", 20, 60),
        OpEvent("copy.1", 200, 300),
        OpEvent("while.1", 0, 100),
        OpEvent("ThunkExecutor::Execute", 0, 100),
    ]
    rows = _rows_of_100ns(ops, steps=2)
    assert rows["matmul"]["share"] == pytest.approx(0.3)
    assert rows["conv_xla"]["share"] == pytest.approx(0.3)
    assert rows["copies"]["share"] == 0
    assert rows["host"]["share"] == pytest.approx(0.4)
    assert rows["host"]["seconds_per_step"] == pytest.approx(20e-9)
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)


# FLOPs of the module's arithmetic, by hand: a 4x4 @ 4x4 dot is 2*16*4; the 3x3
# convolution from 1 to 2 channels on 8x8 is 2 * (8*8*2 outputs) * (3*3*1 terms) each,
# and each of oneDNN's three calls computes the same convolution.
FLOPS = {
    "dot.1": 128.0,
    "ynn_fusion.1": 128.0,  # the dot in its body
    "convolution.1": 2304.0,
    "ffi_call.1": 2304.0,
    "ffi_call.2": 2304.0,
    "ffi_call.3": 2304.0,
    "multiply_add_fusion": 0.0,
    "copy.1": 0.0,
    "gemm.1": None,  # a GEMM call without its dimension numbers: not known
    "gemm.2": 128.0,  # one with them, its product the first array of its result
}


def test_instructions_keep_their_shapes_and_operands():
    ins = read_hlo(HLO).instructions
    assert ins["dot.9"].shape == (4, 4) and ins["dot.9"].operands == ("param_0.1", "param_1.1")
    assert ins["ffi_call.3"].shape == (3, 3, 1, 2)
    assert ins["while.1"].shape is None  # a tuple
    assert ins["gemm.2"].shape is None and ins["gemm.2"].first == (4, 4)
    assert "dim_labels=b01f_01io->b01f" in ins["convolution.1"].attributes


@pytest.mark.parametrize("name", FLOPS)
def test_arithmetic_is_counted_from_the_program(name):
    assert flops_lib.count(name, read_hlo(HLO)) == FLOPS[name]


def test_each_arithmetic_kind_gets_its_own_flops():
    """A dot of 128 FLOPs in 50 ns and a convolution of 2304 in 25 ns, the convolution
    run twice with one run half outside the window; 2 steps."""
    index, window = read_hlo(HLO), (0, 100)
    ops = [
        OpEvent("dot.1", 0, 50),
        OpEvent("ffi_call.1", 50, 75),
        OpEvent("ffi_call.1", 90, 110),  # half of it inside: half its FLOPs
    ]
    kw = {"wall_seconds": 1e-7, "steps": 2, "flops_per_step": 999.0, "peak_flops_per_second": 1e9}
    table = breakdown_lib.breakdown(ops, index, window, **kw)
    rows = {r["kind"]: r for r in table["rows"]}
    assert rows["matmul"]["flops_per_step"] == pytest.approx(64.0)
    assert rows["conv_onednn"]["flops_per_step"] == pytest.approx(1.5 * 2304 / 2)
    seconds = rows["conv_onednn"]["seconds_per_step"]
    assert rows["conv_onednn"]["flops_per_second"] == pytest.approx(1.5 * 2304 / 2 / seconds)
    assert rows["elementwise"]["flops_per_second"] is None
    together = table["arithmetic_together"]
    assert together["flops_from"] == "program"
    assert table["program_flops_per_step"] == pytest.approx(64.0 + 1.5 * 2304 / 2)
    assert together["flops_per_step"] == table["program_flops_per_step"]
    assert table["flops_per_step"] == 999.0  # the model's, kept beside
    assert "counted in the compiled program" in breakdown_lib.format_table(table)
    # Nanoseconds against 1 GFLOP/s: above the peak, which is then no peak: no fraction.
    assert rows["conv_onednn"]["fraction_of_peak"] is None and rows["conv_onednn"]["above_peak"]
    text = breakdown_lib.format_table(table)
    assert "no fraction of it is shown: " in text
    assert all(float(p) <= 100 for p in re.findall(r"([\d.]+)% of peak", text)), text
    cells = {row[0]: row[4] for row in breakdown_lib.table_rows(table)}
    assert cells[rows["conv_onednn"]["label"]] == "—"


def test_an_uncountable_kind_falls_back_to_the_models_count_only_when_alone():
    index, window = read_hlo(HLO), (0, 100)
    kw = {"wall_seconds": 1e-7, "steps": 1, "flops_per_step": 50.0, "peak_flops_per_second": 1e9}
    alone = breakdown_lib.breakdown([OpEvent("gemm.1", 0, 50)], index, window, **kw)
    rows = {r["kind"]: r for r in alone["rows"]}
    assert rows["matmul"]["flops_per_second"] == pytest.approx(1e9)
    assert rows["matmul"]["fraction_of_peak"] == pytest.approx(1.0)
    assert alone["program_flops_per_step"] is None  # the model's count is not the program's
    assert "counted in the compiled program" not in breakdown_lib.format_table(alone)
    assert "no fraction of it" not in breakdown_lib.format_table(alone)  # exactly the peak
    both = breakdown_lib.breakdown(
        [OpEvent("gemm.1", 0, 25), OpEvent("convolution.1", 25, 50)], index, window, **kw
    )
    rows = {r["kind"]: r for r in both["rows"]}
    assert rows["matmul"]["flops_per_second"] is None  # never a guess
    assert rows["conv_xla"]["flops_per_step"] == pytest.approx(2304.0)
    assert both["arithmetic_together"]["flops_from"] == "model"
    assert both["arithmetic_together"]["flops_per_second"] == pytest.approx(1e9)
    assert "—" in breakdown_lib.format_table(both)


def test_a_compiled_programs_flops_are_its_shapes():
    """XLA's own dot and convolution, compiled here: the count is the textbook one."""
    x = jax.ShapeDtypeStruct((8, 12, 12, 3), "float32")
    w = jax.ShapeDtypeStruct((5, 5, 3, 4), "float32")
    a = jax.ShapeDtypeStruct((16, 48), "float32")
    b = jax.ShapeDtypeStruct((48, 32), "float32")

    def f(x, w, a, b):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return y.sum() + (a @ b).sum()

    index = read_hlo(jax.jit(f).lower(x, w, a, b).compile().as_text())
    counted = {
        ins.opcode: flops_lib.count(name, index)
        for name, ins in index.instructions.items()
        if ins.opcode in ("dot", "convolution")
    }
    assert counted["dot"] == 2 * 16 * 32 * 48
    assert counted["convolution"] == 2 * (8 * 8 * 8 * 4) * (5 * 5 * 3)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory, tiny_dataset):
    """A profile of 6 steps of the default MLP on the tiny dataset (one call per epoch
    of 20 steps), with a small peak matmul."""
    cfg = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(
        cfg, compile_cache=False, train=dataclasses.replace(cfg.train, batch_size=32)
    )
    out = tmp_path_factory.mktemp("profile")
    return out, profile_config(cfg, tiny_dataset, steps=6, out_dir=out, peak_size=256)


@pytest.mark.accelerator
def test_the_trace_opens_with_the_profilers_own_reader(tiny_profile):
    out, table = tiny_profile
    xplane = out / table["trace"]
    assert xplane.name.endswith(".xplane.pb") and xplane.parent.parent.name == "profile"
    profile = jax.profiler.ProfileData.from_file(str(xplane))
    assert [p.name for p in profile.planes if p.name.startswith("/host:")]
    with gzip.open(out / table["perfetto"]) as f:
        assert json.load(f)["traceEvents"]
    assert json.loads((out / "profile.json").read_text()) == json.loads(json.dumps(table))


def test_the_programs_count_of_an_mlp_is_the_models(tiny_profile):
    """For an MLP both counts are the dense layers' matmuls, forward and backward without
    the first layer's input gradient: counted two ways, they agree."""
    _, table = tiny_profile
    rows = {r["kind"]: r for r in table["rows"]}
    assert table["program_flops_per_step"] == pytest.approx(table["flops_per_step"], rel=1e-6)
    assert rows["matmul"]["flops_per_step"] == table["program_flops_per_step"]


@pytest.mark.accelerator
def test_the_shares_add_up_to_the_measured_step_time(tiny_profile):
    _, table = tiny_profile
    rows = {r["kind"]: r for r in table["rows"]}
    assert sum(r["share"] for r in table["rows"]) == pytest.approx(1.0, abs=0.02)
    seconds = sum(r["seconds_per_step"] for r in table["rows"]) * table["steps"]
    assert seconds == pytest.approx(table["wall_seconds"], rel=0.02)
    assert 0 < table["busy_seconds"] <= table["wall_seconds"]
    assert rows["matmul"]["share"] > 0 and rows["optimizer"]["share"] > 0
    assert rows["matmul"]["flops_per_second"] > 0  # an MLP: every FLOP is a matmul's
    assert {o["kind"] for o in table["top_ops"]} <= {*rows, None}


def test_the_cli_profiles_end_to_end(tiny_data_dir, tmp_path, capsys):
    out = tmp_path / "prof dir ü"  # the command it prints to open it must stay one path
    argv = ["profile", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--batch-size"]
    argv += ["32", "--profile-steps", "3", "--peak-size", "128", "--no-compile-cache"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "matrix multiplies" in printed and "host overhead" in printed
    # each phase's line on stderr as it ends, so that a slow one shows where it stops
    phases = [line for line in captured.err.splitlines() if line.startswith("profile: ")]
    words = [line.split(" ")[1] for line in phases]
    assert words == ["3", "compiled", "traced", "read", "measured"]
    assert all(line.endswith(" s") for line in phases[1:])
    seconds = json.loads((out / "profile.json").read_text())["phase_seconds"]
    assert set(seconds) == {"trace", "read", "peak"} and min(seconds.values()) >= 0
    assert "ui.perfetto.dev" in printed
    opener = next(line for line in printed.splitlines() if "tensorboard --logdir" in line)
    assert shlex.split(opener.split("--logdir", 1)[1])[0] == str(out)
    assert json.loads((out / "profile.json").read_text())["steps"] == 3


def test_without_a_step_count_it_traces_one_of_a_runs_calls(
    tiny_data_dir, tiny_arrays, tmp_path, capsys
):
    # Half a second of steps (the run loop's calls), at most an epoch, at least 20: on
    # an accelerator 20 steps in one call would be mostly its launch and wait.
    assert call_steps(0.001, 1000) == 500
    assert call_steps(0.001, 235) == 235
    assert call_steps(0.1, 1000) == 20
    assert call_steps(0.001, 5) == 20  # several calls, as a run makes for short epochs
    out = tmp_path / "p"
    argv = ["profile", "--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--batch-size"]
    argv += ["4", "--peak-size", "128", "--no-compile-cache", "--out", str(out)]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "profile: a run's call of steps of tpu101" in err and "after 20 to" in err
    table = json.loads((out / "profile.json").read_text())
    epoch = len(tiny_arrays["train_labels"]) // 4  # a tiny MLP's epoch: far below 0.5 s
    assert table["steps"] == epoch > 20 and table["calls"] == 1
    assert table["steps_chosen"] == "one of a run's calls"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "--profile-steps must be at least 1, got 0"),
        ("-2", "--profile-steps must be at least 1, got -2"),
        ("1000000000", ("--profile-steps is at most 10,000 (a trace records every event of "
                        "every step), got 1,000,000,000")),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["profile", "train", "bench"])
def test_a_bad_step_count_is_one_line_and_exit_2(command, value, message, tmp_path, capsys):
    out = tmp_path / "never"
    where = ["--run-dir" if command == "train" else "--out", str(out)]
    assert cli.main([command, "--profile-steps", value, *where]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"jaxmnist {command}: error: {message}"]
    assert not out.exists()


def test_profile_never_writes_into_a_training_runs_directory(tiny_model_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_model_run, run)
    before = sorted(p.name for p in run.iterdir())
    assert cli.main(["profile", "--profile-steps", "2", "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a training run" in err[0]
    assert sorted(p.name for p in run.iterdir()) == before


def test_train_profile_steps_puts_the_table_in_the_report(train_argv, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main([*train_argv(run, "--epochs", "1", "--profile-steps", "2")]) == 0
    assert "where a step's time goes" in capsys.readouterr().out
    assert json.loads((run / "profile.json").read_text())["steps"] == 2
    assert list(run.glob("plugins/profile/*/*.xplane.pb"))
    page = (run / "report.html").read_text()
    assert "<h2>Where a step&#x27;s time goes</h2>" in page and "matrix multiplies" in page


def test_bench_profile_steps_puts_the_table_in_bench_html(tmp_path):
    out = tmp_path / "b"
    argv = ["bench", "--quick", "--synthetic", "--no-compile-cache", "--modes", "scan-epoch"]
    argv += ["--dtypes", "float32", "--batch-sizes", "32", "--batch-size", "32"]
    assert cli.main([*argv, "--profile-steps", "2", "--out", str(out)]) == 0
    assert json.loads((out / "bench.json").read_text())["profile"]["steps"] == 2
    assert "time goes" in (out / "bench.html").read_text()


def test_a_tpus_operations_are_read_by_the_instruction_they_write_out():
    # A TPU's "XLA Ops" line names each event by its whole HLO instruction and gives no
    # `hlo_op` stat; read by the bare name, a v5e's CNN profile found only copies.
    def event(name, start, stats=()):
        return NS(name=name, start_ns=start, end_ns=start + 10, stats=list(stats))

    ops = [
        event("%fusion.179 = f32[256,28,28,16]{0,3,2,1} fusion(bf16[256,28,28,1] %copy.98)", 0),
        event("%convolution.4 = f32[8,8] convolution(f32[8,8] %p0, f32[8,8] %p1), dim_labels=", 20),
        event("%unknown.1 = f32[] add(f32[] %a, f32[] %b)", 40),
    ]
    copies = [
        event("%copy-start.13 = (f32[3]) copy-start(f32[3] %x)", 60, [("hlo_op", "copy-done.13")])
    ]
    lines = [NS(name="XLA Ops", events=ops), NS(name="Async XLA Ops", events=copies)]
    tpu = NS(name="/device:TPU:0", lines=lines)
    host = NS(name="/host:CPU", lines=[NS(name="main", events=[event("fusion.179", 5)])])
    known = {"fusion.179", "convolution.4", "copy-done.13"}
    read = read_ops(NS(planes=[host, tpu]), known)
    assert [(e.name, e.start_ns, e.in_flight) for e in read] == [
        ("fusion.179", 0, False),
        ("convolution.4", 20, False),
        ("copy-done.13", 60, True),  # the async line: the copy's time in flight
    ]


def test_a_copy_in_flight_counts_only_where_nothing_else_runs():
    """A copy in flight 0-100 ns beside a dot 0-40 and a convolution 60-80: the copy
    gets 40-60 and 80-100, the dot and the convolution all of theirs (a v5e's CNN profile
    gave most of its step to a copy that the device never waited for)."""
    ops = [
        OpEvent("copy.1", 0, 100, in_flight=True),
        OpEvent("dot.1", 0, 40),
        OpEvent("convolution.1", 60, 80),
    ]
    rows = _rows_of_100ns(ops, steps=1)
    assert rows["matmul"]["share"] == pytest.approx(0.4)
    assert rows["conv_xla"]["share"] == pytest.approx(0.2)
    assert rows["copies"]["share"] == pytest.approx(0.4)
    assert rows["host"]["share"] == pytest.approx(0.0)
    # The costliest operations count the copy the same way: 40 ns, not its 100 in flight.
    table = breakdown_lib.breakdown(
        ops, read_hlo(HLO), (0, 100), wall_seconds=100e-9, steps=1,
        flops_per_step=None, peak_flops_per_second=None,
    )  # fmt: skip
    top = {o["name"]: o["seconds_per_step"] for o in table["top_ops"]}
    assert top == pytest.approx({"copy.1": 40e-9, "dot.1": 40e-9, "convolution.1": 20e-9})
    # Two copies in flight alone share their time as any two operations do.
    both = [OpEvent("a", 0, 10, True), OpEvent("b", 0, 10, True), OpEvent("c", 10, 20)]
    assert breakdown_lib.attribute(
        [(e.start_ns, e.end_ns, e.name) for e in both], 0, 20, [e.in_flight for e in both]
    ) == {"a": 5, "b": 5, "c": 10}


def test_the_peak_is_the_best_of_several_windows(monkeypatch):
    """Anything else running only slows a window down: the best one is the peak."""
    from jaxmnist.profiling import recipe as profiling_run

    asked = {}

    def fake(dtype, n, windows):
        asked["windows"] = windows
        return {"flops_per_second": {"median": 80e9, "min": 50e9, "max": 100e9}}

    monkeypatch.setattr(profiling_run.peak_lib, "measure_matmul_peak", fake)
    assert profiling_run.measure_peak("float32", 64) == 100e9 and asked["windows"] >= 5
