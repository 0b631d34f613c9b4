"""Re-evaluating a run directory's models on the test and training sets (`jaxmnist eval`).

The run is read by `runs.reader.open_run` (params.npz, or the newest intact
checkpoint of an unfinished run); every member is evaluated exactly in one
vmapped call per set (`training.evaluate`), and for a run of several, in the same
call, the ensemble of its members on the test set and the validation split (the mean
of their softmax probabilities), as training evaluated it, unless `member` picks one
of them (`use.members.choose_member`).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist.models.family import validate_common
from jaxmnist.runs.reader import Run, open_run
from jaxmnist.training.evaluate import (
    ENSEMBLE_SETS,
    SUBSET_SEED,
    EvalResult,
    PlacedEval,
    compile_evaluate,
    evaluate_stacked,
    place_eval_data,
    stacked_program,
    train_eval_indices,
)
from jaxmnist.training.validation import VALIDATION_SEED, split_training_set
from jaxmnist.use.chunks import budget, fewest_chunks, program_bytes
from jaxmnist.use.members import choose_member


def evaluate_run(
    run_dir: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    member: str | int | None = None,
    memory_budget_mb: int | None = None,
    tta_shift: int | None = None,
) -> dict:
    """Every member's test and training accuracy and loss, as JSON-ready values.

    The data is looked for in `data_dir`, then where training read it (the run's
    data.json), then where `data.load_dataset` looks. A run of several seeds gives
    means, with per-seed lists, and its ensemble's test accuracy and loss
    (`ensemble_test_accuracy`, `ensemble_test_loss`: the cross-entropy of the mean
    probabilities; `ensemble_val_*` on a validation split); the confusion matrix is the
    ensemble's. `member` (0-based; checked, ConfigError) evaluates that member alone, and
    says which (`member`, `seed`). The training set is evaluated as the run evaluated it
    after each epoch: on its fixed subset when it used one (`train.eval_train_examples`;
    `train_set` says which), else in full. Several members run in as few chunks as fit
    the memory budget (`use.chunks`; `memory_budget_mb` overrides the run's). `tta_shift`
    evaluates with that test-time augmentation (`model.tta_shift`) in place of the run's,
    and says so (`tta_shift` in the result, whichever was used).
    """
    run = open_run(run_dir)
    if tta_shift is not None:
        cfg = config_lib.apply_overrides(run.config, {"model.tta_shift": tta_shift})
        validate_common(cfg.model)
        run = dataclasses.replace(run, config=cfg)
    index = choose_member(member, run.members)
    dataset = run.load_dataset(data_dir)
    batch = run.config.train.eval_batch_size
    ensemble = index is None and run.members > 1
    chosen = (
        run.params if index is None else jax.tree.map(lambda x: x[index : index + 1], run.params)
    )
    params = jax.device_put(chosen)
    # A run that held out a validation split trained on the rest: its training set is that.
    split = split_training_set(
        dataset.train_images, dataset.train_labels, run.config.data.validation
    )
    subset = None
    if run.config.train.eval_train:
        subset = train_eval_indices(run.config.train, split.labels)
    sets = {
        "test": (dataset.test_images, dataset.test_labels, None),
        "train": (split.images, split.labels, subset),
    }
    if split.val_indices is not None:
        sets["val"] = (dataset.train_images, dataset.train_labels, split.val_indices)
    placed = {
        name: place_eval_data(x, y, batch, indices=indices)
        for name, (x, y, indices) in sets.items()
    }
    results, together = {}, {}
    for name, data in placed.items():
        results[name], together[name] = _evaluate_members(
            run, params, data, ensemble and name in ENSEMBLE_SETS, memory_budget_mb
        )
    test, train = results["test"], results["train"]
    out = {
        "run_dir": str(run_dir),
        "dataset": dataset.spec.name,
        "tta_shift": run.config.model.tta_shift,
        "test_accuracy": float(np.mean([r.accuracy for r in test])),
        "test_loss": float(np.mean([r.loss for r in test])),
        "num_test_examples": test[0].count,
        "train_accuracy": float(np.mean([r.accuracy for r in train])),
        "train_loss": float(np.mean([r.loss for r in train])),
        # The same figure under the name metrics.jsonl gives it: there `train_loss` is the
        # epoch's mean batch loss, as trained; here both are the training set's (`train_set`).
        "train_set_loss": float(np.mean([r.loss for r in train])),
        "num_train_examples": train[0].count,
        "train_set": "full training set" if subset is None else f"train subset of {len(subset):,}",
        **({} if subset is None else {"train_eval_subset_seed": SUBSET_SEED}),
    }
    if "val" in results:  # the held-out examples, as the run evaluated them after each epoch
        val = results["val"]
        out.update(
            val_accuracy=float(np.mean([r.accuracy for r in val])),
            val_loss=float(np.mean([r.loss for r in val])),
            num_val_examples=val[0].count,
            validation_seed=VALIDATION_SEED,
        )
    confusion = test[0].confusion
    if ensemble:
        confusion = together["test"].confusion
        out.update(
            seeds=run.seeds,
            test_accuracy_per_seed=[r.accuracy for r in test],
            test_loss_per_seed=[r.loss for r in test],
            train_accuracy_per_seed=[r.accuracy for r in train],
            ensemble_members=run.members,
            ensemble_test_accuracy=together["test"].accuracy,
            ensemble_test_loss=together["test"].loss,
        )
        if "val" in together:
            out.update(
                ensemble_val_accuracy=together["val"].accuracy,
                ensemble_val_loss=together["val"].loss,
            )
    elif run.members > 1:
        out.update(member=index, seed=run.seeds[index], seeds_in_run=run.members)
    return {
        **out,
        "class_names": list(dataset.spec.class_names),
        "confusion_matrix": confusion.tolist(),
        **run.where(),
    }


def _evaluate_members(
    run: Run, params, data: PlacedEval, ensemble: bool, memory_budget_mb: int | None = None
) -> tuple[list[EvalResult], EvalResult | None]:
    """One result per member of `params` (stacked), and with `ensemble` the ensemble's, from
    the same pass, the members in as few chunks as fit the memory budget (`use.chunks`).
    One model runs the very program training evaluated it with (not a vmap of one), so
    eval repeats training's figures exactly."""
    model_cfg, classes = run.config.model, run.spec.num_classes
    size = jax.tree.leaves(params)[0].shape[0]
    if size == 1:
        one = jax.tree.map(lambda x: x[0], params)
        return [compile_evaluate(model_cfg, one, data, classes)(one, data)], None
    stacked = stacked_program(model_cfg, classes, ensemble)
    programs: dict = {}

    def footprint(chunks: int) -> int:
        """The chunk's program's bytes, beside the other members' parameters."""
        each = size // chunks
        chunk = jax.tree.map(lambda x: jax.ShapeDtypeStruct((each, *x.shape[1:]), x.dtype), params)
        programs[chunks] = stacked.lower(chunk, data.arrays).compile()
        others = sum(x.nbytes for x in jax.tree.leaves(params)) * (chunks - 1) // chunks
        return program_bytes(programs[chunks]) + others

    limit, source = budget(run.config, memory_budget_mb)
    chunks = fewest_chunks(size, footprint, limit, source)
    return evaluate_stacked(
        model_cfg, params, data, classes, ensemble, chunks, programs.get(chunks)
    )
