"""Every script under benchmarks/ still imports, answers --help and runs its smallest mode.

The scripts are loaded from their files, as `python benchmarks/NAME.py` would run them
(with `benchmarks/` first on `sys.path`, where `benchlib` lives), so that a function of
jaxmnist renamed or moved breaks this test rather than the next person who runs the
benchmark. Every jaxmnist name a script uses is also looked up, including those it
imports inside functions (which no import at load time reaches). Every script that
measures has a `--smoke` mode, run here on tiny random data (in this process, or in the
`jaxmnist` or worker processes the script starts), each in seconds, writing its record
where the test says.
"""

import ast
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import made_once

from jaxmnist import config as config_lib
from jaxmnist.models import onednn

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))

# --smoke: extra arguments, and the keys its JSON must hold (None: it prints JSON instead).
SMOKE = {
    "aot_compile": ([], {"presets", "target", "environment", "provenance"}),
    "checkpoint_overhead": ([], {"median_epoch_wall_seconds", "checkpoint_overhead"}),
    "cnn_presets": ([], {"presets", "environment", "provenance"}),
    "cnn_vs_pytorch": ([], {"results", "peaks_flops_per_second", "environment", "provenance"}),
    "compile_time": ([], {"runs", "median", "environment"}),
    "data_loading": ([], {"loads", "median", "environment"}),
    "devices_scaling": ([], {"scaling", "tpu101_test_accuracy", "environment"}),
    "epoch_vs_tutorial": ([], {"epoch_seconds", "epoch_ratio", "peak_fraction"}),
    "first_conv": (["--arms", "banded"], {"arms", "environment", "provenance"}),
    "eval_overhead": (["--seeds", "2", "--rounds", "1"], {"cases", "side_by_side"}),
    "host_memory": ([], {"seeds_2", "steps", "environment", "provenance"}),
    "run_overhead": ([], {"runs", "median", "goal_report_seconds", "goal_peak_mb"}),
    "seeds_vs_single": ([], {"wall_ratio", "seeds_test_accuracy", "environment", "provenance"}),
    "serve_load": ([], {"completed", "errors", "latency_ms", "provenance"}),
    "staged_batches": ([], {"pairs", "environment", "provenance"}),
    "startup": ([], {"invocations", "slowest_median_seconds", "stack_imports", "environment"}),
    "stop_latency": ([], {"cases", "target_seconds", "environment", "provenance"}),
    "tpu_time_to_result": (
        ["--repeats", "2"],
        {"cold_ratio", "warm_ratio", "compile_tpu101_s", "compile", "commit", "date"},
    ),
    "tutorial_tpu101": ([], None),
}
# Scripts that time oneDNN's custom calls: skipped where jaxmnist-onednn is not installed.
NEEDS_ONEDNN: set[str] = set()
# Scripts that need an optional extra: skipped without it.
NEEDS_EXTRA = {"serve_load": "uvicorn"}  # the serve extra
# What a smoke record must say beyond its keys.
SMOKE_CHECKS = {
    # Every program of the run, each compiled on its own, for this machine's CPU.
    "aot_compile": lambda r: (
        r["target"] == "cpu"
        and all(
            {"steps", "init", "plan", "eval"} <= set(p["compile_programs"])
            for p in r["presets"].values()
        )
    ),
    # The forced arm is the formulation the run recorded for its first layer.
    "first_conv": lambda r: [a["banded"]["first_layer"] for a in r["arms"].values()] == ["banded"],
    # The commit at the record's top is its provenance's, untracked files not counted;
    # a preset's compile is the median of its cold runs (the first: the whole cold run).
    "tpu_time_to_result": lambda r: (
        (r["commit"], r["dirty"]) == (r["provenance"]["commit"], r["provenance"]["dirty"])
        and len(r["compile"]["tpu101"]["compile_samples"]) == r["compile_repeats"] == 2
        and r["compile"]["tpu101"]["compile_samples"][0] == r["jaxmnist_cold_compile_seconds"]
        and r["compile_tpu101_s"] == sum(r["compile"]["tpu101"]["compile_samples"]) / 2
        and r["command"].endswith(" --repeats 2")
    ),
    "serve_load": lambda r: r["completed"] == 20 and r["errors"] == 0,
    # Each program's compile, of the preset with its override (two members).
    "compile_time": lambda r: (
        {"steps", "init", "eval"} <= set(r["median"]["this"]["tpu101:train.seeds=2"]["programs"])
    ),
}
# Their --smoke modes, run by tests of their own: twice, in `record_runs`, which
# the record tests read; with an override, in
# test_memory_estimate_runs_its_cases_with_the_overrides_asked.
OWN_SMOKE_TEST = {"record", "memory_estimate"}
# Tools that read the records rather than measure: tests/test_results.py runs them.
TOOLS = {"goals"}


