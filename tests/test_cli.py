"""The `jaxmnist` command line, end to end, and its argument errors."""

import json
import os
import shutil
import subprocess
import sys

import jax
import pytest

from jaxmnist.cli import main


def test_train_then_eval_end_to_end(tiny_data_dir, train_argv, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_argv(run, "--hidden", "64", "optimizer.grad_clip=5")) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(lines) == 3  # one line per epoch
    assert "test accuracy" in out and str(run) in out

    summary = json.loads((run / "summary.json").read_text())
    for key in (
        "test_accuracy",
        "test_loss",
        "compile_seconds",
        "train_seconds",
        "examples_per_second",
        "epochs",
        "steps",
        "num_test_examples",
    ):
        assert key in summary, key
    assert summary["num_test_examples"] == 150 and summary["epochs"] == 3
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    for key in (
        "epoch",
        "step",
        "train_loss",
        "train_accuracy",
        "test_loss",
        "test_accuracy",
        "epoch_seconds",
    ):
        assert all(key in r for r in records), key
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["hidden"] == [64] and config["optimizer"]["grad_clip"] == 5.0
    env = json.loads((run / "environment.json").read_text())
    assert env["backend"] == jax.default_backend() and env["jax"]
    confusion = json.loads((run / "confusion_matrix.json").read_text())
    assert sum(map(sum, confusion["matrix"])) == 150

    assert main(["eval", str(run), "--data-dir", str(tiny_data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    assert result["test_loss"] == pytest.approx(summary["test_loss"], rel=1e-5)
    assert result["confusion_matrix"] == confusion["matrix"]


def test_train_json_and_quiet(train_argv, tmp_path, capsys):
    assert main(train_argv(tmp_path / "a", "--json", "--steps", "5")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 5 and summary["epochs"] == 1
    assert main(train_argv(tmp_path / "b", "--quiet", "--steps", "5")) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("test accuracy")  # one line, as promised
    assert out[0].endswith(f"run directory: {tmp_path / 'b'}")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "nope"], "unknown preset"),
        (["--dataset", "cifar"], "unknown dataset"),
        (["--model", "transformer"], "unknown model"),
        (["--optimizer", "lion"], "unknown optimizer"),
        (["--activation", "tanh"], "unknown activation"),
        (["--dtype", "float8"], "unknown dtype"),
        (["--batch-size", "0"], "batch size"),
        (["--batch-size", "60001"], "batch size"),
        (["--batch-size", "abc"], "expected int"),
        (["--epochs", "0"], "epochs must be positive"),
        (["--lr", "nan"], "learning rate"),
        (["--lr", "-1"], "learning rate"),
        (["--lr", "inf"], "learning rate"),
        (["optimizer.nope=1"], "unknown config field"),
        (["no_equals_sign"], "section.field=value"),
        (["train.eval_train=maybe"], "true or false"),
    ],
)
def test_invalid_arguments_exit_2_before_work(args, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not run.exists()  # nothing written, no data loaded


def test_unwritable_run_dir_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["train", "--run-dir", str(blocker / "run")]) == 2
    assert "not writable" in capsys.readouterr().err


