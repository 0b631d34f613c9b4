"""Hostile file systems: read-only and misplaced caches, full disks, long paths, odd HOMEs,
garbage in the compilation cache.

Full and read-only disks are real: a small tmpfs (`small_tmpfs`, skipped where it
cannot be mounted), remounted read-only when needed, which even root cannot write.
"""

import json
import os
import pwd
import random
import subprocess

import jax
import numpy as np
import pytest

from jaxmnist import compile_cache, runtime
from jaxmnist.cli import main
from jaxmnist.data import load_dataset, synthetic
from jaxmnist.data.locate import default_cache_dir
from jaxmnist.errors import WriteError
from jaxmnist.runs import rundir
from jaxmnist.runs.writer import RunWriter
from jaxmnist.training.hooks import EpochEnd, Progress, RunStart


def cache_warnings(caplog):
    return [r for r in caplog.records if r.name == "jaxmnist.compile_cache"]


# --- the compilation cache -------------------------------------------------


def test_compile_cache_path_that_is_a_file_turns_it_off(tmp_path, caplog):
    (tmp_path / "xla").write_text("not a folder")
    before = jax.config.jax_compilation_cache_dir
    assert runtime.enable_compilation_cache(tmp_path / "xla") is None
    [warning] = cache_warnings(caplog)
    assert warning.levelname == "WARNING" and "\n" not in warning.getMessage()
    assert warning.getMessage().startswith(f"compilation cache off: cannot write {tmp_path}/xla")
    assert jax.config.jax_compilation_cache_dir == before


def test_training_goes_on_when_the_cache_is_read_only(
    tiny_data_dir, tiny_arrays, tiny_spec, tmp_path, small_tmpfs, caplog, capsys, monkeypatch
):
    """The data in a read-only cache, the compilation cache there too: train anyway."""
    cache = small_tmpfs(512)
    synthetic.write_idx_folder(cache / "jaxmnist" / tiny_spec.folder, tiny_arrays, tiny_spec)
    subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    argv = ["train", "--dataset", "tiny", "--run-dir", str(tmp_path / "run"), "--epochs", "1"]
    assert main([*argv, "--batch-size", "32", "--no-report"]) == 0
    [warning] = cache_warnings(caplog)
    assert warning.getMessage() == (
        f"compilation cache off: cannot write {cache}/jaxmnist/xla (Read-only file system)"
    )
    assert f"from {cache}/jaxmnist/tiny" in capsys.readouterr().out
    assert main(["data", "download", "tiny", "--cache-dir", str(cache / "jaxmnist")]) == 0


@pytest.fixture
def fresh_compile_cache():
    """Leaves JAX's persistent cache as it found it (off, with its thresholds)."""
    from jax._src import compilation_cache as jax_cache

    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    saved = {n: getattr(jax.config, n) for n in names}
    jax_cache.reset_cache()
    yield jax_cache.reset_cache
    for n, v in saved.items():
        jax.config.update(n, v)
    jax_cache.reset_cache()
    jax.clear_caches()


def programs():
    """Three distinct small programs, compiled (and so cached) when called."""
    x = np.arange(8.0, dtype=np.float32)
    for f in (jax.numpy.sin, jax.numpy.cos, jax.numpy.tanh):
        jax.block_until_ready(jax.jit(lambda v, f=f: f(v) * 3 + 1)(x))


def test_garbage_in_the_compilation_cache_is_removed_once(tmp_path, caplog, fresh_compile_cache):
    path = tmp_path / "xla"
    assert runtime.enable_compilation_cache(path) == path
    programs()
    entries = sorted(path.glob("*-cache"))
    assert len(entries) >= 3
    rng = random.Random(0)
    random_bytes, truncated, flipped = entries[:3]
    random_bytes.write_bytes(rng.randbytes(5000))
    truncated.write_bytes(truncated.read_bytes()[:-7])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    old = entries[0].stat().st_mtime - 3600  # not being written by anyone
    for e in entries:
        os.utime(e, (old, old))

    fresh_compile_cache()  # a new process, as far as JAX's cache is concerned
    jax.clear_caches()
    assert runtime.enable_compilation_cache(path) == path
    [warning] = cache_warnings(caplog)
    assert warning.getMessage() == f"compilation cache: removed 3 unreadable entries from {path}"
    assert not any(p.exists() for p in (random_bytes, truncated, flipped))
    programs()  # a damaged entry would warn here (and filterwarnings=error fails the test)
    caplog.clear()
    fresh_compile_cache()
    assert runtime.enable_compilation_cache(path) == path
    assert cache_warnings(caplog) == []  # warned once, not on every run


