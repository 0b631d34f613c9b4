"""`jaxmnist bench`: the real CLI on --quick, its schema, its guards and its argument errors."""

import contextlib
import dataclasses
import io
import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import made_once

from jaxmnist import cli, optim, timing
from jaxmnist import config as config_lib
from jaxmnist.bench import modes as modes_lib
from jaxmnist.bench import options as options_lib
from jaxmnist.bench import schema
from jaxmnist.bench.table import format_table
from jaxmnist.cli import main
from jaxmnist.models.layers import matmul
from jaxmnist.profiling import peak as peak_lib
from jaxmnist.training.loop import place_train_data
from jaxmnist.training.step import init_state

REAL_DATA_DIR = os.environ.get("JAXMNIST_DATA_DIR")


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """One real `jaxmnist bench --quick` run, shared by the tests that read its output
    (made once in the session: `made_once`).

    Batch 16: where a jitted call per step costs most relative to the step, so the
    mode ordering is checked with a wide margin even on a busy machine. Real data
    when JAXMNIST_DATA_DIR is set, random data of MNIST's shape otherwise.
    """
    data = (
        ["--data-dir", REAL_DATA_DIR, "data.download=false"] if REAL_DATA_DIR else ["--synthetic"]
    )

    def bench(out):
        argv = [
            "bench",
            "--quick",
            "--no-compile-cache",
            "--batch-size",
            "16",
            "--batch-sizes",
            "16,256",
            "--tokens-per-example",
            "100",
            "--out",
            str(out / "result"),
            *data,
        ]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_CACHE_HOME", str(out / "cache"))
            (out / "exit_code").write_text(str(cli.main(argv)))

    for out in made_once(tmp_path_factory, "bench-quick", bench):
        yield int((out / "exit_code").read_text()), out / "result"


