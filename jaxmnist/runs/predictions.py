"""test_predictions.npz: the model's test-set probabilities, saved with every run.

A report needs the model's predictions and a few test images (one per class, the
first 25, the most confident mistakes). Saving them when training ends means
`jaxmnist report` and `jaxmnist compare` need neither the parameters re-run nor
the dataset at hand: a run directory copied off a TPU VM reports on a laptop.

    probs          float32 (N, C)   softmax probabilities, test set in file order
    labels         uint8   (N,)     true classes
    sample_index   int32   (K,)     test indices whose images are kept
    sample_images  uint8   (K, H, W), or (K, H, W, C) for images of several channels
    predicted_by   str     ()       whose probabilities: "the ensemble of 8 members", "seed 0"
                                    (absent in runs saved before it was kept: the first seed's)

This module does not import matplotlib: training calls it.
"""

from __future__ import annotations

import io
import os
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from jaxmnist.errors import JaxmnistError
from jaxmnist.runs import rundir

PREDICTIONS_FILE = "test_predictions.npz"
GRID_SIZE = 25  # the 5x5 prediction grid: the first 25 test images
MAX_MISTAKES = 20  # most confident mistakes kept for the report


class Predictions(NamedTuple):
    probs: np.ndarray  # float32 (N, C)
    labels: np.ndarray  # uint8 (N,)
    sample_index: np.ndarray  # int32 (K,), sorted, unique
    sample_images: np.ndarray  # uint8 (K, H, W) or (K, H, W, C)
    predicted_by: str = ""  # whose probabilities, in words; "" when the file does not say

    @property
    def predicted(self) -> np.ndarray:
        """int64 (N,): argmax class."""
        return self.probs.argmax(-1)

    def images(self, index) -> np.ndarray:
        """uint8 (len(index), H, W) or (len(index), H, W, C) images of test examples `index`
        (all must be sampled)."""
        pos = np.searchsorted(self.sample_index, index)
        return self.sample_images[pos]


def confident_mistakes(
    probs: np.ndarray, labels: np.ndarray, limit: int = MAX_MISTAKES
) -> np.ndarray:
    """Indices of the wrongly classified examples, most confident (highest max prob) first."""
    predicted = probs.argmax(-1)
    wrong = np.flatnonzero(predicted != labels)
    confidence = probs[wrong, predicted[wrong]]
    order = np.argsort(-confidence, kind="stable")
    return wrong[order[:limit]]


def class_examples(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Index of the first example of each class present (one per class, in class order)."""
    return np.array(
        [np.flatnonzero(labels == c)[0] for c in range(num_classes) if np.any(labels == c)],
        dtype=np.int64,
    )


def sample_indices(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The test examples whose images a report shows: sorted unique int32 (K,)."""
    keep = np.concatenate(
        [
            class_examples(labels, probs.shape[1]),
            np.arange(min(GRID_SIZE, len(labels))),
            confident_mistakes(probs, labels),
        ]
    )
    return np.unique(keep).astype(np.int32)


def save_test_predictions(
    run_dir: str | os.PathLike, probs, labels, images, predicted_by: str = ""
) -> Path:
    """Writes test_predictions.npz into `run_dir` atomically; returns its path.

    probs: float (N, C); labels: int (N,); images: uint8 (N, H, W), (N, H, W, C), or
    (N, H*W) square images, of which only the sampled ones are kept; `predicted_by`:
    whose probabilities they are, in words.
    """
    probs = np.asarray(probs, np.float32)
    labels = np.asarray(labels).astype(np.uint8)
    images = np.asarray(images)
    if images.ndim == 2:  # flat: assume square
        side = round(images.shape[1] ** 0.5)
        images = images.reshape(len(images), side, side)
    index = sample_indices(probs, labels)
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        probs=probs,
        labels=labels,
        sample_index=index,
        sample_images=np.asarray(images[index], np.uint8),
        predicted_by=np.array(predicted_by),
    )
    path = Path(run_dir) / PREDICTIONS_FILE
    rundir.atomic_write(path, buf.getvalue())
    return path


def load_test_predictions(run_dir: str | os.PathLike) -> Predictions:
    """Reads and checks test_predictions.npz; JaxmnistError (one line) if missing or corrupt."""
    path = Path(run_dir) / PREDICTIONS_FILE
    if not path.exists():
        raise JaxmnistError(
            f"{path}: missing (the run predates reports or did not finish; "
            "train it again to get one)"
        )
    try:  # from bytes: np.load leaks its file handle when the zip is bad
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as f:
            arrays = {k: f[k] for k in ("probs", "labels", "sample_index", "sample_images")}
            who = f["predicted_by"] if "predicted_by" in f.files else np.array("")
    except KeyError as e:
        raise JaxmnistError(f"{path}: corrupt (no array {e})") from None
    except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError) as e:
        raise JaxmnistError(f"{path}: corrupt ({type(e).__name__}: {e})") from None
    p = Predictions(**arrays)
    n = len(p.labels)
    ok = (
        p.probs.ndim == 2
        and p.probs.shape[0] == n
        and n > 0
        and p.probs.dtype.kind == "f"
        and p.labels.ndim == 1
        and p.sample_images.ndim in (3, 4)
        and p.sample_index.shape == (len(p.sample_images),)
        and np.all(np.diff(p.sample_index) > 0)
        and (len(p.sample_index) == 0 or (p.sample_index[0] >= 0 and p.sample_index[-1] < n))
        and np.all(p.labels < p.probs.shape[1])
        and np.all(np.isfinite(p.probs))
    )
    if not ok or who.shape != () or who.dtype.kind != "U":
        raise JaxmnistError(f"{path}: corrupt (arrays of inconsistent shapes or values)")
    if not np.isin(sample_indices(p.probs, p.labels), p.sample_index).all():
        raise JaxmnistError(f"{path}: corrupt (the sampled images are not the ones a report shows)")
    return Predictions(
        p.probs.astype(np.float32),
        p.labels,
        p.sample_index.astype(np.int64),
        p.sample_images,
        str(who),
    )
