"""The validation split: training examples held out to choose by (`data.validation`).

A run with `data.validation=N` takes N examples out of the training set before anything
else sees it: it trains on the rest (so an epoch has fewer steps: `config.plan_steps`
counts the rest), evaluates the N after every epoch as `val_*` beside `test_*`, and
draws the training-set evaluation's subset (`train.eval_train_examples`) from the rest.
The N are stratified by class and drawn from `VALIDATION_SEED` with the same rule as
that subset (`evaluate.subset_indices`), so every run, seed, sweep point, resume and
`jaxmnist eval` with the same N holds out the same examples; the run records the seed
(`validation_seed`). Sweeps and searches rank by the validation split, so that the
test set is never used to choose.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxmnist.data import formats
from jaxmnist.training.evaluate import subset_indices

# The validation draw's seed. Another seed than the training subset's (SUBSET_SEED), so
# that the two draws are not alike; recorded in every run that holds examples out.
VALIDATION_SEED = 1


class TrainingSplit(NamedTuple):
    """A training set with its validation examples taken out."""

    images: np.ndarray  # uint8 (N - n, H, W[, C]), read-only, aligned: the examples trained on
    labels: np.ndarray  # uint8 (N - n,)
    val_indices: np.ndarray | None  # int64 (n,) ascending, into the full training set; None: n=0


def validation_indices(labels: np.ndarray, n: int) -> np.ndarray | None:
    """The `n` validation examples of a training set whose labels are `labels` (int, (N,)):
    int64 (n,) ascending indices, stratified by class; None when `n` is 0."""
    return subset_indices(labels, n, VALIDATION_SEED) if n else None


def split_training_set(images: np.ndarray, labels: np.ndarray, n: int) -> TrainingSplit:
    """Takes the `n` validation examples (`validation_indices`) out of a training set
    (images (N, ...), labels (N,)); with `n` 0 the arrays are returned as they are."""
    val = validation_indices(labels, n)
    if val is None:
        return TrainingSplit(images, labels, None)
    keep = np.ones(len(labels), bool)
    keep[val] = False
    return TrainingSplit(formats.aligned(images[keep]), formats.aligned(labels[keep]), val)


def validation_facts(n: int) -> dict:
    """What a run records about its validation split (info, summary): the examples held
    out and the seed that chose them; empty without one."""
    return {"validation_examples": n, "validation_seed": VALIDATION_SEED} if n else {}
