"""Re-evaluating a run directory's models on the test and training sets (`jaxmnist eval`).

The run is read by `runs.reader.open_run` (params.npz, or the newest intact
checkpoint of an unfinished run); every member is evaluated exactly in one
vmapped call per set (`training.evaluate`).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from jaxmnist.runs.reader import Run, open_run
from jaxmnist.training.evaluate import (
    EvalResult,
    PlacedEval,
    compile_evaluate,
    evaluate_stacked,
    place_eval_data,
)


def evaluate_run(run_dir: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> dict:
    """Every member's test and training accuracy and loss, as JSON-ready values.

    The data is looked for in `data_dir`, then where training read it (the run's
    data.json), then where `data.load_dataset` looks. A run of several seeds gives
    means, with per-seed lists; the confusion matrix is the first seed's.
    """
    run = open_run(run_dir)
    dataset = run.load_dataset(data_dir)
    batch = run.config.train.eval_batch_size
    params = jax.device_put(run.params)
    sets = {
        "test": (dataset.test_images, dataset.test_labels),
        "train": (dataset.train_images, dataset.train_labels),
    }
    results = {
        name: _evaluate_members(run, params, place_eval_data(x, y, batch))
        for name, (x, y) in sets.items()
    }
    test, train = results["test"], results["train"]
    out = {
        "run_dir": str(run_dir),
        "dataset": dataset.spec.name,
        "test_accuracy": float(np.mean([r.accuracy for r in test])),
        "test_loss": float(np.mean([r.loss for r in test])),
        "num_test_examples": test[0].count,
        "train_accuracy": float(np.mean([r.accuracy for r in train])),
        "train_loss": float(np.mean([r.loss for r in train])),
        # The same figure under the name metrics.jsonl gives it: there `train_loss` is the
        # epoch's mean batch loss, as trained; here both are the full training set's.
        "train_set_loss": float(np.mean([r.loss for r in train])),
        "num_train_examples": train[0].count,
    }
    if run.members > 1:
        out.update(
            seeds=run.seeds,
            test_accuracy_per_seed=[r.accuracy for r in test],
            test_loss_per_seed=[r.loss for r in test],
            train_accuracy_per_seed=[r.accuracy for r in train],
        )
    return {
        **out,
        "class_names": list(dataset.spec.class_names),
        "confusion_matrix": test[0].confusion.tolist(),
        **run.where(),
    }


def _evaluate_members(run: Run, params, data: PlacedEval) -> list[EvalResult]:
    """One result per member; one model runs the very program training evaluated it with
    (not a vmap of one), so eval repeats training's figures exactly."""
    model_cfg, classes = run.config.model, run.spec.num_classes
    if run.members > 1:
        return evaluate_stacked(model_cfg, params, data, classes)
    one = jax.tree.map(lambda x: x[0], params)
    return [compile_evaluate(model_cfg, one, data, classes)(one, data)]