def test_checked_entries_are_not_read_again(tmp_path, monkeypatch):
    good = tmp_path / "abc-cache"
    import zlib

    good.write_bytes(zlib.compress(b"\0\0\0\1" + b"program"))
    old = good.stat().st_mtime - 3600
    os.utime(good, (old, old))
    assert compile_cache.remove_bad_entries(tmp_path) == []
    assert json.loads((tmp_path / compile_cache.CHECKED_FILE).read_text()) == {
        "abc-cache": [good.stat().st_size, good.stat().st_mtime_ns]
    }
    monkeypatch.setattr(compile_cache, "_readable", lambda *a: pytest.fail("read again"))
    assert compile_cache.remove_bad_entries(tmp_path) == []


# --- full disks under the run directory ----------------------------------------


def test_appends_never_leave_a_cut_off_line(small_tmpfs):
    disk = small_tmpfs(64)
    run = RunWriter(disk / "run")
    run.on_start(RunStart(_Cfg(), {}, Progress()))
    run.on_epoch_end(_epoch_end({"epoch": 1, "step": 10}, np.linspace(1, 2, 10)))
    with pytest.raises(OSError), open(disk / "filler", "wb") as f:  # fill the disk
        while True:
            f.write(bytes(4096))
            f.flush()
    # metrics.jsonl's line fits in its last page; a thousand step losses do not.
    with pytest.raises(WriteError) as info:
        run.on_epoch_end(_epoch_end({"epoch": 2, "step": 1010}, np.linspace(2, 3, 1000)))
    assert str(info.value).startswith(f"disk full while writing {run.path}/step_loss.csv")
    csv = (run.path / "step_loss.csv").read_text()
    assert csv.endswith("\n") and csv.splitlines()[-1] == "10,2"  # the failed epoch is cut back
    assert all(len(line.split(",")) == 2 for line in csv.splitlines())
    for line in (run.path / "metrics.jsonl").read_text().splitlines():
        json.loads(line)


class _Cfg:
    def to_dict(self):
        return {"config": "x"}


def _epoch_end(record: dict, step_losses) -> EpochEnd:
    """What the run writer reads of an epoch's end: its record and step losses."""
    return EpochEnd(record["epoch"], record["step"], record, step_losses, None, None, [], None)


def test_full_disk_during_a_run_is_one_line_and_exit_1(train_argv, small_tmpfs, capsys):
    run = small_tmpfs(256) / "run"  # room for the small files, not for params.npz
    assert main(train_argv(run, "--no-report", "--epochs", "1")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"jaxmnist train: error: disk full while writing {run}/")
    assert not (run / "summary.json").exists()  # nothing claims the run finished
    # No temporaries (the run directory's lock file aside: it holds no data).
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] in ([], [".lock"])
    lines = (run / "step_loss.csv").read_text().splitlines()
    assert len(lines) == 1 + 640 // 32  # every step, each line whole


# --- long paths, empty HOME, permissions ---------------------------------------


def test_run_dir_path_near_the_limit_fails_up_front(train_argv, tmp_path, capsys):
    run = tmp_path
    while len(str(run)) < 4060:  # PATH_MAX is 4096: room for the folder, not for its files
        run = run / ("d" * min(200, 4060 - len(str(run)) - 1))
    assert main(train_argv(run)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run directory path is too long" in err
    assert list(run.iterdir()) == []  # stopped before anything was written


def test_empty_home_is_treated_as_unset(monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert default_cache_dir() == type(default_cache_dir())(home) / ".cache" / "jaxmnist"


def test_empty_home_still_finds_data_given_explicitly(monkeypatch, tmp_path, arrays, spec):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")
    synthetic.write_idx_folder(tmp_path / spec.folder, arrays, spec)
    assert load_dataset(spec, tmp_path, download=False).source == str(tmp_path / spec.folder)


def umask_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def test_atomic_writes_respect_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        rundir.write_json(tmp_path / "a.json", {"x": 1})
        rundir.append_lines(tmp_path / "b.csv", "1,2\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "b.csv").stat().st_mode & 0o777 == 0o640


def test_run_files_respect_the_umask(train_argv, tmp_path):
    run = tmp_path / "run"
    assert main(train_argv(run, "--epochs", "1", "--no-report")) == 0
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {"config.json", "summary.json", "params.npz", "test_predictions.npz"} <= {
        p.name for p in files
    }
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {
        p.name: oct(umask_mode()) for p in files
    }
