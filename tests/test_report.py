"""Reports: plots, report.html, comparison pages, and their bad-input errors, on tiny runs."""

import base64
import dataclasses
import json
import os
import re
import shutil
from html.parser import HTMLParser

import jax
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist import pages
from jaxmnist.cli import main
from jaxmnist.models import get_model, model_config
from jaxmnist.report import rundata
from jaxmnist.report.compare import write_comparison
from jaxmnist.report.run_report import write_run_report
from jaxmnist.runs import predictions
from jaxmnist.train import train_and_evaluate
from jaxmnist.training.evaluate import predict_probabilities

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VOID = {"meta", "img", "br", "hr", "input", "link", "source", "wbr", "col", "area", "base"}


def tiny_cfg(**overrides):
    """25 steps of 64 (epochs of 10, 10 and 5 steps) at a low learning rate: about 93 %
    test accuracy on the tiny set, so that there are mistakes to show."""
    cfg = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(
        cfg,
        compile_cache=False,
        train=dataclasses.replace(cfg.train, batch_size=64, steps=25, eval_batch_size=64),
    )
    return config_lib.apply_overrides(cfg, {"optimizer.lr": 1e-4, **overrides})


_RUNS = {}


def tiny_run(tmp_path_factory, dataset, name: str = "a", **overrides):
    """A finished tiny run, trained once per session for each name (the browser tests share
    them)."""
    if name not in _RUNS:
        path = tmp_path_factory.getbasetemp() / "tiny-runs" / name
        train_and_evaluate(tiny_cfg(**overrides), path, dataset=dataset)
        _RUNS[name] = path
    return _RUNS[name]


def other_run(tmp_path_factory, dataset):
    """A second run to compare with: another learning rate and length."""
    return tiny_run(tmp_path_factory, dataset, "b", **{"optimizer.lr": 3e-4, "train.steps": 15})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_dataset):
    return tiny_run(tmp_path_factory, tiny_dataset)


@pytest.fixture
def run_copy(run_dir, tmp_path):
    """A private copy of the tiny run without a report, free to damage."""
    return shutil.copytree(
        run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("report.html", "plots")
    )