def test_quick_cli_writes_json_matching_schema(quick_run, capsys):
    code, out = quick_run
    assert code == 0
    text = (out / "bench.json").read_text()
    result = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert schema.check(result) == []
    assert result["schema_version"] == 1
    assert [m["mode"] for m in result["modes"]] == list(modes_lib.MODES)
    assert [m["dtype"] for m in result["dtypes"]] == ["float32", "bfloat16"]
    assert [m["batch_size"] for m in result["batch_sweep"]] == [16, 256]
    assert set(result["peak"]) == {"float32", "bfloat16"}
    assert result["data"]["synthetic"] == (REAL_DATA_DIR is None)
    assert result["environment"]["backend"] == jax.default_backend()
    assert result["config"]["train"]["batch_size"] == 16
    for m in result["modes"] + result["dtypes"] + result["batch_sweep"]:
        assert len(m["window_seconds"]) == m["windows"] >= 5
        assert m["compiles_in_windows"] == 0
        assert 0 < m["mfu"] < 2 and m["examples_per_second"]["median"] > 0
        assert m["projected_tokens_per_second"] == pytest.approx(
            100 * m["examples_per_second"]["median"]
        )
        assert m["steps_trained"] >= (m["windows"] + m["warmup_windows"]) * m["steps_per_window"]
    assert (out / "bench.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (out / "bench.html").read_text()
    assert "jaxmnist bench: tpu101" in page and "data:image/png;base64," in page
    assert "projection" in page


def test_guards_are_the_documented_ones(quick_run):
    result = json.loads((quick_run[1] / "bench.json").read_text())
    for m in result["modes"]:
        expected = "allow" if m["mode"] == "python-dispatch" else "disallow"
        assert m["transfer_guard"] == {
            "host_to_device": expected,
            "device_to_host": "disallow",
            "device_to_device": "disallow",
        }


def test_table_labels_tokens_as_a_projection(quick_run):
    result = json.loads((quick_run[1] / "bench.json").read_text())
    table = format_table(result)
    assert "tokens/s (proj.)" in table and "a projection, not a measurement" in table
    assert "scan-epoch/jit-step-host" in table
    no_tokens = format_table({**result, "tokens": None})
    assert "tokens" not in no_tokens


@pytest.mark.parametrize(
    "args, message",
    [
        (["--modes", "scan-epoch,warp-drive"], "unknown mode 'warp-drive'"),
        (["--sweep-mode", "eager"], "unknown mode 'eager'"),
        (["--batch-sizes", "0,64"], "batch sizes must be positive, got 0"),
        (["--batch-sizes", "64,lots"], "batch size: expected an integer"),
        (["--batch-size", "0"], "batch size must be between 1"),
        (["--dtypes", "float8"], "unknown dtype 'float8'"),
        (["--tokens-per-example", "-3"], "tokens per example must be positive"),
        (["--modes", "scan-epoch,scan-epoch"], "without repeats"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert cli.main(["bench", "--quick", "--synthetic", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jaxmnist bench: error: ") and message in err


def test_batch_size_beyond_the_data_is_exit_2(tmp_path, capsys):
    argv = [
        "bench",
        "--quick",
        "--synthetic",
        "--no-compile-cache",
        "--batch-sizes",
        "8192",
        "--dtypes",
        "float32",
        "--out",
        str(tmp_path),
    ]
    assert cli.main(argv) == 2
    assert "batch size 8192 exceeds the 4096 training examples" in capsys.readouterr().err


def test_dtype_the_backend_lacks_is_exit_2(tmp_path, capsys, monkeypatch):
    def ones(shape, dtype):
        if jnp.dtype(dtype) == jnp.bfloat16:
            raise RuntimeError("UNIMPLEMENTED: bf16 dot")
        return jnp.ones(shape, dtype)

    monkeypatch.setattr(options_lib, "jnp", types.SimpleNamespace(ones=ones, matmul=jnp.matmul))
    assert cli.main(["bench", "--quick", "--synthetic", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"dtype bfloat16 is not supported by the {jax.default_backend()} backend" in err


def test_compile_inside_a_timed_window_raises():
    x = jnp.ones(4)
    calls = iter(range(100))

    def fresh_program():  # a new function object each call: a new trace and compile
        return jax.jit(lambda v: v + next(calls))(x)

    with pytest.raises(timing.RecompilationError, match="compile event"):
        timing.time_windows(fresh_program, windows=2, warmup=1, label="test")
    same = jax.jit(lambda v: v * 2)
    seconds, _ = timing.time_windows(lambda: same(x), windows=5, warmup=1, label="test")
    assert len(seconds) == 5 and min(seconds) > 0


def test_implicit_transfer_inside_a_timed_window_raises():
    double = jax.jit(lambda v: v * 2)
    double(jnp.ones(4))
    with pytest.raises(Exception, match="[Dd]isallowed host-to-device"):
        timing.time_windows(lambda: double(np.ones(4, np.float32)), windows=1, warmup=1, label="t")
    explicit = lambda: double(jax.device_put(np.ones(4, np.float32)))
    timing.time_windows(explicit, windows=1, warmup=1, label="t")


def test_stats():
    s = timing.stats([2.0, 1.0, 4.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 4.0, "rel_spread": 1.5}


def test_device_and_scan_modes_train_identically(tiny_dataset):
    """The same step is measured: jit-step-device and scan-epoch see the same batches
    in the same order, so one window of each gives the same parameters."""
    cfg = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=32))
    optimizer = optim.make_optimizer(cfg.optimizer, 100)
    data = place_train_data(tiny_dataset.train_images, tiny_dataset.train_labels)
    host = modes_lib.HostData(np.asarray(data.images), np.asarray(data.labels))
    params = {}
    for mode in ("jit-step-device", "scan-epoch"):
        state = init_state(jax.random.key(0), cfg, optimizer, (28, 28), 10)
        runner = modes_lib.build_runner(mode, cfg, optimizer, state, data, host, 20)
        runner.prepare(0)
        losses = runner.losses(runner.run())
        assert losses.shape == (20,) and int(runner.state.step) == 20
        params[mode] = jax.device_get(runner.state.params)
    for a, b in zip(
        jax.tree.leaves(params["jit-step-device"]), jax.tree.leaves(params["scan-epoch"])
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_schema_check_reports_problems():
    assert schema.check({}) and "bench: missing 'modes'" in schema.check({})
    bad_measurement = {k: None for k in schema.MEASUREMENT}
    problems = schema.check({"modes": [bad_measurement]})
    assert "bench.modes[0].batch_size: expected int, got NoneType" in problems
    assert (
        "bench.modes[0].final_train_loss: expected int or float or null, got NoneType"
        not in problems
    )


def test_differences_within_the_noise_are_not_shown_as_negative_times(quick_run):
    from jaxmnist.bench.page import render_bench_page

    result = json.loads((quick_run[1] / "bench.json").read_text())
    steps = {m["mode"]: m["step_seconds"] for m in result["modes"]}
    # A host copy that measured 0.15 ms *faster* than no copy, within a 0.4 ms spread.
    steps["jit-step-device"].update(median=2.00e-3, min=1.8e-3, max=2.2e-3)
    steps["jit-step-host"].update(median=1.85e-3, min=1.65e-3, max=2.05e-3)
    result["breakdown"]["host_copy_seconds"] = 1.85e-3 - 2.00e-3
    table = format_table(result)
    line = next(x for x in table.splitlines() if x.startswith("per step, ms:"))
    assert "host copy < noise (±0.400)" in line and "-0." not in line
    page = render_bench_page(result, (quick_run[1] / "bench.png").read_bytes(), table)
    assert "host copy &lt; noise (±0.400)" in page and "host copy -0.150" not in page
    # A difference beyond the noise is still shown as measured.
    result["breakdown"]["host_copy_seconds"] = 1.0e-3
    assert "host copy 1.000" in format_table(result)


def test_scaling_over_more_devices_than_exist_is_one_line(tmp_path, capsys):
    argv = ["bench", "--quick", "--synthetic", "--modes", "scan-epoch", "--dtypes", "float32"]
    argv += ["--batch-sizes", "128", "--devices", "1,2", "--out", str(tmp_path / "b")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "only 1 device(s) exist" in err and len(err.splitlines()) == 1


@pytest.fixture(scope="module")
def variants_run(tmp_path_factory, tiny_arrays, tiny_spec):
    """One real `jaxmnist bench --variants model.conv_impl=xla,im2col` on the tiny dataset
    with a tiny CNN (4 channels, batch 64: 10 steps a window); records the config each
    runner was built for and the order in which windows ran."""
    from jaxmnist.bench import measure as run_lib
    from jaxmnist.data import registry, synthetic

    tmp = tmp_path_factory.mktemp("variants")
    built, ran = [], []
    real_build = run_lib.build_runner

    def spy_build(mode, cfg, *args):
        runner = real_build(mode, cfg, *args)
        impl, run = cfg.model.conv_impl, runner.run
        built.append((mode, impl))

        def logged_run():
            ran.append(impl)
            return run()

        runner.run = logged_run
        return runner

    mp = pytest.MonkeyPatch()
    mp.setitem(registry.DATASETS, "tiny", tiny_spec)
    mp.setenv("XDG_CACHE_HOME", str(tmp / "cache"))
    mp.setattr(run_lib, "build_runner", spy_build)
    synthetic.write_idx_folder(tmp / "data" / tiny_spec.folder, tiny_arrays, tiny_spec)
    argv = ["bench", "--quick", "--no-compile-cache", "--preset", "cnn", "--dataset", "tiny"]
    argv += ["--data-dir", str(tmp / "data"), "--batch-size", "64"]
    argv += ["--variants", "model.conv_impl=xla,im2col", "--out", str(tmp / "result")]
    argv += ["data.download=false", "data.augment=false", "model.channels=4", "model.hidden=16"]
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            code = cli.main(argv)
    finally:
        mp.undo()
    return types.SimpleNamespace(
        code=code, out=tmp / "result", stdout=stdout.getvalue(), built=built, ran=ran
    )


def test_variants_json_has_one_measurement_per_value(variants_run):
    from jaxmnist.models import cnn

    assert variants_run.code == 0
    text = (variants_run.out / "bench.json").read_text()
    result = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert schema.check(result) == []
    v = result["variants"]
    assert (v["key"], v["mode"]) == ("model.conv_impl", "scan-epoch")
    assert v["values"] == ["xla", "im2col"]
    assert [r["value"] for r in v["rows"]] == ["xla", "im2col"]
    # Each value is its own measurement of the config with the field overridden, and
    # with --variants alone nothing else is measured.
    assert variants_run.built == [("scan-epoch", "xla"), ("scan-epoch", "im2col")]
    assert result["modes"] == result["dtypes"] == result["batch_sweep"] == []
    assert result["config"]["model"]["conv_impl"] == "auto"  # the base config, as given
    model_cfg = config_lib.from_dict(result["config"]).model
    for r in v["rows"]:
        assert (r["mode"], r["dtype"], r["batch_size"], r["steps_per_window"]) == (
            "scan-epoch",
            "float32",
            64,
            10,
        )
        assert len(r["window_seconds"]) == r["windows"] == 5 and r["compiles_in_windows"] == 0
        assert r["compile_seconds"] > 0 and r["step_seconds"]["median"] > 0
        assert r["flops_per_example"] == cnn.flops_per_example(model_cfg)
        assert 0 < r["mfu"] < 2 and 0 <= r["test_accuracy"] <= 1
        assert r["same_program_as"] is None  # xla and im2col are different programs
    first, second = (r["examples_per_second"]["median"] for r in v["rows"])
    assert v["rows"][0]["examples_per_second_vs_first"] == 1.0
    assert v["rows"][1]["examples_per_second_vs_first"] == pytest.approx(second / first)
    # The same step from the same start: both formulations learn the tiny set alike.
    accuracies = [r["test_accuracy"] for r in v["rows"]]
    assert min(accuracies) > 0.5 and max(accuracies) - min(accuracies) < 0.1


def test_variants_windows_are_interleaved(variants_run):
    assert variants_run.ran == ["xla", "im2col"] * 6  # 1 warm-up + 5 timed windows each


def test_variants_table_in_terminal_and_page(variants_run):
    lines = variants_run.stdout.splitlines()
    title = lines.index(
        "Variants of model.conv_impl: scan-epoch, batch 64, float32 unless varied "
        "(timed windows interleaved)"
    )
    head, xla, im2col = (lines[title + i].split() for i in (1, 2, 3))
    assert head[:2] == ["value", "compile"] and head[-2:] == ["vs", "xla"]
    assert xla[0] == "xla" and xla[-1] == "1.00x"
    result = json.loads((variants_run.out / "bench.json").read_text())
    ratio = result["variants"]["rows"][1]["examples_per_second_vs_first"]
    assert im2col[0] == "im2col" and im2col[-1] == f"{ratio:.2f}x"
    assert "Modes:" not in variants_run.stdout and "Batch size:" not in variants_run.stdout
    page = (variants_run.out / "bench.html").read_text()
    assert "<h2>Variants of model.conv_impl</h2>" in page and ">vs xla</th>" in page
    assert '<th scope="row">im2col</th>' in page and f"{ratio:.2f}×" in page
    assert (variants_run.out / "bench.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_values_that_resolve_alike_are_measured_and_flagged():
    from jaxmnist.bench.variants import variant_configs
    from jaxmnist.models import conv

    cfg = config_lib.apply_overrides(
        config_lib.get_preset("cnn"), {"model.channels": "4", "model.hidden": "16"}
    )
    values = ("auto", "xla", "im2col", "patches")
    found = variant_configs(cfg, "model.conv_impl", values, "scan-epoch", (28, 28), 10)
    assert [v.cfg.model.conv_impl for v in found] == list(values)
    resolved = conv.resolve("auto")
    assert [v.same_as for v in found] == ["auto" if v == resolved else None for v in values]
    # What a program does not show but the initial state does is still a difference.
    for key, pair in (("optimizer.lr", ("1e-3", "3e-3")), ("train.seed", ("0", "1"))):
        found = variant_configs(cfg, key, pair, "scan-epoch", (28, 28), 10)
        assert [v.same_as for v in found] == [None, None]


@pytest.mark.parametrize(
    "preset, variants, message",
    [
        ("tpu101", "model.nope=1,2", "variants model.nope=1: unknown config field 'model.nope'"),
        ("cnn", "model.conv_impl=xla,fft", "unknown model.conv_impl 'fft'"),
        ("tpu101", "model.conv_impl=xla,im2col", "'model.conv_impl' for the mlp model"),
        ("tpu101", "train.epochs=1,2", "same scan-epoch program and initial state"),
        ("tpu101", "model.dtype=float32,float16", "unknown dtype 'float16'"),
        ("tpu101", "train.batch_size=64,0", "batch size must be between 1"),
        ("tpu101", "train.batch_size=64,x", "train.batch_size: expected int, got 'x'"),
        ("tpu101", "train.batch_size=64,8192", "8192: batch size 8192 exceeds the 4096"),
        ("tpu101", "optimizer.lr=1e-3,0.001", "1e-3 and 0.001 give the same config"),
        ("tpu101", "train.batch_size=64,64", "values repeat"),
        ("tpu101", "model.conv_impl", "expected KEY=V1,V2"),
        ("tpu101", "model.conv_impl=xla", "at least two values"),
        ("tpu101", "model.conv_impl=xla,", "expected KEY=V1,V2"),
    ],
)
def test_bad_variants_are_one_line_and_exit_2_before_measuring(
    preset, variants, message, tmp_path, capsys, monkeypatch
):
    from jaxmnist.bench import measure as run_lib

    def measured(*args, **kwargs):
        pytest.fail("measured before the variants were checked")

    monkeypatch.setattr(run_lib.peak_lib, "measure_matmul_peak", measured)
    monkeypatch.setattr(run_lib, "build_runner", measured)
    argv = ["bench", "--quick", "--synthetic", "--preset", preset, "--variants", variants]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jaxmnist bench: error: ") and message in err


def test_interleaved_windows_alternate_and_time_each_measurement():
    calls, x = [], jnp.ones(2)

    def window(name):
        def run():
            calls.append(name)
            return x

        return timing.Timed(run, name, prepare=lambda i: calls.append(f"prepare {name} {i}"))

    timed = timing.time_interleaved([window("a"), window("b")], windows=2, warmup=1)
    assert calls == [f"{x}" for i in range(3) for n in "ab" for x in (f"prepare {n} {i}", n)]
    assert [len(seconds) for seconds, _ in timed] == [2, 2]


@pytest.mark.parametrize(
    "backend, quick, side", [("cpu", False, 2048), ("cpu", True, 1024), ("tpu", True, 8192)]
)
def test_quick_peak_shrinks_the_cpus_matmul_but_not_an_accelerators(
    backend, quick, side, monkeypatch
):
    # A 512-side product left a TPU v5e at a fifteenth of the rate of an 8192-side one, so
    # a quick peak taken from it inflated every MFU of the run as many times.
    from jaxmnist import config as config_lib
    from jaxmnist.bench import measure as run_lib
    from jaxmnist.bench.options import make_options

    asked = []

    def measured(dtype, n, **kwargs):
        asked.append(n)
        return {"dtype": dtype, "matmul_shape": [n, n, n]}

    monkeypatch.setattr(run_lib.jax, "default_backend", lambda: backend)
    monkeypatch.setattr(run_lib.peak_lib, "measure_matmul_peak", measured)
    cfg = config_lib.get_preset("tpu101")
    dataset = run_lib.synthetic_dataset("mnist", train_size=256, test_size=64)
    bench = run_lib._Bench(cfg, make_options(quick=quick, synthetic=True), dataset, print)
    bench.peak("float32")
    assert asked == [side]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_peaks_product_only_reorders_columns_and_needs_no_factorisation(dtype):
    # The peak once took an orthogonal q from jnp.linalg.qr; a TPU v5e's compiler spent
    # longer over that QR at 8192 x 8192 than over everything else `jaxmnist profile`
    # compiled, and the profile ran out of time there.
    key = jax.random.key(3)
    x, q = peak_lib.operands(key, 64, dtype)
    assert x.dtype == q.dtype == jnp.dtype(dtype)
    q = np.asarray(q, np.float32)
    assert set(np.unique(q)) == {0.0, 1.0}
    assert (q.sum(axis=0) == 1).all() and (q.sum(axis=1) == 1).all()
    y = x
    for _ in range(5):
        y = matmul(y, jnp.asarray(q, dtype))
    assert sorted(np.asarray(y, np.float32).ravel()) == sorted(np.asarray(x, np.float32).ravel())
    primitives = str(jax.make_jaxpr(peak_lib.operands, static_argnums=(1, 2))(key, 64, dtype))
    assert not any(name in primitives for name in ("qr", "householder", "geqrf", "eigh", "svd"))
