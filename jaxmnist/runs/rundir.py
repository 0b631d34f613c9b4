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
    test_predictions.npz    test-set probabilities and a few images (jaxmnist.runs.predictions)
    command.txt             the command line, when run from the CLI
    report.html, plots/     the report (jaxmnist.report), unless --no-report
    tensorboard/            TensorBoard events, with tensorboard=true

`writer.RunWriter` writes these as the run goes; `reader.open_run` reads a run back.
Every file is written to a temporary name and renamed into place, so a crashed
or interrupted run never leaves a file that looks complete; the two growing files
(metrics.jsonl, step_loss.csv) gain whole lines only: an append that fails is cut
back to the last whole line. summary.json is written last: its presence marks a
finished run. Files get the umask's permissions, so run directories can be shared.
An OSError while writing becomes a `WriteError`: one line naming the file (exit 1).
`claim` makes the directory and holds its lock for a run: a run refused before it
started leaves no directory it made.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import secrets
import shlex
import shutil
import zipfile
import zlib
from pathlib import Path

import numpy as np

from jaxmnist.errors import ConfigError, JaxmnistError, WriteError

CONFIG_FILE = "config.json"
ENVIRONMENT_FILE = "environment.json"
DATA_FILE = "data.json"
METRICS_FILE = "metrics.jsonl"
STEP_LOSS_FILE = "step_loss.csv"
SUMMARY_FILE = "summary.json"
CONFUSION_FILE = "confusion_matrix.json"
PARAMS_FILE = "params.npz"
COMMAND_FILE = "command.txt"
REPORT_FILE = "report.html"
DIVERGED_FILE = "diverged.json"  # a non-finite loss stopped the run (see `resume`)
AUGMENTED_FILE = "augmented_examples.npz"  # images as augmentation moves them
CHECKPOINT_DIR = "checkpoints"


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
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{str(path)!r} is a file, not a folder; give a folder to write into")
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
    import jax  # here, not at the top: reading a run back (the report) needs no JAX

    flat = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(params)
    }
    atomic_write(path, lambda f: np.savez(f, **flat))


def load_params(path: Path, like):
    """Loads params saved by `save_params` into the structure of `like`."""
    import jax

    try:  # from bytes: np.load leaks its file handle when the zip is bad
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as f:
            stored = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise JaxmnistError(f"{path}: corrupt ({type(e).__name__}: {e})") from None
    leaves = []
    for key, ref in jax.tree_util.tree_leaves_with_path(like):
        name = jax.tree_util.keystr(key)
        if name not in stored or stored[name].shape != ref.shape:
            raise JaxmnistError(
                f"{path}: corrupt (parameter {name} missing or of the wrong shape for this config)"
            )
        leaves.append(stored[name])
    return jax.tree.unflatten(jax.tree.structure(like), leaves)


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
    """A directory that already holds a run is only trained into again with `overwrite`;
    ConfigError (exit 2) without it. Nothing is changed here: the new run's writer
    (`writer.RunWriter`) removes the old run's files, checkpoints too, once it starts."""
    path = Path(workdir)
    if (path / CONFIG_FILE).exists() and not overwrite:
        finished = (path / SUMMARY_FILE).exists()
        what = "a finished run" if finished else "an unfinished run (--resume continues it)"
        raise ConfigError(f"{path} already holds {what}; --overwrite replaces it")


@contextlib.contextmanager
def claim(workdir: str | os.PathLike):
    """Creates `workdir` if needed (`check_writable`) and holds its lock (`lock_run_dir`)
    for the block. If the block fails before the run started (no config.json: the run's
    writer writes it first), the folders this made are removed, so a refused run leaves
    no directory behind; one that was there keeps what it had, and no .lock file that
    this made."""
    path = Path(workdir)
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    lock_made = not (path / LOCK_FILE).exists()
    check_writable(path)
    lock = lock_run_dir(path)
    try:
        yield path
    except BaseException:
        if made and not (path / CONFIG_FILE).exists():
            shutil.rmtree(path, ignore_errors=True)
            for parent in made[1:]:  # only if empty: another run may be starting there
                try:
                    parent.rmdir()
                except OSError:
                    break
        elif lock_made and not (path / CONFIG_FILE).exists():
            # Removed while still held: a process that opened it meanwhile finds it
            # locked (and says so), one that comes later makes a new one.
            (path / LOCK_FILE).unlink(missing_ok=True)
        raise
    finally:
        lock.release()