class PageParser(HTMLParser):
    """Collects tags, <img> attributes, section ids, and checks that tags balance."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.images, self.ids, self.tags = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.images.append(attrs)
        if tag == "section":
            self.ids.append(attrs.get("id"))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()


def parse_page(text: str) -> PageParser:
    parser = PageParser()
    parser.feed(text)
    parser.close()
    assert not parser.errors, parser.errors[:3]
    assert not parser.stack, f"unclosed tags: {parser.stack}"
    return parser


def check_self_contained(text: str, parser: PageParser) -> None:
    assert text.startswith("<!DOCTYPE html>")
    assert "http://" not in text and "https://" not in text
    assert not {"script", "link", "iframe", "object", "embed"} & set(parser.tags)
    assert re.search(r"url\(", text) is None  # no CSS fetches either
    assert "Content-Security-Policy" in text
    for img in parser.images:
        assert img["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(img["src"].split(",", 1)[1]).startswith(PNG_MAGIC)
        assert img.get("alt", "").strip(), "every image has alt text"
        assert int(img["width"]) > 0 and int(img["height"]) > 0


def test_report_has_every_section_plot_and_table(run_dir):
    page = write_run_report(run_dir)
    assert page == run_dir / "report.html"
    text = page.read_text()
    parser = parse_page(text)
    check_self_contained(text, parser)
    assert parser.ids == [
        "summary",
        "data",
        "training-curves",
        "predictions",
        "most-confident-mistakes",
        "confusion-matrix",
        "per-class-results",
        "per-epoch-metrics",
        "configuration",
    ]
    names = {
        "class_examples",
        "loss_curves",
        "accuracy_curves",
        "predictions",
        "confident_mistakes",
        "confusion_matrix",
        "per_class_accuracy",
    }
    assert {p.stem for p in (run_dir / "plots").glob("*.png")} == names
    assert len(parser.images) == len(names)
    for name in names:
        assert (run_dir / "plots" / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
    for label in (
        "Dataset",
        "Parameters",
        "Optimizer",
        "Epochs and steps",
        "Test accuracy",
        "Test loss",
        "Compile time",
        "Training time",
        "Examples/s",
        "Backend and device",
        "Versions",
        "Command",
        "Precision",
        "Accuracy (recall)",
        "Learning rate",
    ):
        assert f">{label}<" in text, label
    summary = json.loads((run_dir / "summary.json").read_text())
    assert f"{100 * summary['test_accuracy']:.2f}%" in text
    assert text.count("<tr") >= 1 + 3 + 1 + 10 + 1 + 10  # epochs, classes, confusion rows


def test_report_plots_are_deterministic(run_copy):
    write_run_report(run_copy)
    first = {p.name: p.read_bytes() for p in (run_copy / "plots").glob("*.png")}
    html_first = (run_copy / "report.html").read_text()
    write_run_report(run_copy)
    assert first == {p.name: p.read_bytes() for p in (run_copy / "plots").glob("*.png")}
    assert html_first == (run_copy / "report.html").read_text()


def test_predictions_file_matches_the_model(run_dir, tiny_dataset):
    p = predictions.load_test_predictions(run_dir)
    n, c = len(tiny_dataset.test_labels), len(tiny_dataset.spec.class_names)
    assert p.probs.shape == (n, c) and p.probs.dtype == np.float32
    np.testing.assert_allclose(p.probs.sum(1), 1, rtol=1e-5)
    np.testing.assert_array_equal(p.labels, tiny_dataset.test_labels)
    confusion = np.array(json.loads((run_dir / "confusion_matrix.json").read_text())["matrix"])
    np.testing.assert_array_equal(np.diag(confusion).sum(), (p.predicted == p.labels).sum())
    np.testing.assert_array_equal(
        p.images(p.sample_index), tiny_dataset.test_images[p.sample_index]
    )
    wrong = predictions.confident_mistakes(p.probs, p.labels)
    conf = p.probs[wrong, p.predicted[wrong]]
    assert np.all(p.predicted[wrong] != p.labels[wrong]) and np.all(np.diff(conf) <= 0)


def test_predict_probabilities_is_softmax_of_apply():
    cfg = model_config("mlp", hidden=(16,))
    params = get_model("mlp").init(jax.random.key(0), cfg, (28, 28), 10)
    images = np.random.default_rng(0).integers(0, 256, (37, 28, 28), dtype=np.uint8)
    probs = predict_probabilities(cfg, params, images, batch_size=16)  # padded: 3 batches
    logits = get_model("mlp").apply(params, images.astype(np.float32) / 255, cfg)
    assert probs.shape == (37, 10) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, jax.nn.softmax(logits), atol=1e-6)


def test_cli_train_writes_report_and_command(train_argv, tmp_path, capsys):
    run = tmp_path / "run"
    args = train_argv(run, "--steps", "30")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"report: {run / 'report.html'}" in out
    assert (run / "command.txt").read_text().strip() == "jaxmnist " + " ".join(args)
    assert "jaxmnist train --dataset tiny" in (run / "report.html").read_text()

    assert main(["report", str(run), "--out", str(tmp_path / "again.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "again.html")
    assert (tmp_path / "again.html").read_text().startswith("<!DOCTYPE html>")

    assert not (run / "tensorboard").exists()  # only when asked for


def _damage(run, how):
    if how == "no config":
        (run / "config.json").unlink()
    elif how == "no summary":
        (run / "summary.json").unlink()
    elif how == "corrupt config":
        (run / "config.json").write_text("{not json")
    elif how == "config not an object":
        (run / "config.json").write_text("[1, 2]")
    elif how == "corrupt metrics":
        first = (run / "metrics.jsonl").read_text().splitlines()[0]
        (run / "metrics.jsonl").write_text(first + '\n{"epoch": 2, "st')  # a torn write
    elif how == "empty metrics":
        (run / "metrics.jsonl").write_text("")
    elif how == "no step losses":
        (run / "step_loss.csv").unlink()
    elif how == "corrupt step losses":
        (run / "step_loss.csv").write_text("step,loss\n1,abc\n")
    elif how == "corrupt confusion":
        (run / "confusion_matrix.json").write_text('{"class_names": ["a"], "matrix": [[1, 2]]}')
    elif how == "no predictions":
        (run / "test_predictions.npz").unlink()
    elif how == "garbage predictions":
        (run / "test_predictions.npz").write_bytes(b"PK\x03\x04 not really a zip")
    elif how == "truncated predictions":
        data = (run / "test_predictions.npz").read_bytes()
        (run / "test_predictions.npz").write_bytes(data[: len(data) // 2])
    elif how == "predictions of another run":
        p = predictions.load_test_predictions(run)
        predictions.save_test_predictions(
            run, p.probs[:-1], p.labels[:-1], np.zeros((len(p.labels) - 1, 28, 28))
        )
    elif how == "predictions missing an array":
        np.savez(run / "test_predictions.npz", probs=np.ones((3, 10)))
    else:
        raise AssertionError(how)


DAMAGE = {
    "no config": "not a run directory",
    "no summary": "did not finish",
    "corrupt config": "corrupt JSON",
    "config not an object": "corrupt",
    "corrupt metrics": "line 2 is corrupt JSON",
    "empty metrics": "no epochs recorded",
    "no step losses": "missing",
    "corrupt step losses": "corrupt",
    "corrupt confusion": "corrupt",
    "no predictions": "missing",
    "garbage predictions": "corrupt",
    "truncated predictions": "corrupt",
    "predictions of another run": "do not match",
    "predictions missing an array": "corrupt",
}


NOT_A_RUN = {"no config", "no summary"}  # what the user named wrongly: exit 2, as eval does


@pytest.mark.parametrize("how", list(DAMAGE))
def test_report_on_a_damaged_run_is_one_line_and_exit_1(run_copy, how, capsys):
    _damage(run_copy, how)
    assert main(["report", str(run_copy)]) == (2 if how in NOT_A_RUN else 1)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("jaxmnist report: error: ") and DAMAGE[how] in err, err
    assert "Traceback" not in err and not (run_copy / "report.html").exists()


def test_report_on_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"jaxmnist report: error: {tmp_path / 'nowhere'}: no such run directory"


def test_compare_page(run_dir, tiny_dataset, tmp_path_factory, tmp_path, capsys):
    other = other_run(tmp_path_factory, tiny_dataset)
    out = tmp_path / "cmp" / "comparison.html"
    assert main(["compare", str(run_dir), str(other), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == str(out)  # after the accuracies and whether they differ
    acc = {
        name: json.loads((d / "summary.json").read_text())["test_accuracy"]
        for name, d in (("a", run_dir), ("b", other))
    }
    hi, lo = sorted(acc, key=acc.get, reverse=True)  # the higher accuracy first
    assert lines[-2] == f"  {hi} vs {lo}: no test (needs ≥2 seeds per run; {hi} has 1; {lo} has 1)"
    text = out.read_text()
    parser = parse_page(text)
    check_self_contained(text, parser)
    assert parser.ids == [
        "runs",
        "headline",
        "significance",
        "config-differences",
        "curves",
        "full-summaries",
        "per-class-accuracy",
    ]
    assert len(parser.images) == 3
    assert ">optimizer.lr<" in text and ">train.steps<" in text and ">model.hidden<" not in text
    assert 'class="hl"' in text and "best" in text  # differences highlighted, best values marked


@pytest.mark.parametrize(
    "args, message, code",
    [
        (["compare", "{run}"], "at least two run directories", 2),
        (["compare", "{run}", "{tmp}/missing"], "no such run directory", 2),
        (["compare", "{run}", "{run}", "--out", "{tmp}"], "is a directory", 2),
    ],
)
def test_compare_bad_input(run_dir, tmp_path, capsys, args, message, code):
    args = [a.format(run=run_dir, tmp=tmp_path) for a in args]
    assert main(args) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_compare_reads_runs_without_predictions(run_dir, run_copy, tmp_path):
    (run_copy / "test_predictions.npz").unlink()
    assert write_comparison([run_dir, run_copy], tmp_path / "c.html").exists()


def test_data_show(tiny_data_dir, tmp_path, capsys):
    out = tmp_path / "examples.png"
    assert main(["data", "show", "tiny", "--data-dir", str(tiny_data_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert main(["data", "show", "--out", str(out)]) == 2
    assert "--out needs one DATASET" in capsys.readouterr().err


def test_html_helpers_escape_and_highlight():
    table = pages.html_table(
        ["a", "b<"],
        [["<x>", 1.5], [pages.Raw("<i>ok</i>"), "2 %"]],
        highlight={1, (0, 1)},
        best={(1, 1)},
    )
    assert "&lt;x&gt;" in table and "b&lt;" in table and "<i>ok</i>" in table
    assert '<tr class="hl">' in table and 'class="num hl"' in table and 'class="num best"' in table
    page = pages.render_page("T & t", [("One", "<p>1</p>"), ("One", "<p>2</p>")], subtitle="<s>")
    assert (
        'id="one"' in page and 'id="one-2"' in page and "T &amp; t" in page and "&lt;s&gt;" in page
    )
    parse_page(page)
    with pytest.raises(ValueError):
        pages.embed_png(b"GIF89a", "x")
    assert (
        rundata.class_stats(np.array([[2, 0], [1, 0]]))["precision"][1]
        != rundata.class_stats(np.array([[2, 0], [1, 0]]))["precision"][1]
    )  # never predicted: NaN, shown as a dash


def test_report_that_cannot_be_written_is_one_line_and_exit_1(run_copy, small_tmpfs, capsys):
    out = small_tmpfs(64, full=True) / "report.html"
    assert main(["report", str(run_copy), "--out", str(out)]) == 1  # an I/O failure, not 2
    err = capsys.readouterr().err
    expected = f"disk full while writing {out}; free some space there and try again\n"
    assert err == f"jaxmnist report: error: {expected}"
    assert [p.name for p in out.parent.iterdir()] == ["filler"]  # nothing half-written


def test_run_and_report_files_respect_the_umask(run_copy):
    mask = os.umask(0o022)
    os.umask(mask)
    write_run_report(run_copy)
    files = [p for p in run_copy.rglob("*") if p.is_file()]
    assert {"config.json", "summary.json", "params.npz", "report.html"} <= {p.name for p in files}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {
        p.name: oct(0o666 & ~mask) for p in files
    }


def test_compare_page_writes_null_like_the_other_pages(run_dir, run_copy, tmp_path):
    config = json.loads((run_copy / "config.json").read_text())
    config["optimizer"]["grad_clip"] = 1.0  # the other run has null
    (run_copy / "config.json").write_text(json.dumps(config))
    page = write_comparison([run_dir, run_copy], tmp_path / "c.html").read_text()
    row = re.search(r"<tr><t[hd][^>]*>optimizer\.grad_clip</t[hd]>.*?</tr>", page, re.DOTALL).group(
        0
    )
    assert "null" in row and "None" not in row


def test_compare_with_an_emoji_in_a_run_name_draws_without_warnings(run_dir, tmp_path):
    rocket = shutil.copytree(run_dir, tmp_path / "run-\N{ROCKET}")
    # filterwarnings=error: a "Glyph ... missing from font" warning would fail this test.
    page = write_comparison([run_dir, rocket], tmp_path / "c.html").read_text()
    assert "run-\N{ROCKET}" in page  # the page itself keeps the real name


def test_seed_plot_legends_cannot_hide_a_point():
    from jaxmnist.report import spread_plots

    records = [{"epoch": e, "test_accuracy_per_seed": [0.9, 0.95, 0.91]} for e in (1, 2)]
    fig = spread_plots.seed_accuracy(records, [0, 1, 2], [0.9, 0.95, 0.91], (0.88, 0.97))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent(renderer)
        assert not legend.overlaps(ax.get_window_extent(renderer))  # outside the data area


@pytest.mark.parametrize("n", [5, 2048])
def test_seed_plot_ticks_are_whole_epochs_and_readable_seeds(n):
    """One epoch gets the tick 1, not 0.945 ... 1.050; a population larger than
    SEEDS_NAMED names a few seeds evenly spread, first and last included, rather than
    2,048 labels on top of one another."""
    from jaxmnist.report import spread_plots

    rng = np.random.default_rng(0)
    seeds, final = list(range(100, 100 + n)), rng.uniform(0.8, 0.9, n).tolist()
    fig = spread_plots.seed_accuracy(
        [{"epoch": 1, "test_accuracy_per_seed": final}], seeds, final, None
    )
    fig.canvas.draw()
    left, right = fig.axes
    lo, hi = left.get_xlim()
    assert [t for t in left.get_xticks() if lo <= t <= hi] == [1]
    labels = [t.get_text() for t in right.get_xticklabels()]
    if n <= spread_plots.SEEDS_NAMED:
        assert labels == [str(s) for s in seeds]
    else:
        assert len(labels) <= 10 and labels[0] == "100" and labels[-1] == str(seeds[-1])
        assert all(label in map(str, seeds) for label in labels)


def test_eval_prints_class_names_in_full(capsys):
    from jaxmnist.commands.evaluate import format_confusion
    from jaxmnist.data import get_spec

    names = get_spec("fashion_mnist").class_names
    text = format_confusion(np.eye(10, dtype=int), names)
    assert "T-shirt/top" in text and "Ankle boot" in text
    header = text.splitlines()[0].split()
    assert header[-2:] == ["Ankle", "boot"] and "T-shirt/top" in header


@pytest.fixture
def cnn_run_dir(tiny_cnn_run, tiny_registered, tmp_path):
    """A copy of the shared CNN run of two seeds (6 first-layer channels of 3×3, dense 16),
    free to write a report into."""
    return shutil.copytree(tiny_cnn_run, tmp_path / "cnn-run")


def test_cnn_report_shows_the_first_layer_filters_of_the_first_seed(cnn_run_dir):
    from jaxmnist.report import filters

    text = write_run_report(cnn_run_dir).read_text()
    parser = parse_page(text)
    check_self_contained(text, parser)
    assert parser.ids.index("first-layer-filters") == parser.ids.index("training-curves") + 1
    png = (cnn_run_dir / "plots" / "first_layer_filters.png").read_bytes()
    [img] = [i for i in parser.images if "first convolution layer" in i["alt"]]
    assert img["alt"].startswith("The 6 3×3 kernels of the first convolution layer (seed 0)")
    assert base64.b64decode(img["src"].split(",", 1)[1]) == png  # the same figure, embedded

    config = json.loads((cnn_run_dir / "config.json").read_text())
    kernels = filters.first_layer_filters(cnn_run_dir, config)
    with np.load(cnn_run_dir / "params.npz") as f:
        w = f["['conv'][0]['w']"]
    assert w.shape == (2, 3, 3, 1, 6) and not np.array_equal(w[0], w[1])  # two seeds
    np.testing.assert_array_equal(kernels, np.moveaxis(w[0, :, :, 0, :], -1, 0))

    grid = filters.montage(kernels)  # 6 tiles in one row, one-pixel gaps
    assert grid.shape == (3, 6 * 4 - 1) and np.isfinite(grid).sum() == 6 * 9
    for i in range(6):
        np.testing.assert_array_equal(grid[:, 4 * i : 4 * i + 3], kernels[i])
    image = filters.filter_grid(kernels, "t").axes[0].images[0]
    np.testing.assert_array_equal(image.get_array().filled(np.nan), grid)
    assert image.norm.vmin == -image.norm.vmax == -np.abs(kernels).max()  # centred on 0
    assert image.get_cmap().name.startswith(filters.CMAP)  # diverging


def test_filter_tiles_wrap_after_a_row():
    from jaxmnist.report import filters

    kernels = np.arange(10 * 9, dtype=np.float32).reshape(10, 3, 3) + 1
    grid = filters.montage(kernels, columns=8)
    assert grid.shape == (2 * 4 - 1, 8 * 4 - 1) and np.isfinite(grid).sum() == 10 * 9
    np.testing.assert_array_equal(grid[4:7, 4:7], kernels[9])  # row 1, column 1


def test_mlp_report_has_no_filter_figure(run_dir):
    from jaxmnist.report import filters

    config = json.loads((run_dir / "config.json").read_text())
    assert filters.first_layer_filters(run_dir, config) is None
    text = write_run_report(run_dir).read_text()
    assert not (run_dir / "plots" / "first_layer_filters.png").exists()
    assert "first-layer-filters" not in text and "first convolution layer" not in text


def test_cnn_report_with_damaged_parameters_is_one_line_and_exit_1(
    tiny_cnn_run, tiny_registered, tmp_path, capsys
):
    run = shutil.copytree(tiny_cnn_run, tmp_path / "run")
    (run / "params.npz").write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "params.npz: corrupt" in err
    assert not (tmp_path / "r.html").exists()


def _specificity(selector: str) -> tuple[int, int, int]:
    """(ids, classes and pseudo-classes, elements) of a simple CSS selector."""
    s = re.sub(r"\([^)]*\)", "", selector)  # :nth-child(even) counts once, as a pseudo-class
    ids = s.count("#")
    classes = len(re.findall(r"\.[\w-]+", s)) + len(re.findall(r"(?<!:):[\w-]+", s))
    elements = len(re.findall(r"(?:^|[\s>+~])([a-zA-Z][\w-]*)", s))
    return ids, classes, elements


def test_the_highlight_outranks_the_striping_of_even_rows():
    """The confusion table's "most common mistake" must show on every row: each selector
    that paints a highlighted cell is more specific than the striping of even rows."""
    css = re.sub(r"/\*.*?\*/", "", pages.CSS.replace("\\\n", ""), flags=re.DOTALL)
    rules = re.findall(r"([^{}]+)\{([^}]*)\}", css)
    selectors = lambda want: [
        s.strip() for sel, body in rules if want(sel, body) for s in sel.split(",")
    ]
    stripes = selectors(lambda sel, body: "nth-child(even)" in sel and "background" in body)
    highlights = selectors(lambda sel, body: ".hl" in sel and "background" in body)
    assert stripes and highlights
    weakest = min(_specificity(s) for s in highlights)
    assert weakest > max(_specificity(s) for s in stripes), (highlights, stripes)


def test_a_high_accuracy_runs_axis_has_distinct_tick_labels():
    from jaxmnist.report import plots

    test = [0.9910, 0.9914, 0.9918, 0.9921, 0.9925]
    records = [
        {"epoch": e, "step": 100 * e, "train_accuracy": a + 0.0002, "test_accuracy": a}
        for e, a in enumerate(test, 1)
    ]
    fig = plots.accuracy_curves(records)
    ax = fig.axes[0]
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    labels = [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
