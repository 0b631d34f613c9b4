"""The run directory as a run-loop callback: its files written as the run goes.

`RunWriter` writes config.json, environment.json, data.json, command.txt and the
header of step_loss.csv when the run starts, a line of metrics.jsonl and the epoch's
step losses after every epoch, and test_predictions.npz, confusion_matrix.json,
params.npz and summary.json (last: it marks a finished run) when it finishes
(`rundir` lists the files and how each is written safely). Nothing is written or
removed before the run starts (`on_start`): a run refused while it is set up (no
data, too little memory) leaves the directory as it found it.

A new run first removes what an earlier run left in the directory (its checkpoints
too), so nothing of the old run can be taken for the new one's. A resumed run keeps
its files and rewinds metrics.jsonl and step_loss.csv to the checkpoint it continues from
(`RunStart.progress`), so epochs that ran after that checkpoint (and were lost)
are neither duplicated nor missing.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np

from jaxmnist import runtime
from jaxmnist.data.augment import examples
from jaxmnist.errors import WriteError
from jaxmnist.runs import rundir
from jaxmnist.runs.predictions import PREDICTIONS_FILE, save_test_predictions
from jaxmnist.training.hooks import Callback, EpochEnd, RunEnd, RunStart

# What a finished run adds; none of it may survive into a run that replaces or extends it.
RESULT_FILES = (
    rundir.SUMMARY_FILE,
    PREDICTIONS_FILE,
    rundir.REPORT_FILE,
    rundir.DIVERGED_FILE,
)
# What a new run writes as it goes, besides config.json and environment.json.
PROGRESS_FILES = (
    rundir.METRICS_FILE,
    rundir.STEP_LOSS_FILE,
    rundir.DATA_FILE,
    rundir.AUGMENTED_FILE,
)
# A run's final arrays: a new run removes them at once, a resumed one replaces them at its end.
FINAL_FILES = (rundir.PARAMS_FILE, rundir.CONFUSION_FILE)


class RunWriter(Callback):
    """Writes one run's directory (see the module doc); `resuming`: continue its files;
    `command`: the command line, for command.txt."""

    def __init__(
        self, workdir: str | os.PathLike, resuming: bool = False, command: list[str] | None = None
    ):
        self.path = rundir.check_writable(workdir)
        self.resuming, self.command = resuming, command
        self._augmented: concurrent.futures.Future | None = None

    def _remove_stale(self) -> None:
        stale = RESULT_FILES if self.resuming else (*RESULT_FILES, *PROGRESS_FILES, *FINAL_FILES)
        for name in stale:
            try:
                (self.path / name).unlink(missing_ok=True)
            except OSError as e:
                raise WriteError.from_os_error(e, self.path / name) from None
        if not self.resuming:  # before the first save (`Checkpointer` makes the folder then)
            shutil.rmtree(self.path / rundir.CHECKPOINT_DIR, ignore_errors=True)

    def on_start(self, start: RunStart) -> None:
        self._remove_stale()
        if self.command is not None:
            rundir.write_command(self.path, self.command)
        rundir.write_json(self.path / rundir.CONFIG_FILE, start.cfg.to_dict())
        env = {**runtime.environment(), **start.info}
        if self.resuming:
            env_path = self.path / rundir.ENVIRONMENT_FILE
            before = json.loads(env_path.read_text()) if env_path.is_file() else {}
            env = {**before, **start.info, "resumed_at_step": start.progress.step}
        rundir.write_json(self.path / rundir.ENVIRONMENT_FILE, env)
        if self.resuming:
            self._rewind(start.progress)
        else:
            rundir.atomic_write(self.path / rundir.STEP_LOSS_FILE, b"step,loss\n")
        if start.dataset is not None:
            self._write_data(start.dataset)
            if start.cfg.data.augment and not (self.path / rundir.AUGMENTED_FILE).exists():
                # Its small program compiles beside the run's own, not before it.
                pool = concurrent.futures.ThreadPoolExecutor(1)
                self._augmented = pool.submit(self._write_augmented, start.cfg, start.dataset)
                pool.shutdown(wait=False)

    def on_epoch_end(self, end: EpochEnd) -> None:
        rundir.append_lines(self.path / rundir.METRICS_FILE, json.dumps(end.record) + "\n")
        first = end.record["step"] - len(end.step_losses)
        rows = (f"{first + i + 1},{loss:.6g}\n" for i, loss in enumerate(end.step_losses))
        rundir.append_lines(self.path / rundir.STEP_LOSS_FILE, "".join(rows))

    def on_finish(self, end: RunEnd) -> None:
        if self._augmented is not None:
            self._augmented.result()  # the report reads it; its error is the run's
        dataset, summary, test = end.dataset, end.summary, end.result.test
        if end.test_probabilities is not None:
            save_test_predictions(
                self.path,
                end.test_probabilities,
                dataset.test_labels,
                dataset.test_images,
                end.predicted_by,
            )
        matrices = {"matrix": test.confusion[0].tolist()}
        several = len(test.confusion) > 1
        if several:  # the first member's above, as the predictions are; then every member's
            matrices.update(seed=summary["seeds"][0], matrix_per_seed=test.confusion.tolist())
        if end.result.ensemble is not None:  # the mean of every member's probabilities
            matrices["ensemble_matrix"] = end.result.ensemble.confusion.tolist()
        rundir.write_json(
            self.path / rundir.CONFUSION_FILE,
            {
                "class_names": list(dataset.spec.class_names),
                "rows": "true class",
                "columns": "predicted class",
                **matrices,
            },
        )
        params = end.params if several else _first(end.params)
        rundir.save_params(self.path / rundir.PARAMS_FILE, params)
        rundir.write_json(self.path / rundir.SUMMARY_FILE, summary)

    def _write_data(self, dataset) -> None:
        """data.json: where the (verified) data came from, so that `jaxmnist eval` finds
        it again in a shell without the same --data-dir or JAXMNIST_DATA_DIR."""
        folder = dataset.folder
        rundir.write_json(
            self.path / rundir.DATA_FILE,
            {
                "dataset": dataset.spec.name,
                "folder": None if folder is None else str(Path(folder).absolute()),
                "source": dataset.source,
                "sha256": {f.name: f.sha256 for f in dataset.spec.files},
            },
        )

    def _write_augmented(self, cfg, dataset) -> None:
        """augmented_examples.npz: a training image of each class and two of its random
        moves, drawn from the run's seed, for the report (which imports no jax)."""
        images, labels = examples(
            dataset.train_images, dataset.train_labels, cfg.data, cfg.train.seed
        )
        buf = io.BytesIO()
        np.savez(buf, images=images, labels=labels)
        rundir.atomic_write(self.path / rundir.AUGMENTED_FILE, buf.getvalue())

    def _rewind(self, progress) -> None:
        """metrics.jsonl and step_loss.csv exactly as they were at the restored checkpoint."""
        lines = "".join(json.dumps(r) + "\n" for r in progress.records)
        rundir.atomic_write(self.path / rundir.METRICS_FILE, lines.encode())
        csv = self.path / rundir.STEP_LOSS_FILE
        rows = csv.read_text().splitlines()[1:] if csv.is_file() else []
        last = progress.step - progress.epoch_step  # its last whole epoch
        kept = [r for r in rows if r and int(r.split(",")[0]) <= last]
        rundir.atomic_write(csv, ("step,loss\n" + "".join(r + "\n" for r in kept)).encode())


def _first(params):
    """The first member's parameters, from parameters stacked along a member axis."""
    return jax.tree.map(lambda x: np.asarray(x)[0], params)
