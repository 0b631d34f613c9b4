"""The run directory: everything a run leaves behind, and reading it back.

    config.json             the resolved Config
    environment.json        versions, backend, devices
    data.json               the dataset's name, the folder it was read from, its SHA-256s
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
or interrupted run never leaves a file that looks complete; the two growing files
(metrics.jsonl, step_loss.csv) gain whole lines only: an append that fails is cut
back to the last whole line. summary.json is written last: its presence marks a
finished run. Files get the umask's permissions, so run directories can be shared.
An OSError while writing becomes a `WriteError`: one line naming the file (exit 1).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shlex
from pathlib import Path

import jax
import numpy as np

from jaxmnist import runtime
from jaxmnist.errors import ConfigError, JaxmnistError, WriteError

PARAMS_FILE = "params.npz"
COMMAND_FILE = "command.txt"
DATA_FILE = "data.json"


PROBE_NAME_LENGTH = 100
"""Longest path we create inside a run directory, relative to it, with room to spare
(e.g. `tensorboard/events.out.tfevents.<time>.<host>`, `.<name>.<pid>.<token>.tmp`)."""


def atomic_write(path: str | os.PathLike, data) -> None:
    """Writes `data` (bytes, or a function `write(binary_file)`) to `path` atomically.

    The temporary file beside `path` is created with open(..., "x"), so it gets the
    umask's permissions (mkstemp's 0600 would make run directories unreadable to
    others); it is removed on any failure. Raises WriteError on an OSError.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            data(f) if callable(data) else f.write(data)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the directory itself is gone or unwritable: nothing was left there
        if isinstance(e, OSError):
            raise WriteError.from_os_error(e, path) from None
        raise


def append_lines(path: str | os.PathLike, text: str) -> None:
    """Appends `text` (whole lines) to `path`, creating it; all of it or none of it.

    One unbuffered write loop; if it fails part-way (a full disk), the file is cut
    back to its previous length, so it never ends in a cut-off line.
    """
    data = memoryview(text.encode())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as e:
        raise WriteError.from_os_error(e, path) from None
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError as e:
            os.ftruncate(fd, start)  # frees space: works on a full disk
            raise WriteError.from_os_error(e, path) from None
    finally:
        os.close(fd)


def write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=2) + "\n").encode())


def check_writable(workdir: str | os.PathLike) -> Path:
    """Creates `workdir` if needed; ConfigError if it cannot be written.

    Writes and removes a file with a name as long as the longest path a run creates
    there, so a directory path near the system's length limit fails here, with a
    clear message, and not after training.
    """
    path = Path(workdir)
    name = f".jaxmnist-probe-{os.getpid()}-{secrets.token_hex(4)}-"
    probe = path / name.ljust(PROBE_NAME_LENGTH, "x")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "xb"):
            pass
        probe.unlink()
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise ConfigError(
                f"run directory path is too long ({len(str(path.absolute()))} characters): the "
                "files in it would pass the system's limit on path lengths; choose a shorter one"
            ) from None
        raise ConfigError(
            f"run directory {str(path)!r} is not writable: {e.strerror or e}"
        ) from None
    return path


def write_command(workdir: str | os.PathLike, argv: list[str]) -> None:
    """command.txt: the command line that produced the run, shell-quoted."""
    atomic_write(Path(workdir) / COMMAND_FILE, (shlex.join(argv) + "\n").encode())


def save_params(path: Path, params) -> None:
    """One array per leaf, keyed by its pytree path (e.g. `[0]['w']`)."""
    flat = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(params)
    }
    atomic_write(path, lambda f: np.savez(f, **flat))


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
            DATA_FILE,
            "summary.json",
            "test_predictions.npz",
            "report.html",
        ):
            try:
                (self.path / name).unlink(missing_ok=True)
            except OSError as e:
                raise WriteError.from_os_error(e, self.path / name) from None

    def write_start(self, cfg, info: dict) -> None:
        write_json(self.path / "config.json", cfg.to_dict())
        write_json(self.path / "environment.json", {**runtime.environment(), **info})
        atomic_write(self.path / "step_loss.csv", b"step,loss\n")

    def write_data(self, dataset) -> None:
        """data.json: where the (verified) data came from, so that `jaxmnist eval` finds
        it again in a shell without the same --data-dir or JAXMNIST_DATA_DIR."""
        folder = dataset.folder
        write_json(
            self.path / DATA_FILE,
            {
                "dataset": dataset.spec.name,
                "folder": None if folder is None else str(Path(folder).absolute()),
                "source": dataset.source,
                "sha256": {f.name: f.sha256 for f in dataset.spec.files},
            },
        )

    def append_metrics(self, record: dict, step_losses: np.ndarray) -> None:
        append_lines(self.path / "metrics.jsonl", json.dumps(record) + "\n")
        first = record["step"] - len(step_losses)
        append_lines(
            self.path / "step_loss.csv",
            "".join(f"{first + i + 1},{loss:.6g}\n" for i, loss in enumerate(step_losses)),
        )

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


def read_data_record(workdir: str | os.PathLike) -> dict | None:
    """data.json of a run (see `RunWriter.write_data`), or None if absent or unreadable."""
    try:
        record = json.loads((Path(workdir) / DATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_run(workdir: str | os.PathLike) -> dict:
    """Reads config.json; JaxmnistError if not a run dir with parameters (params.npz, or
    for an unfinished run a checkpoint)."""
    path = Path(workdir)
    if not path.is_dir():
        raise JaxmnistError(f"{path}: no such run directory")
    try:
        out = {"config": json.loads((path / "config.json").read_text())}
    except FileNotFoundError:
        raise JaxmnistError(f"{path}: not a run directory (no config.json)") from None
    except json.JSONDecodeError as e:
        raise JaxmnistError(f"{path / 'config.json'}: corrupt JSON ({e})") from None
    if not (path / PARAMS_FILE).exists() and not any((path / "checkpoints").glob("[0-9]*")):
        raise JaxmnistError(f"{path}: run has no {PARAMS_FILE} and no checkpoint (did it finish?)")
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
