"""report.html for one run: a summary, every plot, and the per-epoch and per-class tables.

`write_run_report(run_dir)` reads the run back (`rundata.load_run`), draws the
figures, saves each as a PNG under `plots/` in the run directory, and writes
`report.html` with the same figures embedded, so that the page can be mailed
or opened from disk anywhere. Sections: summary, data (one image per class),
training curves, first-layer filters (CNN runs), predictions, most confident
mistakes, confusion matrix (plot and counts), per-class results, per-epoch
metrics, configuration. A run of
several seeds adds a seeds section (mean ± std, 95% confidence interval, each
seed's accuracy and curve) and its ensemble's confusion matrix; the other sections show
means over the seeds, the predictions and most confident mistakes are the ensemble's
(`predicted_by` in test_predictions.npz; the first seed's in runs saved before it was
kept), and the confusion matrix is the first seed's. A run with a target accuracy says
when (or whether) it was reached.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from jaxmnist import pages
from jaxmnist.errors import WriteError
from jaxmnist.profiling.breakdown import read_profile
from jaxmnist.profiling.section import profile_section
from jaxmnist.report import filters, image_grids, plots, spread_plots
from jaxmnist.report.describe import DASH, dataset_title, flatten, num, pct, secs, summary_rows
from jaxmnist.report.rundata import REPORT_FILE, RunData, class_stats, load_run
from jaxmnist.runs import rundir
from jaxmnist.runs.predictions import GRID_SIZE, class_examples, confident_mistakes

PLOTS_DIR = "plots"
CURVES_NOTE = (
    "Train and test on the same axes: a test curve that turns up while the training curve "
    "keeps falling means over-fitting; both still improving at the end means more training "
    "would help. Faint: the loss of each step's batch."
)

FILTERS_NOTE = (
    "Each tile is the kernel one output channel of the first convolution applies to the "
    "pixels, channel 0 top left, row by row, all on one colour scale centred on 0. Strokes "
    "and edges mean the layer learnt detectors; speckle means it learnt little. Several "
    "seeds: the first seed's."
)


def _note(text: str) -> str:
    return f'<p class="note">{pages.esc(text)}</p>'


def epoch_table(run: RunData) -> str:
    header = [
        "Epoch",
        "Step",
        "Train loss",
        "Train acc.",
        "Test loss",
        "Test acc.",
        "Learning rate",
        "Time",
        "Examples/s",
    ]
    val = all("val_accuracy" in r for r in run.records)  # a validation split held out
    if val:
        header[4:4] = ["Val. loss", "Val. acc."]
    rows = [
        [
            r["epoch"],
            f"{r['step']:,}",
            num(r["train_loss"]),
            pct(r["train_accuracy"]),
            *([num(r["val_loss"]), pct(r["val_accuracy"])] if val else []),
            num(r["test_loss"]),
            pct(r["test_accuracy"]),
            num(r.get("learning_rate"), ".3g"),
            secs(r.get("epoch_seconds")),
            num(r.get("examples_per_second"), ",.0f"),
        ]
        for r in run.records
    ]
    best = int(np.argmax([r["test_accuracy"] for r in run.records]))
    return pages.html_table(header, rows, highlight={best}) + _note(
        "Highlighted: the epoch with the best test accuracy "
        f"({pct(run.records[best]['test_accuracy'])}). "
        "Time is the compiled epoch alone; evaluation is timed apart."
    )


def class_table(run: RunData) -> str:
    st = class_stats(run.confusion)
    off = run.confusion.copy()
    np.fill_diagonal(off, 0)
    overall = np.trace(run.confusion) / max(run.confusion.sum(), 1)
    header = [
        "Class",
        "Test examples",
        "Correct",
        "Accuracy (recall)",
        "Precision",
        "F1",
        "Most often mistaken for",
    ]
    rows, below = [], set()
    for i, name in enumerate(run.class_names):
        j = int(off[i].argmax())
        confused = f"{run.class_names[j]} ({off[i, j]:,})" if off[i, j] > 0 else DASH
        rows.append(
            [
                name,
                f"{int(st['support'][i]):,}",
                f"{int(st['correct'][i]):,}",
                pct(st["recall"][i]),
                pct(st["precision"][i]),
                num(st["f1"][i]),
                confused,
            ]
        )
        if st["recall"][i] < overall:
            below.add(i)
    return pages.html_table(header, rows, highlight=below) + _note(
        f"Highlighted: classes below the overall accuracy ({pct(overall)}). Precision: of the "
        "examples predicted as the class, the share that are; a class never predicted has none."
    )


def confusion_table(run: RunData) -> str:
    m = run.confusion
    rows = [[name, *(f"{int(v):,}" for v in m[i])] for i, name in enumerate(run.class_names)]
    off = m.copy()
    np.fill_diagonal(off, -1)
    worst = {(i, int(off[i].argmax()) + 1) for i in range(len(m)) if off[i].max() > 0}
    diag = {(i, i + 1) for i in range(len(m))}
    return pages.html_table(
        ["true \\ predicted", *run.class_names], rows, highlight=worst, best=diag
    ) + _note(
        "Counts; rows are the true class. Bold: right; "
        "highlighted: each class's most common mistake."
    )


def predicted_by(run: RunData) -> str:
    """Whose predictions the report's grids show, in words: as the run saved them, or for
    runs saved before that was kept, the model or the first seed."""
    said = run.predictions.predicted_by if run.predictions is not None else ""
    if said:
        return said
    seeds = run.summary.get("seeds")
    return f"seed {seeds[0]}" if seeds else "the model"


def figure_makers(run: RunData) -> dict[str, tuple[Callable[[], Figure], str]]:
    """name -> (a function that builds the figure, alt text) for every figure of the
    report, in the page's order; nothing is drawn yet."""
    dataset = dataset_title(run.summary.get("dataset", ""))
    full_train = run.config.get("train", {}).get("eval_train", True)
    subset = "train_eval_subset_seed" in run.summary and run.summary["train_eval_examples"]
    figs = {
        "loss_curves": (
            lambda: plots.loss_curves(run.records, run.steps, run.step_losses),
            "Training and test loss against step and epoch",
        ),
        "accuracy_curves": (
            lambda: plots.accuracy_curves(
                run.records,
                f"train (subset of {subset:,})"
                if subset
                else "train (full set)"
                if full_train
                else "train (batches)",
            ),
            "Training and test accuracy after each epoch",
        ),
        "confusion_matrix": (
            lambda: plots.confusion_matrix(run.confusion, run.class_names),
            "Confusion matrix as percentages of each true class",
        ),
        "per_class_accuracy": (
            lambda: plots.per_class_accuracy(run.confusion, run.class_names),
            "Test accuracy of each class as horizontal bars",
        ),
    }
    s = run.summary
    if run.ensemble_confusion is not None:
        figs["ensemble_confusion_matrix"] = (
            lambda: plots.confusion_matrix(run.ensemble_confusion, run.class_names),
            "The ensemble's confusion matrix as percentages of each true class",
        )
    if "seeds" in s and all("test_accuracy_per_seed" in r for r in run.records):
        figs["seed_accuracy"] = (
            lambda: spread_plots.seed_accuracy(
                run.records, s["seeds"], s["test_accuracy_per_seed"], s.get("test_accuracy_ci95")
            ),
            (
                "Test accuracy of every seed per epoch, "
                "and each seed's final accuracy with the mean and its 95% CI"
            ),
        )
    kernels = filters.first_layer_filters(run.path, run.config)
    if kernels is not None:
        c, k, _ = kernels.shape
        seed = s["seeds"][0] if "seeds" in s else run.config.get("train", {}).get("seed", 0)
        figs["first_layer_filters"] = (
            lambda: filters.filter_grid(
                kernels, f"First convolution layer: {c} filters of {k}×{k}"
            ),
            (
                f"The {c} {k}×{k} kernels of the first convolution layer (seed {seed}), one "
                "tile per output channel: blue negative, red positive, white zero"
            ),
        )
    if run.augmented is not None:
        moved, moved_labels = run.augmented
        figs["augmented"] = (
            lambda: image_grids.class_examples(
                moved,
                moved_labels,
                run.class_names,
                "Training images: as stored (top row), then two random moves of each",
                cols=len(moved) // 3,
            ),
            "A training image of each class as stored, then as augmentation moved it twice",
        )
    p = run.predictions
    if p is not None:
        idx = class_examples(p.labels, len(run.class_names))
        figs["class_examples"] = (
            lambda: image_grids.class_examples(
                p.images(idx),
                p.labels[idx],
                run.class_names,
                f"{dataset}: one test image per class",
            ),
            f"One test image of each class of {dataset}, titled with its class name",
        )
        grid = np.arange(min(GRID_SIZE, len(p.labels)))
        who = predicted_by(run)
        figs["predictions"] = (
            lambda: image_grids.prediction_grid(
                p.images(grid),
                p.labels[grid],
                p.probs[grid],
                run.class_names,
                f"Predicted by {who}",
            ),
            (
                f"The first {len(grid)} test images with the class {who} predicted and the "
                "true class; green when right, red when wrong"
            ),
        )
        wrong = confident_mistakes(p.probs, p.labels)
        if len(wrong):
            figs["confident_mistakes"] = (
                lambda: image_grids.confident_mistakes(
                    p.images(wrong),
                    p.labels[wrong],
                    p.probs[wrong],
                    run.class_names,
                    f"Mistakes of {who}",
                ),
                f"The {len(wrong)} test images {who} got wrong with the highest confidence",
            )
    return figs


