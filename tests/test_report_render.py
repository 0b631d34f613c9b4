"""The report drawn by a child process (`report.background`): the same page as drawn in
process, no half-written page, errors as one line, no hang, no child left behind."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from test_report import tiny_run

from jaxmnist import errors
from jaxmnist.cli import main
from jaxmnist.commands import train as train_command
from jaxmnist.data import registry
from jaxmnist.data.registry import FASHION_MNIST, MNIST
from jaxmnist.report import background, plots, run_report
from jaxmnist.report.run_report import write_run_report

# A child that dies (SIGKILL, no clean-up) half-way through writing report.html.
DIES_MID_PAGE = """\
import os, signal
from jaxmnist.runs import rundir
from jaxmnist.report import background
write = rundir.atomic_write
def half(path, data):
    if path.name == "report.html":
        def die(f):
            f.write(data[: len(data) // 2]); f.flush(); os.kill(os.getpid(), signal.SIGKILL)
        return write(path, die)
    return write(path, data)
rundir.atomic_write = half
background.main()
"""


@pytest.fixture
def run_copy(tmp_path_factory, tiny_dataset, tmp_path):
    """A private copy of the tiny run of test_report, without a report."""
    return shutil.copytree(
        tiny_run(tmp_path_factory, tiny_dataset),
        tmp_path / "run",
        ignore=shutil.ignore_patterns("report.html", "plots"),
    )


def _files(run) -> dict:
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture
def no_drawing_here(monkeypatch):
    """Makes drawing in this process fail, so that a report written was the child's."""

    def refuse(*_):
        raise AssertionError("drawn in the parent")

    monkeypatch.setattr(run_report, "write_run_report", refuse)


def test_the_child_draws_the_page_and_plots_the_parent_would(
    run_copy, tmp_path, tiny_spec, monkeypatch, no_drawing_here
):
    # Registered here at run time, as the tests' CLI runs do: the child is told its name.
    monkeypatch.setitem(registry.DATASETS, "tiny", tiny_spec)
    here = shutil.copytree(run_copy, tmp_path / "here" / run_copy.name)  # the same name
    renderer = background.ReportRenderer()
    page = renderer.finish(run_copy)
    assert page == run_copy / "report.html"
    assert renderer.proc.returncode == 0
    write_run_report(here)  # the real one, imported before the fixture replaced it
    child, parent = _files(run_copy), _files(here)
    page_child = child.pop(page.relative_to(run_copy)).decode()
    page_parent = parent.pop(here.joinpath("report.html").relative_to(here)).decode()
    assert child == parent  # every PNG byte for byte, and the run's files untouched
    assert "tiny MNIST" in page_child
    assert page_child.replace(str(run_copy.resolve()), "RUN") == page_parent.replace(
        str(here.resolve()), "RUN"
    )


def test_a_cnn_on_a_dataset_registered_at_run_time_gets_its_filters_from_the_child(
    train_argv, tmp_path, no_drawing_here
):
    """Drawing a CNN's first-layer filters reads its parameters, which needs the run's
    dataset spec: the child, which lacks the registration made here, is told it."""
    run = tmp_path / "cnn"
    argv = train_argv(run, "--model", "cnn", "model.channels=2", "--hidden", "4", "--epochs", "1")
    assert main([*argv, "--quiet"]) == 0
    assert (run / "plots" / "first_layer_filters.png").is_file()
    assert "First-layer filters" in (run / "report.html").read_text()


def test_a_dataset_spec_survives_the_trip_to_the_child(tiny_spec):
    sent = json.loads(json.dumps(registry.spec_to_dict(tiny_spec)))
    assert registry.spec_from_dict(sent) == tiny_spec


def test_the_child_draws_without_jax_or_scipy(run_copy, no_drawing_here):
    """JAX costs the child a second of start-up and its memory: the parent tells it what
    the model family's module would (`describe.MODEL_FACTS`). SciPy (the preprocessing
    of people's images, which the image grids share) costs it a fifth of a second of CPU
    while the run trains."""
    code = "import sys\nfrom jaxmnist.report import background\nbackground.main()\n"
    code += "sys.exit(3 if 'jax' in sys.modules else 4 if 'scipy' in sys.modules else 0)"
    renderer = background.ReportRenderer([sys.executable, "-c", code])
    assert renderer.finish(run_copy).exists()
    assert renderer.proc.returncode == 0


def test_a_child_killed_mid_page_leaves_no_page_and_the_parent_draws_it(run_copy, monkeypatch):
    before = _files(run_copy)
    seen = {}

    def draw_here(path, out=None):
        seen["page"] = (run_copy / "report.html").exists()
        seen["tmp"] = sorted(p.name for p in run_copy.rglob("*.tmp"))
        return write_run_report(path, out)

    monkeypatch.setattr(run_report, "write_run_report", draw_here)
    renderer = background.ReportRenderer([sys.executable, "-c", DIES_MID_PAGE])
    page = renderer.finish(run_copy)
    assert renderer.proc.returncode == -9  # it did die mid-page
    assert seen == {"page": False, "tmp": []}  # nothing that looks like a page, no leftovers
    assert page.read_text().rstrip().endswith("</html>")
    after = _files(run_copy)
    assert {k: after[k] for k in before} == before  # the run's own files untouched


def test_an_error_in_the_child_is_its_one_line_and_exit_code(run_copy, no_drawing_here):
    (run_copy / "metrics.jsonl").write_text('{"epoch": 1, "st')  # a torn write
    before = _files(run_copy)
    with pytest.raises(errors.CorruptRunError, match=r"metrics.jsonl: line 1 is corrupt JSON"):
        background.ReportRenderer().finish(run_copy)
    assert _files(run_copy) == before  # nothing written, nothing lost


def test_a_child_that_hangs_is_killed_and_the_parent_draws_it(run_copy, capsys):
    renderer = background.ReportRenderer(
        [sys.executable, "-c", "import time; time.sleep(60)"], timeout=1
    )
    t0 = time.monotonic()
    page = renderer.finish(run_copy)
    assert time.monotonic() - t0 < 30
    assert renderer.proc.returncode is not None  # killed, not left behind
    assert page.read_text().rstrip().endswith("</html>")
    assert "not drawn within 1 s; drawing it here" in capsys.readouterr().err


def test_a_child_never_told_is_stopped_when_the_renderer_goes(run_copy):
    renderer = background.ReportRenderer()
    proc = renderer.proc
    del renderer  # a run that stopped or failed: finish() is never called
    assert proc.wait(timeout=10) is not None
    assert not (run_copy / "report.html").exists()


def test_train_with_a_failing_child_keeps_the_run_and_exits_1(
    train_argv, tmp_path, monkeypatch, capsys
):
    answer = json.dumps({"error": "cannot write the page", "kind": "WriteError", "exit_code": 1})
    child = f"import sys; sys.stdin.readline(); print({answer!r})"
    monkeypatch.setattr(
        train_command,
        "ReportRenderer",
        lambda: background.ReportRenderer([sys.executable, "-c", child]),
    )
    run = tmp_path / "run"
    assert main(train_argv(run, "--steps", "12")) == 1
    assert {"summary.json", "params.npz", "metrics.jsonl"} <= set(os.listdir(run))
    assert not (run / "report.html").exists()
    assert capsys.readouterr().err.strip().endswith("jaxmnist train: error: cannot write the page")


@pytest.mark.parametrize("spec", [MNIST, FASHION_MNIST], ids=lambda s: s.name)
@pytest.mark.parametrize("accuracy", [0.5, 0.999])
def test_the_fixed_margins_hold_every_label(spec, accuracy):
    """The metric figures' margins are fixed (cheaper to draw than a constrained layout):
    long class names, rotated or not, and accuracy ticks up to 100.0% stay inside."""
    n = len(spec.class_names)
    rng = np.random.default_rng(0)
    confusion = rng.integers(0, 30, (n, n)) + np.diag(np.full(n, round(3000 * accuracy)))
    records = [
        {
            "epoch": e,
            "step": 100 * e,
            "train_loss": 1 / e,
            "test_loss": 1.2 / e,
            "train_accuracy": accuracy + (1 - accuracy) * e / 6,
            "test_accuracy": accuracy,
        }
        for e in range(1, 6)
    ]
    steps = np.arange(1, 501)
    figures = [
        plots.loss_curves(records, steps, 2 / np.sqrt(steps)),
        plots.accuracy_curves(records),
        plots.confusion_matrix(confusion, list(spec.class_names)),
        plots.per_class_accuracy(confusion, list(spec.class_names)),
    ]
    for fig in figures:
        fig.canvas.draw()
        box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
        width, height = fig.get_size_inches()
        assert box.x0 >= 0 and box.y0 >= 0, (fig.axes[0].get_title(), box)
        assert box.x1 <= width and box.y1 <= height, (fig.axes[0].get_title(), box)


# draw_in_two forks, which a process that has loaded JAX must not: run it in a fresh one.
# Each figure takes the seconds argv gives it (the first's, then the others'), and says
# which process drew it.
DRAW_IN_TWO = """\
import json, os, sys, time
from jaxmnist.report import background, plots
parent, fail_in_copy = os.getpid(), sys.argv[1] == "fail"
first, others, copies = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def maker(name, seconds):
    def make():
        if fail_in_copy and os.getpid() != parent:
            raise RuntimeError("the copy fails")
        time.sleep(seconds)
        os.write(2, f"{name} {os.getpid()}\\n".encode())  # one write: the two do not mix
        fig = plots.new_figure(1, 1)
        fig.subplots().plot([0, 1])
        return fig
    return make
pngs = background.draw_in_two(
    {f"f{i}": (maker(f"f{i}", first if i == 0 else others), "alt") for i in range(4)},
    copies,
)
print(json.dumps({"parent": parent, "names": list(pngs),
                  "png": all(p.startswith(b"\\x89PNG") for p in pngs.values())}))
"""


def _draw_in_two(
    how: str, first: float = 0.1, others: float = 0.1, copies: int = 1
) -> tuple[dict, dict, str]:
    """The answer of DRAW_IN_TWO, and which process drew each figure (name -> pid)."""
    done = subprocess.run(
        [sys.executable, "-c", DRAW_IN_TWO, how, str(first), str(others), str(copies)],
        capture_output=True,
        text=True,
        check=True,
    )
    drawn = [line.split() for line in done.stderr.splitlines()]
    drawn = [(w[0], int(w[1])) for w in drawn if len(w) == 2 and w[1].isdigit()]
    drawers = dict(drawn)
    assert len(drawers) == len(drawn), drawn  # none drawn twice
    return json.loads(done.stdout), drawers, done.stderr


def test_draw_in_two_draws_in_two_processes():
    out, drawers, _ = _draw_in_two("ok")
    assert out["names"] == ["f0", "f1", "f2", "f3"] and out["png"]
    assert sorted(drawers) == out["names"]  # each drawn once
    assert len(set(drawers.values())) == 2 and out["parent"] in drawers.values()


def test_draw_in_two_shares_the_figures_as_they_come_not_by_halves():
    # One costly figure first: the other process draws the three cheap ones meanwhile,
    # where a split into halves would have given the first one's process a second.
    out, drawers, _ = _draw_in_two("ok", first=1.5, others=0.05)
    assert sorted(drawers) == sorted(out["names"])
    slow = drawers["f0"]
    assert [n for n, pid in drawers.items() if pid == slow] == ["f0"], drawers


def test_more_copies_draw_at_once_and_never_more_than_the_figures_ask():
    # Each figure takes long enough that every drawer has one before any is done.
    out, drawers, _ = _draw_in_two("ok", first=0.6, others=0.6, copies=3)
    assert sorted(drawers) == out["names"] and out["png"]
    assert len(set(drawers.values())) == 4 and out["parent"] in drawers.values()
    out, drawers, _ = _draw_in_two("ok", first=0.6, others=0.6, copies=10)
    assert sorted(drawers) == out["names"] and len(set(drawers.values())) == 4


def test_many_copies_that_fail_leave_every_figure_to_this_process():
    out, drawers, err = _draw_in_two("fail", copies=3)
    assert out["names"] == ["f0", "f1", "f2", "f3"] and out["png"]
    assert err.count("RuntimeError: the copy fails") >= 1
    assert drawers == {name: out["parent"] for name in out["names"]}


def test_draw_in_two_draws_here_what_its_copy_failed_to():
    out, drawers, err = _draw_in_two("fail")
    assert out["names"] == ["f0", "f1", "f2", "f3"] and out["png"]
    assert "RuntimeError: the copy fails" in err  # its traceback, then drawn here
    assert drawers == {name: out["parent"] for name in out["names"]}


def test_the_curves_draw_each_splits_own_figures():
    """Each line of the loss and accuracy curves carries its own split's values (a
    validation curve drawing the test figures passed a check of its label alone)."""
    from jaxmnist.report import plots

    records = [
        {"epoch": e, "step": 10 * e, "train_loss": 1.0 / e, "train_accuracy": 0.5 + e / 100,
         "test_loss": 0.9 / e, "test_accuracy": 0.6 + e / 100, "val_loss": 0.8 / e,
         "val_accuracy": 0.7 + e / 100, "ensemble_test_accuracy": 0.65 + e / 100,
         "ensemble_val_accuracy": 0.75 + e / 100}
        for e in (1, 2, 3)
    ]  # fmt: skip

    def lines(fig) -> dict:
        return {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].get_lines()}

    acc = lines(plots.accuracy_curves(records))
    for label, key in [("train", "train_accuracy"), ("test", "test_accuracy"),
                       ("validation", "val_accuracy"), ("test, ensemble", "ensemble_test_accuracy"),
                       ("validation, ensemble", "ensemble_val_accuracy")]:  # fmt: skip
        assert acc[label] == pytest.approx([100 * r[key] for r in records]), label
    steps = np.arange(1, 31)
    loss = lines(plots.loss_curves(records, steps, 1.0 / steps))
    assert loss["test"] == pytest.approx([r["test_loss"] for r in records])
    assert loss["validation"] == pytest.approx([r["val_loss"] for r in records])
