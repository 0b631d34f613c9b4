"""TensorBoard event files for a run, written with tensorboardX as the run goes.

With `tensorboard=true` in the config (`jaxmnist train --tensorboard`), the run
directory gets a `tensorboard/` folder that `tensorboard --logdir RUN_DIR` (or
`--logdir runs/`, to see every run) reads. Per epoch, at the global step where
the epoch ended: losses, accuracies, learning rate and examples/s; per step: the
training loss; at the end: the confusion matrix and prediction grid as images
and the config as text. The file format is tensorboardX's, not ours.

    loss/train  loss/test  accuracy/train  accuracy/test   per epoch
    learning_rate  examples_per_second  epoch              per epoch
    loss/ensemble_test  accuracy/ensemble_test             per epoch, several seeds
    loss/val  accuracy/val                                 per epoch, with data.validation
    loss/ensemble_val  accuracy/ensemble_val               the same, several seeds
    loss/train_step                                        per step
    confusion_matrix  predictions                          images, last step
    config                                                 text, step 0
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxmnist.errors import ConfigError
from jaxmnist.report import image_grids, plots
from jaxmnist.runs.rundir import STEP_LOSS_FILE
from jaxmnist.training.hooks import Callback, EpochEnd, RunEnd, RunStart

EVENTS_DIR = "tensorboard"

EPOCH_SCALARS = {  # tag -> metrics.jsonl key
    "loss/train": "train_loss",
    "loss/test": "test_loss",
    "accuracy/train": "train_accuracy",
    "accuracy/test": "test_accuracy",
    "learning_rate": "learning_rate",
    "examples_per_second": "examples_per_second",
    "epoch": "epoch",
}
# A run of several seeds only: the ensemble of its members (the mean of their probabilities).
ENSEMBLE_SCALARS = {
    "loss/ensemble_test": "ensemble_test_loss",
    "accuracy/ensemble_test": "ensemble_test_accuracy",
}
# A run that holds out a validation split (data.validation) only; the ensemble's too with
# several seeds.
VAL_SCALARS = {
    "loss/val": "val_loss",
    "accuracy/val": "val_accuracy",
    "loss/ensemble_val": "ensemble_val_loss",
    "accuracy/ensemble_val": "ensemble_val_accuracy",
}


class EventWriter:
    """Writes one run's TensorBoard events under `run_dir/tensorboard/`.

    Old event files there are removed first, so rerunning into the same
    directory does not overlay two runs' curves.
    """

    def __init__(self, run_dir, config: dict | None = None):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ConfigError(
                "tensorboard=true needs the tensorboardX package (pip install tensorboardX)"
            ) from None
        self.path = Path(run_dir) / EVENTS_DIR
        self.path.mkdir(parents=True, exist_ok=True)
        for old in self.path.glob("events.out.tfevents.*"):
            old.unlink()
        self._writer = SummaryWriter(logdir=str(self.path), flush_secs=30)
        if config is not None:
            self._writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def write_epoch(self, record: dict, step_losses: np.ndarray | None = None) -> None:
        """Scalars for one epoch (a metrics.jsonl record) and its per-step losses."""
        step = int(record["step"])
        if step_losses is not None:
            first = step - len(step_losses)
            for i, loss in enumerate(np.asarray(step_losses, np.float64)):
                self._writer.add_scalar("loss/train_step", float(loss), first + i + 1)
        for tag, key in {**EPOCH_SCALARS, **ENSEMBLE_SCALARS, **VAL_SCALARS}.items():
            if record.get(key) is not None:
                self._writer.add_scalar(tag, float(record[key]), step)
        self._writer.flush()  # a crashed run keeps the epochs it finished

    def write_final(
        self,
        step: int,
        confusion: np.ndarray,
        class_names,
        probs: np.ndarray,
        labels: np.ndarray,
        images: np.ndarray,
    ) -> None:
        """The confusion matrix and the first 25 test predictions as images at `step`.

        confusion: int (C, C); probs: float (N, C); labels: int (N,); images: uint8
        (N, H, W) or (N, H*W) square.
        """
        names = list(class_names)
        n = min(25, len(labels))
        grid = np.asarray(images[:n])
        if grid.ndim == 2:
            side = round(grid.shape[1] ** 0.5)
            grid = grid.reshape(n, side, side)
        figures = {
            "confusion_matrix": plots.confusion_matrix(confusion, names),
            "predictions": image_grids.prediction_grid(
                grid, np.asarray(labels[:n]), np.asarray(probs[:n]), names
            ),
        }
        for tag, fig in figures.items():
            self._writer.add_image(tag, plots.to_rgb(fig), int(step), dataformats="HWC")
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Events(Callback):
    """The run loop's callback that writes a run's events with an `EventWriter`.

    The event files start afresh with every run, so a resumed run first writes the
    epochs it continues after again, with their step losses from step_loss.csv.
    """

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        self.writer: EventWriter | None = None

    def on_start(self, start: RunStart) -> None:
        self.writer = EventWriter(self.run_dir, start.cfg.to_dict())
        losses = _step_losses(self.run_dir / STEP_LOSS_FILE)
        first = 0
        for record in start.progress.records:
            self.writer.write_epoch(record, losses[first : record["step"]])
            first = record["step"]

    def on_epoch_end(self, end: EpochEnd) -> None:
        self.writer.write_epoch(end.record, end.step_losses)

    def on_finish(self, end: RunEnd) -> None:
        dataset = end.dataset
        if end.test_probabilities is not None:
            self.writer.write_final(
                end.result.steps,
                # the confusion matrix of the model whose predictions these are
                end.result.test.confusion[0]
                if end.result.ensemble is None
                else end.result.ensemble.confusion,
                dataset.spec.class_names,
                end.test_probabilities,
                dataset.test_labels,
                dataset.test_images,
            )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _step_losses(path: Path) -> np.ndarray:
    """float64 (steps,) from step_loss.csv (rows step,loss with steps 1, 2, ...)."""
    rows = path.read_text().splitlines()[1:] if path.is_file() else []
    return np.array([float(r.split(",")[1]) for r in rows if r], np.float64)
