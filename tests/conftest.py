"""Shared fixtures: a tiny learnable dataset, registered under a name the CLI accepts.

(Strict dtype promotion is not turned on: Optax's schedules and Adam mix int32
step counts with float32 internally, which strict mode rejects.)
"""

import atexit
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

# One folder per session for every cache the tests write, set before JAX starts, made by
# the first process to load this file (xdist's controller, before it starts the
# workers; they and the `jaxmnist` processes tests start inherit the environment) and
# removed when it exits:
# - JAX's compilation cache: every test process compiles each distinct program once. Its
#   size limit turns on JAX's file lock, so no process reads an entry another is still
#   writing; each write then scans every entry under that lock, which costs more than
#   it saves for the quickest programs (those under a tenth of a second are compiled
#   again). Every test leaves these settings as they are set here (a fixture below), so
#   the cache holds the programs tests compile alike, not every program.
# - jaxmnist's own cache folder (XDG_CACHE_HOME: its compilation cache, downloads), never
#   the user's ~/.cache/jaxmnist. A run with `compile_cache` on points JAX at <that
#   folder>/xla for the rest of its process, and a user's folder, written without the
#   size limit, lacks the access-time files JAX's size limit then expects beside each
#   entry: every later compile of the process warned, and failed.
if "JAXMNIST_TEST_CACHES" not in os.environ:
    _caches = tempfile.mkdtemp(prefix="jaxmnist-tests-")
    atexit.register(shutil.rmtree, _caches, ignore_errors=True)
    os.environ.update(JAXMNIST_TEST_CACHES=_caches, XDG_CACHE_HOME=os.path.join(_caches, "user"))
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # else the caller's cache, as it is set
    os.environ.update(
        # The folder a run with `compile_cache` on uses: one cache, not two.
        JAX_COMPILATION_CACHE_DIR=os.path.join(
            os.environ["JAXMNIST_TEST_CACHES"], "user", "jaxmnist", "xla"
        ),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        JAX_COMPILATION_CACHE_MAX_SIZE=str(2**40),
    )

import numpy as np  # after the settings above: jaxmnist imports JAX
import pytest


def pytest_configure(config):
    """On an accelerator (the accelerator lane on a TPU or GPU VM): values compared with a
    CPU's or NumPy's are computed at the highest matmul precision, as a CPU computes them
    (a TPU's default multiplies float32 in bfloat16 passes); and the processes tests
    start run on the CPU, since the chip admits one program at a time and this one holds
    it."""
    import jax

    if jax.default_backend() != "cpu":
        jax.config.update("jax_default_matmul_precision", "highest")
        os.environ["JAX_PLATFORMS"] = "cpu"


from jaxmnist.data import registry, synthetic
from jaxmnist.data.dataset import Dataset
from jaxmnist.training import pacing

REAL_DATA_DIR = os.environ.get("JAXMNIST_DATA_DIR")

# tests/multidevice needs 8 fake devices, set before JAX starts: `make test` runs it in
# a pytest process of its own (see tests/multidevice/conftest.py).
collect_ignore = ["run_tiny_cli.py"]
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    collect_ignore.append("multidevice")


def learnable_arrays(train_size=640, test_size=150, seed=0) -> dict[str, np.ndarray]:
    """Class c is a bright 6x6 block at a class-specific place, over uniform noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", train_size), ("test", test_size)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 100, (n, 28, 28)).astype(np.uint8)
        for i, c in enumerate(labels):
            r, col = 2 + 5 * (c // 5) * 2, 2 + 5 * (c % 5)
            images[i, r : r + 6, col : col + 6] = 255
        out[f"{split}_images"], out[f"{split}_labels"] = images, labels
    return out


@pytest.fixture
def arrays():
    """Random (unlearnable) tiny arrays, for the data layer's tests."""
    return synthetic.tiny_arrays()


@pytest.fixture
def spec(arrays):
    return synthetic.tiny_spec(arrays)


@pytest.fixture(scope="session")
def tiny_arrays():
    return learnable_arrays()


@pytest.fixture(scope="session")
def tiny_spec(tiny_arrays):
    return synthetic.tiny_spec(tiny_arrays, name="tiny")


@pytest.fixture(scope="session")
def tiny_dataset(tiny_arrays, tiny_spec) -> Dataset:
    a = tiny_arrays
    return Dataset(
        tiny_spec,
        a["train_images"],
        a["train_labels"],
        a["test_images"],
        a["test_labels"],
        "memory",
    )


