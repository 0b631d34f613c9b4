"""Reading a finished run directory back for reports, with one clear line per problem.

`load_run(path)` reads every file a report needs (config, environment, summary,
per-epoch metrics, per-step losses, confusion matrix, test predictions, the
command) and checks that they agree with each other, so a report is never drawn
from a half-written or hand-damaged run. Anything wrong is one line
naming the file and what is wrong with it, with the run reader's exit codes
(`runs.reader`): `NotARunError` (exit 2) for a path that names no finished run (no
such directory, no config.json, no summary.json yet), `CorruptRunError` (exit 1) for
a damaged file; nothing here needs the dataset or the parameters.
"""

from __future__ import annotations

import itertools
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxmnist.errors import CorruptRunError, NotARunError
from jaxmnist.runs.predictions import Predictions, load_test_predictions
from jaxmnist.runs.rundir import COMMAND_FILE

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class RunData:
    path: Path
    config: dict
    environment: dict
    summary: dict
    records: list[dict]  # metrics.jsonl, one dict per epoch
    steps: np.ndarray  # int64 (S,): step numbers of step_loss.csv
    step_losses: np.ndarray  # float64 (S,)
    class_names: list[str]
    confusion: np.ndarray  # int64 (C, C): rows true class, columns predicted
    predictions: Predictions | None  # None when not asked for
    command: str | None  # None: not recorded (e.g. a library call)
    # int64 (C, C): a run of several seeds, the ensemble of its members; else None.
    ensemble_confusion: np.ndarray | None = None
    # (images uint8, labels): training images as augmentation moved them; else None.
    augmented: tuple | None = None

    @property
    def name(self) -> str:
        return self.path.resolve().name


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptRunError(f"{path}: missing ({what})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptRunError(f"{path}: corrupt JSON ({e})") from None
    except OSError as e:
        raise CorruptRunError(f"{path}: cannot read ({e.strerror or e})") from None


def _require(cond: bool, path: Path, problem: str) -> None:
    if not cond:
        raise CorruptRunError(f"{path}: {problem}")


def _read_records(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise CorruptRunError(f"{path}: missing (per-epoch metrics)") from None
    records = []
    needed = ("epoch", "step", "train_loss", "train_accuracy", "test_loss", "test_accuracy")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorruptRunError(f"{path}: line {i} is corrupt JSON ({e})") from None
        _require(
            isinstance(rec, dict) and all(isinstance(rec.get(k), (int, float)) for k in needed),
            path,
            f"line {i} lacks one of {', '.join(needed)}",
        )
        records.append(rec)
    _require(bool(records), path, "no epochs recorded")
    _require(
        all(a["step"] < b["step"] for a, b in itertools.pairwise(records)),
        path,
        "steps are not increasing",
    )
    return records


def _read_step_losses(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise CorruptRunError(f"{path}: missing (per-step training loss)") from None
    _require(bool(lines) and lines[0].strip() == "step,loss", path, "not a step,loss CSV")
    try:
        rows = [line.split(",") for line in lines[1:] if line.strip()]
        steps = np.array([int(r[0]) for r in rows], np.int64)
        losses = np.array([float(r[1]) for r in rows], np.float64)
    except (ValueError, IndexError):
        raise CorruptRunError(f"{path}: corrupt (a row is not step,loss)") from None
    return steps, losses


def _read_confusion(path: Path) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """(class names, the matrix, the ensemble's matrix or None)."""
    obj = _read_json(path, "test-set confusion matrix")
    try:
        names = [str(n) for n in obj["class_names"]]
        matrix = np.array(obj["matrix"], dtype=np.int64)
        ensemble = obj.get("ensemble_matrix")
        ensemble = None if ensemble is None else np.array(ensemble, dtype=np.int64)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise CorruptRunError(
            f"{path}: corrupt (needs class_names and an integer matrix)"
        ) from None
    _require(
        matrix.shape == (len(names), len(names)) and len(names) > 0 and (matrix >= 0).all(),
        path,
        "corrupt (matrix is not square non-negative counts, one row per class)",
    )
    _require(
        ensemble is None or (ensemble.shape == matrix.shape and (ensemble >= 0).all()),
        path,
        "corrupt (ensemble_matrix is not like matrix)",
    )
    return names, matrix, ensemble


def load_run(run_dir: str | os.PathLike, *, predictions: bool = True) -> RunData:
    """Reads a finished run directory; NotARunError (exit 2) if it is not one, CorruptRunError
    (exit 1) if a file is damaged: one line either way."""
    path = Path(run_dir)
    if not path.is_dir():
        raise NotARunError(f"{path}: no such run directory")
    if not (path / "config.json").exists():
        raise NotARunError(f"{path}: not a run directory (no config.json)")
    config = _read_json(path / "config.json", "the run's config")
    if not (path / "summary.json").exists():
        raise NotARunError(f"{path}: the run did not finish (no summary.json)")
    summary = _read_json(path / "summary.json", "final figures")
    environment = _read_json(path / "environment.json", "versions and devices")
    for name, obj, keys in (
        ("config.json", config, ("data", "model", "optimizer", "train")),
        ("summary.json", summary, ("test_accuracy", "test_loss", "epochs", "steps")),
        ("environment.json", environment, ()),
    ):
        _require(
            isinstance(obj, dict) and all(k in obj for k in keys),
            path / name,
            f"corrupt (expected an object with {', '.join(keys) or 'fields'})",
        )
    records = _read_records(path / "metrics.jsonl")
    steps, losses = _read_step_losses(path / "step_loss.csv")
    class_names, confusion, ensemble = _read_confusion(path / "confusion_matrix.json")
    preds = load_test_predictions(path) if predictions else None
    if preds is not None:
        _require(
            preds.probs.shape[1] == len(class_names),
            path / "test_predictions.npz",
            f"has {preds.probs.shape[1]} classes, confusion_matrix.json {len(class_names)}",
        )
        counts = np.bincount(preds.labels, minlength=len(class_names))
        _require(
            np.array_equal(counts, confusion.sum(1)),
            path / "test_predictions.npz",
            "labels do not match confusion_matrix.json (files from different runs?)",
        )
    command = None
    if (path / COMMAND_FILE).exists():
        command = (path / COMMAND_FILE).read_text(errors="replace").strip() or None
    return RunData(
        path,
        config,
        environment,
        summary,
        records,
        steps,
        losses,
        class_names,
        confusion,
        preds,
        command,
        ensemble,
        _read_augmented(path / "augmented_examples.npz"),
    )


def _read_augmented(path: Path) -> tuple | None:
    """(images, labels) of augmented_examples.npz, or None where the run has none; a
    damaged file is a CorruptRunError, not a missing section."""
    if not path.exists():
        return None
    try:
        with np.load(path) as f:
            images, labels = f["images"], f["labels"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise CorruptRunError(f"{path}: corrupt ({e})") from None
    _require(images.dtype == np.uint8 and len(images) == len(labels), path, "corrupt arrays")
    return images, labels


def class_stats(confusion: np.ndarray) -> dict[str, np.ndarray]:
    """Per-class support, correct, accuracy (= recall), precision and F1, float64 (C,).

    A class never predicted has precision NaN (undefined), shown as a dash.
    """
    m = np.asarray(confusion, np.float64)
    support, predicted, correct = m.sum(1), m.sum(0), np.diag(m)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(support > 0, correct / support, np.nan)
        precision = np.where(predicted > 0, correct / predicted, np.nan)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
        f1 = np.where(np.isnan(precision) | np.isnan(recall), np.nan, f1)
    return {
        "support": support,
        "predicted": predicted,
        "correct": correct,
        "recall": recall,
        "precision": precision,
        "f1": f1,
    }