def load(name: str):
    """benchmarks/NAME.py as a fresh module (`benchmarks/` must be on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_every_script_is_checked():
    assert len(SCRIPTS) >= 14, SCRIPTS  # the glob found the folder
    kinds = [set(SMOKE), OWN_SMOKE_TEST, TOOLS]
    assert set(SCRIPTS) == set.union(*kinds), "say how each script is checked"
    assert sum(map(len, kinds)) == len(SCRIPTS), "each script in one place"


@pytest.mark.parametrize("name", SCRIPTS)
def test_imports_and_answers_help(name, on_path, capsys):
    module = load(name)
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:"), out
    if name in SMOKE or name in OWN_SMOKE_TEST:
        assert "--smoke" in out


def jaxmnist_names(path: Path) -> set[str]:
    """Dotted names a script takes from jaxmnist: what it imports (at the top or inside a
    function) and the attributes it reads from what it imported."""
    tree = ast.parse(path.read_text())
    bound, names = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "jaxmnist":
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    names.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "jaxmnist":
                    bound[alias.asname or "jaxmnist"] = alias.name if alias.asname else "jaxmnist"
                    names.add(alias.name)
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if chain and isinstance(node, ast.Name) and node.id in bound:
            names.add(".".join([bound[node.id], *reversed(chain)]))
    return names


def resolve(dotted: str):
    """The object `dotted` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError as e:
            if not ".".join(parts[:i]).startswith(e.name or "?"):
                raise  # a module that exists failed to import: say so
    for attr in parts[i:]:
        obj = getattr(obj, attr)
    return obj


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_jaxmnist_name_it_uses_exists(name):
    names = jaxmnist_names(BENCHMARKS / f"{name}.py")
    missing = []
    for dotted in sorted(names):
        try:
            resolve(dotted)
        except (AttributeError, ModuleNotFoundError) as e:
            missing.append(f"{dotted} ({e})")
    assert not missing, f"benchmarks/{name}.py uses names jaxmnist no longer has: {missing}"


def test_the_name_check_finds_a_missing_name(tmp_path):
    script = tmp_path / "gone.py"
    script.write_text(
        "from jaxmnist.training import step as step_lib\n"
        "def f():\n"
        "    from jaxmnist.runs.checkpoint import no_such_function\n"
        "    return step_lib.no_such_step\n"
    )
    names = jaxmnist_names(script)
    assert names >= {
        "jaxmnist.runs.checkpoint.no_such_function",
        "jaxmnist.training.step.no_such_step",
    }
    with pytest.raises(AttributeError):
        resolve("jaxmnist.training.step.no_such_step")


def test_a_smoke_run_never_writes_into_the_committed_results(on_path):
    default_out = importlib.import_module("benchlib.results").default_out
    assert default_out("x.json").parent == BENCHMARKS / "results" / "x"  # a new record
    assert BENCHMARKS not in default_out("x.json", smoke=True).parents


def test_a_code_copy_goes_first_on_the_path_the_dependencies_stay_on(on_path):
    # Dependencies installed with `pip install --target DIR` are found through PYTHONPATH:
    # a side-by-side child that replaced it could not import JAX.
    code_env = importlib.import_module("benchlib.launch").code_env
    env = code_env("/copy", {"PYTHONPATH": "/deps", "HOME": "/h"})
    assert env == {"PYTHONPATH": os.pathsep.join(["/copy", "/deps"]), "HOME": "/h"}
    assert code_env("/copy", {})["PYTHONPATH"] == "/copy"