_CACHE_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture(autouse=True)
def _persistent_cache_settings_restored():
    """Each test leaves JAX's persistent cache as the session set it. A run with
    `compile_cache` on (the CLI's default) sets the threshold to 0 for the rest of its
    process, so the test process would then write every program it compiles, each write
    a scan of the whole cache under its lock, slower as the session's cache grows (and
    it points the cache at that run's folder, which a process not yet using a cache
    takes for good)."""
    import jax

    saved = {name: getattr(jax.config, name) for name in _CACHE_SETTINGS}
    yield
    changed = {n: v for n, v in saved.items() if getattr(jax.config, n) != v}
    for name, value in changed.items():
        jax.config.update(name, value)
    if "jax_compilation_cache_dir" in changed:
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()  # opened again, in the session's folder, when next used


@pytest.fixture
def paced_by_steps(monkeypatch):
    """Calls of the run loop end only where steps say (the first call's one step,
    `progress_every`, checkpoints, epoch ends), never because the machine is slow:
    for tests that count calls, on a machine other tests may be loading."""
    monkeypatch.setattr(pacing, "TARGET_SECONDS", 1e9)


@pytest.fixture
def train_argv(tiny_data_dir):
    """`jaxmnist train` arguments on the tiny dataset; later flags in `extra` win."""

    def argv(run_dir, *extra):
        return [
            "train",
            "--dataset",
            "tiny",
            "--data-dir",
            str(tiny_data_dir),
            "--run-dir",
            str(run_dir),
            "--batch-size",
            "32",
            "--epochs",
            "3",
            "--no-compile-cache",
            *extra,
        ]

    return argv


@pytest.fixture
def tiny_data_dir(tmp_path, tiny_arrays, tiny_spec, monkeypatch) -> Path:
    """A data folder holding the tiny dataset, registered as dataset `tiny`."""
    monkeypatch.setitem(registry.DATASETS, "tiny", tiny_spec)
    root = tmp_path / "data"
    synthetic.write_idx_folder(root / tiny_spec.folder, tiny_arrays, tiny_spec)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


@pytest.fixture
def small_tmpfs(tmp_path):
    """`mount(kib, full=False)`: a fresh tmpfs of `kib` KiB (a disk that fills up, or is
    remounted read-only even for root), filled to the last byte if `full`; skipped
    where mounting is not allowed (not root)."""
    import subprocess

    mounted = []

    def mount(kib: int, full: bool = False) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
            capture_output=True,
            check=False,
        )
        if done.returncode:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(where)
        if full:
            try:
                with open(where / "filler", "wb") as f:
                    while True:
                        f.write(bytes(4096))
                        f.flush()
            except OSError:  # ENOSPC: full
                pass
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


# Finished runs trained once in the whole session for the tests that only read them (eval,
# predict, export, serve, report, refusals): by the first test process that asks for one,
# while the others (pytest-xdist's workers) wait for it and then read it. A test that
# changes a run works on a copy (`shutil.copytree` into its tmp_path); each process checks
# at its end that every file is still as it was made. `eval` finds the data where training
# found it (data.json), once `tiny` is registered (`tiny_registered`).


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else ""
        for p in sorted(folder.rglob("*"))
    }


def made_once(tmp_path_factory, name: str, make):
    """Yields the folder `name` of the session, made by `make(folder)` if no test process
    has made it yet; then checks that it is still as it was made."""
    import filelock

    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the session's own folder, above each worker's
    folder, made = root / "made-once" / name, root / "made-once" / f"{name}.json"
    folder.parent.mkdir(exist_ok=True)
    with filelock.FileLock(root / "made-once" / f"{name}.lock"):
        if not made.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
            folder.mkdir()
            make(folder)
            made.write_text(json.dumps(_digest(folder)))
    yield folder
    assert _digest(folder) == json.loads(made.read_text()), f"a test changed {folder}"


@pytest.fixture(scope="session")
def tiny_model_run(tmp_path_factory, tiny_dataset):
    """A finished run trained on the tiny set whose config names MNIST, so that any
    process can load its model (predict, export, serve) without the tiny dataset."""
    import dataclasses

    from jaxmnist import config as config_lib
    from jaxmnist.train import train_and_evaluate

    cfg = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(
        cfg,
        compile_cache=False,
        train=dataclasses.replace(cfg.train, batch_size=32, steps=60, eval_batch_size=150),
    )
    yield from made_once(
        tmp_path_factory,
        "tiny-model-run",
        lambda path: train_and_evaluate(cfg, path, dataset=tiny_dataset),
    )