def build_figures(
    run: RunData, draw: Callable[[dict], dict[str, bytes]] | None = None
) -> dict[str, tuple[bytes, str]]:
    """name -> (PNG bytes, alt text) for every figure of the report.

    draw: {name: (maker, alt)} -> {name: PNG bytes}, e.g. on several cores
    (`background.draw_in_two`); by default, one after the other here.
    """
    makers = figure_makers(run)
    pngs = draw(makers) if draw else {n: plots.to_png(make()) for n, (make, _) in makers.items()}
    return {name: (pngs[name], alt) for name, (_, alt) in makers.items()}


def accuracy_text(s: dict) -> str:
    """Test accuracy, with ± std over seeds when there are several."""
    if s.get("test_accuracy_std") is None:
        return pct(s.get("test_accuracy"))
    return f"{pct(s.get('test_accuracy'))} ± {100 * s['test_accuracy_std']:.2f}%"


def seeds_section(run: RunData, figs) -> str:
    """Mean, spread and interval of test accuracy over seeds, and every seed's figures."""
    s = run.summary
    ci = s.get("test_accuracy_ci95")
    cards = pages.cards(
        [
            ("Seeds", f"{len(s['seeds'])} ({s['seeds'][0]}–{s['seeds'][-1]})"),
            ("Mean ± std", accuracy_text(s)),
            ("95% CI of the mean", f"{100 * ci[0]:.2f}–{100 * ci[1]:.2f}%" if ci else DASH),
            ("Min – max", f"{pct(s.get('test_accuracy_min'))} – {pct(s.get('test_accuracy_max'))}"),
            *(
                [(f"Ensemble of {len(s['seeds'])}", pct(s["ensemble_test_accuracy"]))]
                if "ensemble_test_accuracy" in s
                else []
            ),
        ]
    )
    mean = s["test_accuracy"]
    rows = [
        [seed, pct(acc), num(loss), pct(train)]
        for seed, acc, loss, train in zip(
            s["seeds"],
            s["test_accuracy_per_seed"],
            s["test_loss_per_seed"],
            s["train_accuracy_per_seed"],
        )
    ]
    below = {i for i, a in enumerate(s["test_accuracy_per_seed"]) if a < mean}
    table = pages.html_table(
        ["Seed", "Test accuracy", "Test loss", "Train accuracy"], rows, highlight=below
    )
    note = _note(
        f"{len(s['seeds'])} models with independent initialisation and shuffling, "
        "trained in one vmapped program. Highlighted: seeds below the mean. "
        "The interval is the mean ± t(0.975, n − 1) · s / √n (Student's t). "
        "Elsewhere on this page, figures are means over the seeds; the predictions and "
        f"mistakes are {predicted_by(run)}'s, the confusion matrix seed {s['seeds'][0]}'s; "
        "examples/s counts every model's examples."
        + (
            " The ensemble averages the seeds' softmax probabilities: its test accuracy is "
            "dashed in the accuracy curves, and its confusion matrix follows the first seed's."
            if "ensemble_test_accuracy" in s
            else ""
        )
    )
    fig = pages.figure(*figs["seed_accuracy"]) if "seed_accuracy" in figs else ""
    return cards + fig + table + note