def test_figures_that_cannot_be_written_are_printed_not_lost(on_path, tmp_path, capsys):
    save_benchmark = importlib.import_module("benchlib.results").save_benchmark
    blocked = tmp_path / "a file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as exit_:
        save_benchmark(blocked / "x.json", {"figure": 1.25}, (0.5, 0.5, 0.5))
    assert str(exit_.value).startswith(f"could not write {blocked / 'x.json'}")
    assert json.loads(capsys.readouterr().out)["figure"] == 1.25
    assert save_benchmark(tmp_path / "x.json", {"figure": 2}, (0.0,) * 3).endswith("x.json")
    assert json.loads((tmp_path / "x.json").read_text())["figure"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file", "x.json"]  # no temporary


def test_importing_the_scaling_script_leaves_the_devices_alone(on_path, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    load("devices_scaling")  # it asks for 8 fake devices only when run as a script
    assert "XLA_FLAGS" not in os.environ


def test_pytorch_comparison_imports_without_torch(on_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    module = load("cnn_vs_pytorch")
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert "--variants" in capsys.readouterr().out


def test_accelerator_session_script():
    script = BENCHMARKS / "accelerator_session.sh"
    done = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    used = set(re.findall(r"benchmarks/(\w+)\.py", script.read_text()))
    assert used and used <= set(SCRIPTS), used - set(SCRIPTS)
    steps = re.findall(r"^step (\S+) (\S+)", script.read_text(), re.MULTILINE)
    assert steps and all(command == '"$py"' for _, command in steps), steps


def test_accelerator_session_runs_only_the_steps_asked(tmp_path):
    script = BENCHMARKS / "accelerator_session.sh"
    env = {**os.environ, "STEPS": "none", "STEP_LIMIT": "1", "OUT": str(tmp_path)}
    env["PYTHON"] = sys.executable  # the script's default, python3, may lack JAX
    done = subprocess.run(
        ["bash", str(script)], env=env, check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    (path,) = (tmp_path / "accelerator_session").iterdir()  # named as a record is
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_[0-9a-f]{7}(-dirty)?_[a-z0-9-]+\.txt", path.name)
    log = path.read_text()
    assert '"backend"' in log and "== done" in log, log
    assert "== speedrun" not in log and "== profile" not in log, log


@pytest.mark.parametrize(
    "body, code, out, err",
    [
        ("import sys; print('figures', sys.argv[1:])", 0, "figures ['--x']", ""),
        ("import sys; sys.exit('one line')", 1, "", "one line"),
        ("import sys; sys.exit(3)", 3, "", ""),
        ("raise ValueError('broken')", 1, "", "ValueError: broken"),
    ],
)
def test_the_accelerator_sessions_launcher_ends_a_script_with_its_exit_code(
    tmp_path, body, code, out, err
):
    """The launcher the session runs each benchmark script through (it ends the process
    past the runtime's teardown): the script's output, exit code and error survive."""
    text = (BENCHMARKS / "accelerator_session.sh").read_text()
    launch = re.search(r"^launch='(.*?)'$", text, re.MULTILINE | re.DOTALL).group(1)
    script = tmp_path / "script.py"
    script.write_text(body + "\n")
    done = subprocess.run(
        [sys.executable, "-c", launch, str(script), "--x"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == code
    assert done.stdout.strip() == out
    assert (done.stderr.strip().splitlines() or [""])[-1] == err


def test_accelerator_session_stops_before_any_step_when_an_import_fails(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "optax.py").write_text("raise ImportError('a broken wheel')\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(site), "OUT": str(out)}
    script = BENCHMARKS / "accelerator_session.sh"
    done = subprocess.run(
        ["bash", str(script)], env=env, check=False, capture_output=True, text=True
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == "accelerator_session.sh: cannot import: optax (ImportError: a broken wheel)"
    assert not out.exists()


def test_accelerator_session_stops_before_any_step_when_a_dataset_is_missing(tmp_path):
    """MNIST where the session reads it, Fashion-MNIST nowhere: one line, exit 1, before
    a step runs or the backend is opened, and nothing written."""
    data = tmp_path / "data"
    data.mkdir()
    real = Path(os.environ.get("JAXMNIST_DATA_DIR", tmp_path / "none")) / "mnist"
    if real.is_dir():  # the real MNIST where CI has it: Fashion-MNIST alone is missing
        shutil.copytree(real, data / "mnist")
    out = tmp_path / "out"
    env = {
        **os.environ, "PYTHON": sys.executable, "OUT": str(out), "STEPS": "first-conv",
        "JAXMNIST_DATA_DIR": str(data), "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }  # fmt: skip
    script = BENCHMARKS / "accelerator_session.sh"
    done = subprocess.run(
        ["bash", str(script)], env=env, check=False, capture_output=True, text=True
    )
    assert done.returncode == 1
    (last,) = done.stderr.strip().splitlines()
    assert last.startswith("accelerator_session.sh: jaxmnist data: error: ")
    assert "MNIST not found in " + str(data) in last  # Fashion-MNIST's, or MNIST's too
    assert not out.exists()


@pytest.mark.parametrize("name", sorted(SMOKE))
@pytest.mark.slow
def test_smoke_mode(name, on_path, tmp_path, capsys, monkeypatch):
    if name in NEEDS_ONEDNN and not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    if name in NEEDS_EXTRA:
        pytest.importorskip(NEEDS_EXTRA[name], reason="needs an extra it names")
    if name == "cnn_vs_pytorch" and importlib.util.find_spec("torch") is None:
        # The same run as the test below, which hides PyTorch and checks these keys too.
        pytest.skip(
            "no PyTorch: test_pytorch_comparisons_smoke_runs_jaxmnist_alone_without_torch "
            "runs this smoke mode"
        )
    extra, keys = SMOKE[name]
    module = load(name)
    out = tmp_path / f"{name}.json"
    where = [] if keys is None else ["--out", str(out)]  # None: it prints its figures
    # As a script runs it: its arguments from sys.argv (what a record says was run)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--smoke", *where, *extra])
    module.main()
    if keys is None:
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        return
    result = json.loads(out.read_text())
    assert keys <= set(result), keys - set(result)
    assert SMOKE_CHECKS.get(name, bool)(result), result


@pytest.mark.slow
def test_pytorch_comparisons_smoke_runs_jaxmnist_alone_without_torch(
    on_path, monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(sys.modules, "torch", None)  # find_spec("torch") finds nothing
    out = tmp_path / "cnn_vs_pytorch.json"
    load("cnn_vs_pytorch").main(["--smoke", "--out", str(out)])
    assert "PyTorch is not installed: the smoke run skips its variant\n" in capsys.readouterr().out
    result = json.loads(out.read_text())
    keys = SMOKE["cnn_vs_pytorch"][1]
    assert keys <= set(result), keys - set(result)
    (row,) = result["results"]
    assert row["variant"].startswith("jax ") and row["steady_epoch_seconds"] > 0
    assert result["ratios"] == {}


def test_pytorch_comparison_says_in_one_line_that_torch_is_missing(on_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SystemExit) as e:
        load("cnn_vs_pytorch").main(["--variants", "jax im2col float32,torch float32"])
    assert str(e.value) == (
        "torch float32: PyTorch is not installed "
        "(pip install -e '.[bench]', a CPU build of torch first)"
    )


def test_time_to_result_refuses_fewer_than_one_repeat_before_it_runs_anything(on_path, capsys):
    with pytest.raises(SystemExit) as e:
        load("tpu_time_to_result").main(["--smoke", "--repeats", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("--repeats must be at least 1, got 0")


def test_aot_compile_says_in_one_line_that_libtpu_is_missing(on_path, monkeypatch):
    """Without JAX's TPU plugin nothing can compile for a TPU: one line, before anything
    in the environment changes."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a)
    )
    monkeypatch.setenv("JAXMNIST_DATA_DIR", "unused")
    before = dict(os.environ)
    with pytest.raises(SystemExit) as e:
        load("aot_compile").main(["--presets", "tpu101"])
    assert str(e.value) == (
        "aot_compile.py: needs libtpu beside JAX (pip install 'jax[tpu]'), or --smoke"
    )
    assert dict(os.environ) == before


@pytest.mark.slow
def test_memory_estimate_runs_its_cases_with_the_overrides_asked(on_path, tmp_path, capsys):
    module = load("memory_estimate")
    out = tmp_path / "m.json"
    module.main(["--smoke", "--out", str(out), "--set", "train.eval_batch_size=8"])
    result = json.loads(out.read_text())
    assert {"cases", "goal", "environment"} <= set(result), set(result)
    assert result["overrides"] == {"train.eval_batch_size": "8"}
    assert result["cases"]
    assert all(case["set"] == {"train.eval_batch_size": 8} for case in result["cases"])
    with pytest.raises(SystemExit) as e:
        module.main(["--smoke", "--set", "eval_batch_size"])
    assert e.value.code == 2
    assert "is not of the form section.field=value" in capsys.readouterr().err


def test_memory_estimate_says_in_one_line_when_the_peak_rss_cannot_be_reset(on_path, tmp_path):
    """A sandbox that refuses /proc/self/clear_refs (a TPU machine's did): one line, not a
    traceback, and never a peak that would still hold the compiler's."""
    module = load("memory_estimate")
    target = tmp_path / "clear_refs"
    target.mkdir()  # writing to a folder fails as the refused file does, with an OSError
    with pytest.raises(SystemExit) as e:
        module.reset_peak_rss(target)
    assert str(e.value).startswith("memory_estimate.py: cannot reset the peak RSS")
    assert "\n" not in str(e.value)
    writable = tmp_path / "writable"
    module.reset_peak_rss(writable)
    assert writable.read_text() == "5"


@pytest.fixture(scope="session")
def record_runs(tmp_path_factory):
    """benchmarks/record.py --smoke run twice into one file, once in the session
    (`made_once`), for the tests below: both presets (`first.json`, a copy of the file
    then), then `record` alone for its first 3 steps with an override, which leaves
    `fashion_record` as the first invocation wrote it (`record.json`); `events.json`: the
    order of each invocation's training runs and of its own look at the machine. The
    second run trains the programs of the first run's `record` (its smoke run is 3 steps;
    the override is read on the host alone), so that it compiles none of them again: they
    come from the session's compilation cache."""
    from jaxmnist import runtime  # the module the benchmark's saving asks

    def run_twice(folder):
        events = []
        real_run, real_environment = subprocess.run, runtime.environment

        def run(command, *args, **kwargs):
            events.extend(["train"] * ("train" in command))  # not the provenance's git calls
            return real_run(command, *args, **kwargs)

        def environment(*args, **kwargs):
            events.append("environment")
            return real_environment(*args, **kwargs)

        out = folder / "record.json"
        with pytest.MonkeyPatch.context() as mp:
            mp.syspath_prepend(str(BENCHMARKS))
            mp.setattr(subprocess, "run", run)
            mp.setattr(runtime, "environment", environment)
            module = load("record")
            module.main(["--smoke", "--out", str(out)])
            (folder / "first.json").write_text(out.read_text())
            first_events = events[:]
            events.clear()
            module.main(["--smoke", "--out", str(out), "--presets", "record", "--steps", "3",
                         "--set", "data.download=false"])  # fmt: skip
            (folder / "events.json").write_text(json.dumps([first_events, events]))

    yield from made_once(tmp_path_factory, "record-smoke", run_twice)


@pytest.mark.slow
def test_record_opens_no_device_while_its_runs_go(record_runs):
    """An accelerator that admits one program at a time (a TPU) would refuse the next run
    if the script held it: each preset's machine is read from its run's environment.json,
    and the script asks JAX for its own only after the last run has ended."""
    events = json.loads((record_runs / "events.json").read_text())
    assert events == [["train", "train", "environment"], ["train", "environment"]]
    for result in json.loads((record_runs / "first.json").read_text())["presets"].values():
        assert result["environment"]["seeds"] == [0, 1]  # the run's own record


@pytest.mark.slow
def test_record_steps_projects_the_schedule_from_a_partial_run(record_runs, on_path, tmp_path):
    """`--steps N` runs N steps with the overrides asked and scales their training time to
    the preset's whole schedule (its epochs times the run's steps per epoch)."""
    r = json.loads((record_runs / "record.json").read_text())["presets"]["record"]
    env = r["environment"]
    assert r["partial"] and r["steps"] == env["total_steps"] == 3
    assert "data.download=false" in r["command"] and r["overrides"] == ["data.download=false"]
    schedule = config_lib.get_preset("record").train.epochs * env["steps_per_epoch"]
    assert r["schedule_steps"] == schedule > 3
    assert r["seconds_per_step"] == r["train_seconds"] / 3
    assert r["projected_train_hours"] * 3600 == pytest.approx(r["seconds_per_step"] * schedule)
    with pytest.raises(SystemExit, match="--steps: a positive number"):
        load("record").main(["--smoke", "--out", str(tmp_path / "record.json"), "--steps", "0"])


@pytest.mark.slow
def test_record_keeps_each_presets_own_environment_and_load(record_runs):
    """Presets measured by separate invocations share one file: each keeps the machine and
    the load average of its own run, not those of the last invocation."""
    first = json.loads((record_runs / "first.json").read_text())
    assert {"presets", "environment"} <= set(first), set(first)
    assert set(first["presets"]) == {"record", "fashion_record"}
    presets = json.loads((record_runs / "record.json").read_text())["presets"]
    assert set(presets) == {"record", "fashion_record"}
    assert presets["fashion_record"] == first["presets"]["fashion_record"]
    assert presets["record"]["partial"] and not first["presets"]["record"].get("partial")
    for result in [*presets.values(), first["presets"]["record"]]:
        assert result["environment"]["cpu_count"] >= 1
        assert set(result["load_average_around"]) == {"before", "after"}