@pytest.fixture(scope="session")
def shared_data_dir(tmp_path_factory, tiny_arrays, tiny_spec):
    """The tiny dataset's folder that the shared runs were trained from."""

    def write(root):
        synthetic.write_idx_folder(root / tiny_spec.folder, tiny_arrays, tiny_spec)

    yield from made_once(tmp_path_factory, "shared-data", write)


@pytest.fixture
def tiny_registered(monkeypatch, tiny_spec):
    """Dataset `tiny` known to the commands, as `tiny_data_dir` makes it, for this test."""
    monkeypatch.setitem(registry.DATASETS, "tiny", tiny_spec)


def _train_shared(tmp_path_factory, data_dir, tiny_spec, name, *extra):
    """`jaxmnist train` on the tiny set (3 epochs of 20 steps, no report), in this process,
    once in the session (`made_once`): yields the run's directory."""
    from jaxmnist.cli import main

    def train(folder):
        run = folder / "run"
        argv = ["train", "--dataset", "tiny", "--data-dir", str(data_dir), "--run-dir", str(run)]
        argv += ["--batch-size", "32", "--epochs", "3", "--no-compile-cache", "--no-report"]
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(registry.DATASETS, "tiny", tiny_spec)
            mp.setenv("XDG_CACHE_HOME", str(folder / "cache"))
            assert main([*argv, "--quiet", *extra]) == 0

    for folder in made_once(tmp_path_factory, name, train):
        yield folder / "run"


@pytest.fixture(scope="session")
def tiny_cli_run(tmp_path_factory, shared_data_dir, tiny_spec):
    """A finished one-model run: the MLP of tpu101."""
    yield from _train_shared(tmp_path_factory, shared_data_dir, tiny_spec, "cli-run")


@pytest.fixture(scope="session")
def tiny_seeds_run(tmp_path_factory, shared_data_dir, tiny_spec):
    """A finished run of three seeds (0-2), 2 epochs, at a learning rate low enough that
    its members make different mistakes, and their ensemble others still; evaluated in
    batches of 64, so that the test set's last batch is padded."""
    extra = ("--seeds", "3", "--epochs", "2", "optimizer.lr=3e-5", "train.eval_batch_size=64")
    yield from _train_shared(tmp_path_factory, shared_data_dir, tiny_spec, "seeds-run", *extra)


@pytest.fixture(scope="session")
def tiny_cnn_run(tmp_path_factory, shared_data_dir, tiny_spec):
    """A finished CNN run of two seeds with batch norm: 6 first-layer channels of 3×3,
    dense 16."""
    extra = ("--model", "cnn", "model.channels=6", "--hidden", "16", "model.batch_norm=true")
    extra += ("--seeds", "2")
    yield from _train_shared(tmp_path_factory, shared_data_dir, tiny_spec, "cnn-run", *extra)


@pytest.fixture(scope="session")
def real_mnist_run(tmp_path_factory):
    """A short real-MNIST run (300 steps, about 94 % test accuracy: enough to read
    drawn digits); skipped, saying why, where no real MNIST is found."""
    import dataclasses

    from jaxmnist import config as config_lib
    from jaxmnist.data import load_dataset
    from jaxmnist.errors import DataError
    from jaxmnist.train import train_and_evaluate

    def train(path):
        try:
            dataset = load_dataset("mnist", download=False)
        except DataError as e:
            (path / "skipped.txt").write_text(f"no real MNIST found (set JAXMNIST_DATA_DIR): {e}")
            return
        cfg = config_lib.get_preset("tpu101")
        cfg = dataclasses.replace(
            cfg,
            compile_cache=False,
            train=dataclasses.replace(cfg.train, steps=300, eval_train=False),
        )
        train_and_evaluate(cfg, path, dataset=dataset)

    for path in made_once(tmp_path_factory, "real-mnist-run", train):
        if (path / "skipped.txt").exists():
            pytest.skip((path / "skipped.txt").read_text())
        yield path


def numpy_mlp_figures(params, images, labels) -> tuple[float, float]:
    """The MLP's (mean cross-entropy, accuracy) in float64 numpy, apart from the evaluator."""
    x = images.reshape(len(images), -1).astype(np.float64) / 255.0
    for layer in params[:-1]:
        x = np.maximum(x @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"]), 0)
    logits = x @ np.asarray(params[-1]["w"], np.float64) + np.asarray(params[-1]["b"])
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    loss = -logp[np.arange(len(labels)), labels].mean()
    return float(loss), float((logits.argmax(1) == labels).mean())