def target_table(s: dict) -> str:
    of = "mean test accuracy" if "seeds" in s else "test accuracy"
    if s["target_reached"]:
        rows = [
            ["Target", f"{pct(s['target_accuracy'])} {of}"],
            [
                "Reached after",
                f"epoch {s['epochs_to_target']} of {s['epochs_planned']} (the run stopped there)",
            ],
            [
                "Time to target",
                f"{secs(s['time_to_target_seconds'])} training (compile and evaluation excluded)",
            ],
            ["With compile", secs(s["time_to_target_with_compile_seconds"])],
        ]
    else:
        rows = [
            ["Target", f"{pct(s['target_accuracy'])} {of}"],
            [
                "Reached",
                (
                    f"no: {pct(s['test_accuracy'])} after all "
                    f"{s['epochs']} epoch{'s' * (s['epochs'] != 1)}"
                ),
            ],
        ]
    return pages.html_table(["", ""], rows, kv=True)


def render_run_report(run: RunData, figs: dict[str, tuple[bytes, str]]) -> str:
    """The report page for `run` with `figs` (from `build_figures`) embedded."""
    s = run.summary

    def fig(name: str, caption: str = "") -> str:
        return pages.figure(*figs[name], caption)

    headline = pages.cards(
        [
            (
                "Test accuracy" + (f" ({len(s['seeds'])} seeds)" if "seeds" in s else ""),
                accuracy_text(s),
            ),
            ("Test loss", num(s.get("test_loss"))),
            *(
                [("Validation accuracy", f"{pct(s['val_accuracy'])} of {s['num_val_examples']:,}")]
                if "val_accuracy" in s  # data.validation: held-out training examples
                else []
            ),
            ("Training time", secs(s.get("train_seconds"))),
            ("Examples/s", num(s.get("examples_per_second"), ",.0f")),
            ("Parameters", f"{s.get('num_params', 0):,}"),
        ]
    )
    summary = pages.html_table(["", ""], [[k, v] for k, v, _ in summary_rows(run)], kv=True)
    sections = [("Summary", headline + summary)]
    if "seeds" in s:
        sections.append(("Seeds", seeds_section(run, figs)))
    if "target_accuracy" in s:
        sections.append(("Time to accuracy", target_table(s)))
    if "class_examples" in figs:
        sections.append(("Data", fig("class_examples", "The first test image of each class.")))
    if "augmented" in figs:
        moves = _note("Drawn from the run's seed; training draws new moves every step.")
        sections.append(("Augmentation", fig("augmented") + moves))
    curves = pages.figure_grid([fig("loss_curves"), fig("accuracy_curves")])
    sections.append(("Training curves", curves + _note(CURVES_NOTE)))
    if "first_layer_filters" in figs:
        sections.append(("First-layer filters", fig("first_layer_filters") + _note(FILTERS_NOTE)))
    if "predictions" in figs:
        sections.append(
            (
                "Predictions",
                fig(
                    "predictions",
                    f"The first test images, predicted by {predicted_by(run)}. "
                    "Green: right; red: wrong.",
                ),
            )
        )
        mistakes = (
            fig(
                "confident_mistakes",
                "Predicted class with its probability; true class with the "
                "probability the model gave it.",
            )
            if "confident_mistakes" in figs
            else "<p>No mistakes on the test set.</p>"
        )
        sections.append(("Most confident mistakes", mistakes))
    sections.append(("Confusion matrix", fig("confusion_matrix") + confusion_table(run)))
    if "ensemble_confusion_matrix" in figs:
        caption = f"The ensemble of the {len(s['seeds'])} seeds: the mean of their probabilities."
        sections.append(("Ensemble confusion matrix", fig("ensemble_confusion_matrix", caption)))
    sections.append(("Per-class results", fig("per_class_accuracy") + class_table(run)))
    sections.append(("Per-epoch metrics", epoch_table(run)))
    if (profile := read_profile(run.path)) is not None:  # `train --profile-steps N`
        sections.append(profile_section(profile))
    config = [[k, json.dumps(v)] for k, v in flatten(run.config).items()]
    sections.append(("Configuration", pages.html_table(["", ""], config, kv=True)))
    subtitle = (
        f"{dataset_title(s.get('dataset', ''))} · {accuracy_text(s)} test accuracy · "
        f"{run.path.resolve()}"
    )
    return pages.render_page(f"jaxmnist run {run.name}", sections, subtitle)


def write_run_report(
    run_dir: str | os.PathLike, out: str | os.PathLike | None = None, draw=None
) -> Path:
    """Writes plots/*.png and report.html (or `out`) for the run in `run_dir`; returns the
    page's path. draw: as for `build_figures`.

    Raises JaxmnistError (one line) if `run_dir` is not a finished run or a file
    is damaged, WriteError if a file cannot be written.
    """
    run = load_run(run_dir)
    figs = build_figures(run, draw)
    page = Path(out) if out is not None else run.path / REPORT_FILE
    try:
        plot_dir = run.path / PLOTS_DIR
        plot_dir.mkdir(exist_ok=True)
        for stale in plot_dir.glob("*.png"):
            if stale.stem not in figs:
                stale.unlink()
        for name, (png, _) in figs.items():
            write_atomic(plot_dir / f"{name}.png", png)
        write_atomic(page, render_run_report(run, figs).encode("utf-8"))
    except OSError as e:
        raise WriteError.from_os_error(e, e.filename or page) from None
    return page


def write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to a temporary name beside `path`, then renames it into place;
    WriteError (one line, exit 1) if it cannot."""
    rundir.atomic_write(path, data)