def test_eval_of_a_non_run_dir_is_one_line(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2  # as predict, export and serve: no run there
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a run directory" in err


def test_missing_data_offline_lists_places(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("JAXMNIST_DATA_DIR", raising=False)
    assert (
        main(
            [
                "train",
                "--run-dir",
                str(tmp_path / "run"),
                "--data-dir",
                str(tmp_path / "empty"),
                "data.download=false",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "empty") in err


def test_config_command_prints_resolved_config(capsys):
    assert main(["config", "--preset", "codelab", "--lr", "0.01", "model.hidden=512,64"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["optimizer"]["lr"] == 0.01 and cfg["model"]["hidden"] == [512, 64]
    assert cfg["data"]["dataset"] == "fashion_mnist" and cfg["train"]["steps"] == 400


def test_overrides_may_come_between_options_and_anything_else_is_refused(capsys):
    argv = ["config", "--preset", "cnn", "model.dropout=0.25", "--epochs", "3", "data.flip=true"]
    assert main(argv) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert (cfg["model"]["dropout"], cfg["data"]["flip"], cfg["train"]["epochs"]) == (0.25, True, 3)
    with pytest.raises(SystemExit) as e:
        main(["config", "--epochs", "3", "model.dropout=0.25", "--bogus", "1"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["data", "info", "mnist", "stray"])
    assert e.value.code == 2


def test_devices_reports_placement(capsys):
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    place, one = report["placement"], [report["environment"]["devices"][0]]
    assert place["mesh"] == {"members": 1, "data": 1} and place["devices"] == one
    for where in [*place["params"].values(), place["batch"], place["train_set"], place["logits"]]:
        assert where["devices"] == one
    assert place["batch"]["spec"] == "P('data',)" and place["train_set"]["spec"] == "P()"
    assert report["environment"]["backend"] == jax.default_backend()


def test_data_info_and_verify(tiny_data_dir, capsys):
    assert main(["data", "info", "tiny", "--data-dir", str(tiny_data_dir)]) == 0
    assert "tiny" in capsys.readouterr().out
    assert main(["data", "verify", "tiny", "--data-dir", str(tiny_data_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 4 and "4 arrays verified" in out


def test_real_entry_point_runs_as_a_program(tiny_data_dir, tmp_path):
    """The installed console script, in a fresh process: argument errors exit 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxmnist", "train", "--epochs", "0"],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=120,
    )
    assert proc.returncode == 2 and "epochs must be positive" in proc.stderr
    assert "Traceback" not in proc.stderr


# `jaxmnist` as installed (`cli.run`), with what a program may have left for Python's exit:
# a thread still running, an atexit handler, and an object that says when it is torn down.
EXITS_AS_PYTHON_WOULD = """\
import atexit, sys, threading, time
from jaxmnist import cli
atexit.register(lambda: print("atexit handler ran"))
def late():  # outlasts the command
    time.sleep(2)
    print("thread finished")
threading.Thread(target=late).start()
class Teardown:
    def __del__(self):
        print("interpreter torn down")
keep = Teardown()
sys.argv = ["jaxmnist", *sys.argv[1:]]
cli.run()
print("after run")
"""


@pytest.mark.parametrize("argv, code", [(["config"], 0), (["eval", "no-such-run"], 2)])
def test_the_command_exits_as_python_would_without_its_teardown(argv, code):
    proc = subprocess.run(
        [sys.executable, "-c", EXITS_AS_PYTHON_WOULD, *argv],
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr
    out = proc.stdout  # a pipe: block-buffered, so everything printed was flushed
    assert out.index("thread finished") < out.index("atexit handler ran")  # Python's order
    assert "interpreter torn down" not in out and "after run" not in out
    if code == 0:
        assert '"dataset": "mnist"' in out  # the command's own output, whole
    else:
        assert "no-such-run" in proc.stderr


def test_an_os_error_from_the_environment_is_one_line_and_exit_1(monkeypatch, capsys):
    from jaxmnist.commands import config

    def vanished(args):
        raise FileNotFoundError(2, "No such file or directory", "/gone/summary.json")

    monkeypatch.setattr(config, "run", vanished)
    assert main(["config"]) == 1
    assert capsys.readouterr().err == (
        "jaxmnist config: error: /gone/summary.json: No such file or directory\n"
    )


@pytest.mark.parametrize(
    "args, epochs, steps",
    [
        (["--epochs", "1"], 1, None),  # codelab's train.steps=400 must not win
        (["train.epochs=2"], 2, None),
        (["--steps", "7"], 5, 7),
        (["--epochs", "2", "--steps", "7"], 2, 7),  # both given: steps, as --help says
    ],
)
def test_duration_on_the_command_line_wins_over_the_preset(args, epochs, steps, capsys):
    assert main(["config", "--preset", "codelab", *args]) == 0
    train = json.loads(capsys.readouterr().out)["train"]
    assert (train["epochs"], train["steps"]) == (epochs, steps)


def test_codelab_epochs_then_eval_in_a_new_shell(tiny_data_dir, tmp_path, capsys, monkeypatch):
    """Data found through JAXMNIST_DATA_DIR at training is found again by `eval` in a
    shell without it: the run records where its data came from."""
    monkeypatch.setenv("JAXMNIST_DATA_DIR", str(tiny_data_dir))
    run = tmp_path / "run"
    argv = ["train", "--preset", "codelab", "--dataset", "tiny", "--run-dir", str(run)]
    assert main([*argv, "--epochs", "1", "--batch-size", "32", "--no-compile-cache", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["epochs"], summary["steps"]) == (1, 640 // 32)  # not codelab's 400 steps
    data = json.loads((run / "data.json").read_text())
    assert data["folder"] == str(tiny_data_dir / "tiny") and len(data["sha256"]) == 4

    monkeypatch.delenv("JAXMNIST_DATA_DIR")  # a new shell
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    assert main(["eval", str(run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test_accuracy"] == pytest.approx(summary["test_accuracy"])


def test_version(capsys):
    from importlib import metadata

    import jaxmnist

    assert jaxmnist.__version__ == metadata.version("jaxmnist")
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"jaxmnist {jaxmnist.__version__}\n"


def test_output_into_a_closed_pipe_is_no_traceback():
    """`jaxmnist ... | head -3`: the reader has gone before everything was written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxmnist", "config"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # like head after its lines: nobody reads any more
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141  # as killed by SIGPIPE, like other tools in a pipe
    assert err == ""


def test_warmup_steps_with_a_schedule_without_warmup_is_refused(capsys):
    assert main(["config", "--schedule", "cosine", "optimizer.warmup_steps=10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warmup applies to warmup_cosine only" in err
    assert main(["config", "--schedule", "warmup_cosine", "optimizer.warmup_steps=10"]) == 0


def test_one_epoch_is_singular():
    import io

    from jaxmnist.commands.terminal import TerminalReporter
    from jaxmnist.training.hooks import Progress, RunStart

    out = io.StringIO()
    info = {"dataset": "tiny", "source": "memory", "num_params": 10, "epochs": 1}
    info.update(steps_per_epoch=20, backend="cpu", device="cpu:0")
    TerminalReporter("normal", stream=out).on_start(RunStart(None, info, Progress()))
    assert "| 1 epoch x 20 steps |" in out.getvalue()


def test_a_long_epoch_is_announced_with_its_estimate():
    """After the first timed call the loop estimates the epoch; the terminal says it only
    when it is long (the --seeds 5000 case: minutes without a line)."""
    import io

    from jaxmnist.commands.terminal import TerminalReporter

    out = io.StringIO()
    reporter = TerminalReporter("normal", stream=out)
    reporter.on_estimate(4.2, 0.009)
    assert out.getvalue() == ""
    reporter.on_estimate(312.0, 0.667)
    assert out.getvalue() == "an epoch will take about 5 min (667 ms per step, as timed so far)\n"


def test_a_runs_last_lines_name_the_first_seeds_and_count_the_rest():
    from jaxmnist.commands.terminal import SEEDS_LISTED, seed_lines

    def per_seed(n):
        summary = {"seeds": list(range(7, 7 + n)), "test_accuracy_per_seed": [0.5] * n}
        (line,) = [x for x in seed_lines(summary) if x.startswith("per seed")]
        return line

    few = per_seed(SEEDS_LISTED)
    assert few.count("50.00%") == SEEDS_LISTED and "more" not in few
    many = per_seed(2048)
    assert many.count("50.00%") == SEEDS_LISTED and f"{6 + SEEDS_LISTED}: " in many
    assert many.endswith(f"… and {2048 - SEEDS_LISTED:,} more in summary.json"), many


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--checkpoint-every", "0", "--checkpoint-every must be at least 1, got 0"),
        ("--keep-checkpoints", "0", "--keep-checkpoints must be at least 1, got 0"),
        ("--checkpoint-every-steps", "-1", "--checkpoint-every-steps must be >= 1 (0: off)"),
    ],
)
def test_bad_checkpoint_flags_exit_2_before_work(flag, value, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not run.exists()


def test_bench_reads_devices_without_changing_the_arguments():
    """bench's --devices lists device counts for its scaling table: the config it resolves
    leaves them out, and the parsed arguments still hold them."""
    from jaxmnist.cli import build_parser
    from jaxmnist.commands import options

    args = build_parser().parse_args(["bench", "--devices", "1,2", "--seed", "5"])
    cfg, _ = options.resolve_config(args, leave_out=("--devices",))
    assert cfg.parallel.devices is None and cfg.train.seed == 5
    assert getattr(args, "parallel.devices") == "1,2"


SHARED = {"__init__", "options", "terminal"}  # jaxmnist/commands/ modules that are no command


def test_each_command_is_a_module_of_at_most_200_lines_with_a_parser_and_a_run():
    """One module per command: `add_parser(subparsers)` and `run(args) -> int`; a command
    that outgrows 200 lines holds logic that belongs in the library."""
    import importlib
    from pathlib import Path

    from jaxmnist import cli, commands

    folder = Path(commands.__file__).parent
    names = {path.stem for path in folder.glob("*.py")} - SHARED
    assert names == set(cli.COMMANDS)
    for name in sorted(names):
        module = importlib.import_module(f"jaxmnist.commands.{name}")
        lines = len((folder / f"{name}.py").read_text().splitlines())
        assert lines <= 200, f"commands/{name}.py has {lines} lines"
        assert callable(getattr(module, "add_parser", None)), name
        assert callable(getattr(module, "run", None)), name


# What a command that only parses (`--help`, `--version`, a mistyped flag) must not import:
# the libraries that compute, which take about a second to load where the goal is 0.3 s.
COMPUTING = ("jax", "jaxlib", "numpy", "optax", "orbax", "matplotlib", "PIL", "scipy")
REFUSE = """
import sys

REFUSED, tried = set(sys.argv[1:]), []


class Refuse:
    # Records and refuses every import of a refused library, even one a caller catches.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            tried.append(name)
            raise ImportError(f"{name} imported while parsing")


sys.meta_path.insert(0, Refuse())


def loaded():
    return sorted(m for m in sys.modules if m.partition(".")[0] in REFUSED)
"""


def _run_refusing(code: str) -> dict:
    """Runs `code` (after REFUSE) in a fresh interpreter refusing COMPUTING; its last
    stdout line, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", REFUSE + code, *COMPUTING],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_parser_builds_without_jax_or_matplotlib():
    """`jaxmnist --help`, `--version`, every command's `--help` and an argument error only
    parse: in a fresh interpreter they import none of the libraries that compute (jax,
    numpy, matplotlib, Optax, Orbax, PIL...), so they answer at once (#23). A command
    module imports its heavy parts in its `run`."""
    result = _run_refusing(
        """
import argparse, contextlib, io, json
from jaxmnist import cli

parser = cli.build_parser()
sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
argvs = [["--version"], ["--help"], *([name, "--help"] for name in sub.choices)]
codes, heads = {}, {}
for argv in [*argvs, ["train", "--no-such-flag"]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            cli.main(argv)
        except SystemExit as e:
            codes[" ".join(argv)] = e.code
    heads[" ".join(argv)] = out.getvalue().partition("\\n")[0]
print(json.dumps({"commands": list(sub.choices), "codes": codes, "heads": heads,
                  "tried": tried, "loaded": loaded()}))
"""
    )
    assert result["tried"] == [] and result["loaded"] == [], result
    commands = result["commands"]
    known = {"train", "report", "compare", "eval", "config", "devices", "data", "bench"}
    assert known | {"sweep", "predict", "export", "serve"} <= set(commands)
    assert len(result["codes"]) == len(commands) + 3
    assert result["codes"].pop("train --no-such-flag") == 2
    assert set(result["codes"].values()) == {0}
    assert result["heads"]["--version"].startswith("jaxmnist ")
    for name in commands:
        assert result["heads"][f"{name} --help"].startswith(f"usage: jaxmnist {name} ")


def test_presets_and_model_overrides_are_read_without_jax():
    """The registry knows each family's config before its jax code loads: presets,
    `model.*` overrides (switching family, refusing another family's field) and saved
    configs are read without jax; `get_model` is what imports a family's module."""
    result = _run_refusing(
        """
import json
from jaxmnist import config, models
from jaxmnist.errors import ConfigError

cfg = config.apply_overrides(config.get_preset("speedrun"), {"model.name": "mlp"})
cfg = config.apply_overrides(cfg, {"model.hidden": "8,4", "model.name": "cnn"})
again = config.from_dict(cfg.to_dict())
try:
    config.apply_overrides(config.Config(), {"model.channels": "4"})
except ConfigError as e:
    refused = str(e)
before = {"tried": tried, "loaded": loaded(), "cnn": "jaxmnist.models.cnn" in sys.modules}
sys.meta_path.pop(0)  # now the family's jax code may load
entry = models.get_model("cnn")
print(json.dumps({**before, "model": repr(cfg.model), "same": again == cfg, "refused": refused,
                  "apply": entry.apply is sys.modules["jaxmnist.models.cnn"].apply}))
"""
    )
    assert result["tried"] == [] and result["loaded"] == [] and not result["cnn"], result
    assert result["model"].startswith("CNNConfig(name='cnn'") and "hidden=(8, 4)" in result["model"]
    assert result["same"] and "(a field of cnn)" in result["refused"]
    assert result["apply"]


def test_what_the_light_modules_name_is_what_the_jax_code_has():
    """The names read before jax loads (the activations, each family's config class) are
    those of the modules that compute."""
    from jaxmnist import models
    from jaxmnist.models import cnn, cnn_config, family, layers, mlp, mlp_config

    assert family.ACTIVATIONS == tuple(layers.ACTIVATIONS)
    assert models.MLPConfig is mlp.MLPConfig is mlp_config.MLPConfig
    assert models.CNNConfig is cnn.CNNConfig is cnn_config.CNNConfig
    assert models.get_model("mlp") is mlp.MODEL and models.get_model("cnn") is cnn.MODEL


@pytest.mark.parametrize(
    "args",
    [
        ["--seed", "4294967297"],  # JAX would give seed 1's keys
        ["--seed", str(-(2**63))],  # ... and seed 0's
        ["--seed", "-1"],
        ["--seed", "99999999999999999999"],  # an OverflowError in jax.random.key
        ["--seed", "9223372036854775807", "--seeds", "2"],
        ["--seed", "4294967295", "--seeds", "2"],  # the second seed is out of range
    ],
)
def test_seeds_that_would_repeat_another_seeds_keys_are_refused(args, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seeds must lie in 0..4294967295" in err, err
    assert not run.exists()


def test_seeds_are_accepted_exactly_where_jax_keys_are_distinct():
    """Without 64-bit types, jax.random.key(s) is the key (0, s mod 2**32): the accepted
    range holds one seed per key, and what lies beyond it repeats a seed in it."""
    import numpy as np

    from jaxmnist.config import MAX_SEED

    def key(seed):
        return np.asarray(jax.random.key_data(jax.random.key(seed))).tolist()

    for seed in (0, 1, 2**31, MAX_SEED - 1, MAX_SEED):
        assert key(seed) == [0, seed]
    assert key(MAX_SEED + 2) == key(1) and key(-1) == key(MAX_SEED) and key(-(2**63)) == key(0)


def test_the_largest_seeds_train(train_argv, tmp_path, capsys):
    run = tmp_path / "run"
    argv = train_argv(run, "--seed", "4294967294", "--seeds", "2", "--steps", "3", "--json")
    assert main([*argv, "--no-report"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seeds"] == [4294967294, 4294967295]
    assert summary["test_loss_per_seed"][0] != summary["test_loss_per_seed"][1]  # two models


def tree(path) -> dict:
    return {str(p.relative_to(path)): p.is_file() and p.read_bytes() for p in path.rglob("*")}


@pytest.mark.slow
def test_a_run_refused_before_it_starts_leaves_no_directory_it_made(
    train_argv, tmp_path, capsys, monkeypatch
):
    too_many = ("--seeds", "100", "memory_budget_mb=64")  # refused by the memory estimate
    assert main(train_argv(tmp_path / "new" / "run", *too_many)) == 2
    assert "models need about" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # nor the folder above it, made for it

    monkeypatch.chdir(tmp_path)  # the default run directory, runs/<preset>-<dataset>-<time>
    argv = ["train", "--data-dir", str(tmp_path / "no-data"), "data.download=false"]
    assert main([*argv, "--no-compile-cache"]) == 1
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_refused_overwrite_keeps_the_old_run_as_it_was(
    tiny_cli_run, train_argv, tmp_path, capsys
):
    run = shutil.copytree(tiny_cli_run, tmp_path / "run")
    assert (run / "command.txt").is_file() and (run / "checkpoints").is_dir()
    before = tree(run)
    assert main(train_argv(run, "--overwrite", "--seeds", "100", "memory_budget_mb=64")) == 2
    assert "models need about" in capsys.readouterr().err
    assert tree(run) == before  # checkpoints, parameters and command.txt: all the old run's

    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert main(train_argv(kept, "--seeds", "100", "memory_budget_mb=64")) == 2
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]  # not even its .lock


@pytest.mark.parametrize(
    "args, message",
    [
        (["data.max_shift=100"], "data.max_shift must be smaller than half the image's side"),
        (["data.max_shift=14"], "at most 13 pixels for mnist's 28x28 images, got 14"),
        (["--hidden", ",,,"], "model.hidden: ',,,' holds no numbers"),
        (["model.hidden= , "], "model.hidden: ',' holds no numbers"),
    ],
)
def test_values_that_would_train_something_else_are_refused(args, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not run.exists()


@pytest.mark.parametrize("args", [["--hidden", ""], ["model.hidden="]])
def test_an_empty_hidden_list_is_a_linear_model(args, capsys):
    assert main(["config", *args, "data.max_shift=13"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["model"]["hidden"] == [] and cfg["data"]["max_shift"] == 13


def test_resume_with_overwrite_is_refused(tiny_cli_run, tiny_registered, tmp_path, capsys):
    run = shutil.copytree(tiny_cli_run, tmp_path / "run")
    before = tree(run)
    assert main(["train", "--resume", str(run), "--overwrite", "--epochs", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "jaxmnist train: error: --resume continues RUN_DIR and --overwrite replaces it; choose one"
    )
    assert tree(run) == before


def test_data_info_prints_no_python_none(tmp_path, monkeypatch, capsys):
    """A dataset not found has no location: the line says "none", not Python's None."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("JAXMNIST_DATA_DIR", raising=False)
    assert main(["data", "info", "mnist", "--data-dir", str(tmp_path / "empty")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if "None" in line]
    assert "none" in [line.split()[-1] for line in lines if line.startswith("location ")]


def test_every_option_of_every_command_has_help():
    import argparse

    from jaxmnist import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {action.option_strings[-1]}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if action.option_strings and not action.help and action.dest != "help"
    ]
    assert missing == []


def test_the_start_line_names_every_device_and_a_run_cut_short():
    """`--devices 4` names the four devices and the mesh, not just the first; a run that a
    step count cuts inside its first epoch says its steps, not the epoch's."""
    import io

    from jaxmnist.commands.terminal import TerminalReporter
    from jaxmnist.training.hooks import Progress, RunStart

    out = io.StringIO()
    info = {"dataset": "tiny", "source": "memory", "num_params": 10, "epochs": 1}
    info.update(steps_per_epoch=117, total_steps=100, backend="cpu", device="cpu:0")
    info.update(devices=[f"cpu:{i}" for i in range(4)], mesh={"members": 1, "data": 4})
    TerminalReporter("normal", stream=out).on_start(RunStart(None, info, Progress()))
    line = out.getvalue().splitlines()[0]
    assert line.endswith("| 100 steps | cpu: 4 devices (cpu:0-3), mesh members 1 x data 4")
    out = io.StringIO()
    info.update(epochs=2, total_steps=200, devices=["cpu:0"], mesh={"members": 1, "data": 1})
    TerminalReporter("normal", stream=out).on_start(RunStart(None, info, Progress()))
    line = out.getvalue().splitlines()[0]
    assert line.endswith("| 200 steps in 2 epochs of up to 117 | cpu: cpu:0")


def test_json_stdout_holds_the_json_alone_whatever_native_code_prints(
    train_argv, tmp_path, capfd, monkeypatch
):
    """A collective library's lines (gloo's `[Gloo] Rank 0 is connected...`), written to
    the process's stdout by native code as processes join, go to stderr under --json."""
    import os as os_lib

    from jaxmnist.commands import options as options_lib

    real = options_lib.start_processes

    def joining(*args):
        os_lib.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks.\n")
        return real(*args)

    monkeypatch.setattr(options_lib, "start_processes", joining)
    assert main([*train_argv(tmp_path / "run", "--epochs", "1"), "--json", "--no-report"]) == 0
    captured = capfd.readouterr()
    summary = json.loads(captured.out)  # all of it: nothing before or after the JSON
    assert summary["run_dir"] == str(tmp_path / "run")
    assert "[Gloo] Rank 0 is connected" in captured.err
    os_lib.write(1, b"after\n")  # stdout is stdout again once the command returns
    assert capfd.readouterr().out == "after\n"
