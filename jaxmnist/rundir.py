"""The run directory: everything a run leaves behind, and reading it back.

    config.json             the resolved Config
    environment.json        versions, backend, devices
    metrics.jsonl           one JSON object per epoch (several seeds: means, plus per-seed lists)
    step_loss.csv           training loss of every step
    summary.json            final figures and timings
    confusion_matrix.json   test-set confusion matrix with class names
    params.npz              final parameters, one array per pytree path (several seeds:
                            stacked along a leading seed axis)
    test_predictions.npz    test-set probabilities and a few images (jaxmnist.report.predictions)
    command.txt             the command line, when run from the CLI
    report.html, plots/     the report (jaxmnist.report), unless --no-report
    tensorboard/            TensorBoard events, with tensorboard=true

Every file is written to a temporary name and renamed into place, so a crashed
or interrupted run never leaves a file that looks complete. summary.json is
written last: its presence marks a finished run.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path

import jax
import numpy as np

from jaxmnist import runtime
from jaxmnist.errors import ConfigError, JaxmnistError

PARAMS_FILE = "params.npz"
COMMAND_FILE = "command.txt"


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: Path, obj) -> None:
    _atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def check_writable(workdir: str | os.PathLike) -> Path:
    """Creates `workdir` if needed; ConfigError if it cannot be written."""
    path = Path(workdir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(
            f"run directory {str(path)!r} is not writable: {e.strerror or e}"
        ) from None
    return path


def write_command(workdir: str | os.PathLike, argv: list[str]) -> None:
    """command.txt: the command line that produced the run, shell-quoted."""
    _atomic_write(
        Path(workdir) / COMMAND_FILE, lambda f: f.write((shlex.join(argv) + "\n").encode())
    )


def save_params(path: Path, params) -> None:
    """One array per leaf, keyed by its pytree path (e.g. `[0]['w']`)."""
    flat = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(params)
    }
    _atomic_write(path, lambda f: np.savez(f, **flat))


def load_params(path: Path, like):
    """Loads params saved by `save_params` into the structure of `like`."""
    try:
        with np.load(path, allow_pickle=False) as f:
            stored = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise JaxmnistError(f"{path}: cannot read parameters ({e})") from None
    leaves = []
    for key, ref in jax.tree_util.tree_leaves_with_path(like):
        name = jax.tree_util.keystr(key)
        if name not in stored or stored[name].shape != ref.shape:
            raise JaxmnistError(
                f"{path}: parameter {name} missing or of the wrong shape for this config"
            )
        leaves.append(stored[name])
    return jax.tree.unflatten(jax.tree.structure(like), leaves)


class RunWriter:
    """Writes one run's directory as the run goes."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = check_writable(workdir)
        for name in (
            "metrics.jsonl",
            "step_loss.csv",
            "summary.json",
            "test_predictions.npz",
            "report.html",
        ):
            (self.path / name).unlink(missing_ok=True)

    def write_start(self, cfg, info: dict) -> None:
        write_json(self.path / "config.json", cfg.to_dict())
        write_json(self.path / "environment.json", {**runtime.environment(), **info})
        with open(self.path / "step_loss.csv", "w") as f:
            f.write("step,loss\n")

    def append_metrics(self, record: dict, step_losses: np.ndarray) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        first = record["step"] - len(step_losses)
        with open(self.path / "step_loss.csv", "a") as f:
            f.writelines(f"{first + i + 1},{loss:.6g}\n" for i, loss in enumerate(step_losses))

    def write_end(
        self,
        summary: dict,
        confusion: np.ndarray,
        params,
        class_names,
        confusion_per_seed: np.ndarray | None = None,
    ) -> None:
        """With several seeds, `confusion` and the predictions are the first seed's;
        `confusion_per_seed` (S, C, C) adds every seed's as `matrix_per_seed`."""
        matrices = {"matrix": confusion.tolist()}
        if confusion_per_seed is not None:
            matrices.update(seed=summary["seeds"][0], matrix_per_seed=confusion_per_seed.tolist())
        write_json(
            self.path / "confusion_matrix.json",
            {
                "class_names": list(class_names),
                "rows": "true class",
                "columns": "predicted class",
                **matrices,
            },
        )
        save_params(self.path / PARAMS_FILE, params)
        write_json(self.path / "summary.json", summary)


def read_run(workdir: str | os.PathLike) -> dict:
    """Reads config.json (and summary.json if present); JaxmnistError if not a run dir."""
    path = Path(workdir)
    if not path.is_dir():
        raise JaxmnistError(f"{path}: no such run directory")
    try:
        out = {"config": json.loads((path / "config.json").read_text())}
    except FileNotFoundError:
        raise JaxmnistError(f"{path}: not a run directory (no config.json)") from None
    except json.JSONDecodeError as e:
        raise JaxmnistError(f"{path / 'config.json'}: corrupt JSON ({e})") from None
    if not (path / PARAMS_FILE).exists():
        raise JaxmnistError(f"{path}: run has no {PARAMS_FILE} (did it finish?)")
    return out


LOCK_FILE = ".lock"


def lock_run_dir(workdir: str | os.PathLike):
    """Holds `workdir/.lock` until `.release()` or the process ends (an OS lock: a killed
    process leaves nothing behind); ConfigError at once if another process holds it."""
    import filelock

    lock = filelock.FileLock(Path(workdir) / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise ConfigError(
            f"run directory {str(workdir)!r} is in use by another jaxmnist process"
        ) from None
    return lock


def check_reusable(workdir: str | os.PathLike, overwrite: bool) -> None:
    """A directory that already holds a run is only trained into again with `overwrite`
    (then its checkpoints go too); ConfigError (exit 2) without it, nothing changed."""
    path = Path(workdir)
    if not (path / "config.json").exists():
        return
    if not overwrite:
        finished = (path / "summary.json").exists()
        what = "a finished run" if finished else "an unfinished run (--resume continues it)"
        raise ConfigError(f"{path} already holds {what}; --overwrite replaces it")
    import shutil

    shutil.rmtree(path / "checkpoints", ignore_errors=True)
    (path / "diverged.json").unlink(missing_ok=True)
