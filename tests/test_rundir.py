"""Run-directory files are replaced whole or not at all (temporary file + rename)."""

import errno
import json

import numpy as np
import pytest

from jaxmnist.errors import WriteError
from jaxmnist.runs import rundir


def names(folder) -> list[str]:
    """Everything in `folder`: a leftover temporary file would show up here."""
    return sorted(p.name for p in folder.iterdir())


def test_successful_write_replaces_the_file(tmp_path):
    path = tmp_path / "summary.json"
    rundir.write_json(path, {"test_accuracy": 0.5})
    with open(path) as reader:  # a reader that opened the old file keeps reading it
        rundir.write_json(path, {"test_accuracy": 0.9, "epochs": 3})
        assert json.load(reader) == {"test_accuracy": 0.5}
    assert json.loads(path.read_text()) == {"test_accuracy": 0.9, "epochs": 3}
    assert names(tmp_path) == ["summary.json"]


@pytest.mark.parametrize("name", ["summary.json", "config.json"])
def test_write_failing_midway_keeps_the_old_file(tmp_path, name):
    path = tmp_path / name
    rundir.write_json(path, {"old": True})
    before = path.read_bytes()

    def half_then_disk_full(f):
        f.write(b'{"new": tr')
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError, match="disk full"):
        rundir.atomic_write(path, half_then_disk_full)
    assert path.read_bytes() == before
    assert names(tmp_path) == [name]


def test_unserialisable_summary_keeps_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    rundir.write_json(path, {"test_accuracy": 0.5})
    with pytest.raises(TypeError):
        rundir.write_json(path, {"test_accuracy": object()})
    assert json.loads(path.read_text()) == {"test_accuracy": 0.5}
    assert names(tmp_path) == ["summary.json"]


def test_interrupted_params_save_keeps_the_old_params(tmp_path, monkeypatch):
    path = tmp_path / rundir.PARAMS_FILE
    old = [{"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)}]
    rundir.save_params(path, old)

    def interrupted_savez(f, **arrays):
        f.write(b"PK\x03\x04 the first bytes of a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.np, "savez", interrupted_savez)
    with pytest.raises(KeyboardInterrupt):
        rundir.save_params(path, [{"w": np.full((3, 2), 7, np.float32), "b": np.ones(2)}])
    monkeypatch.undo()
    loaded = rundir.load_params(path, old)
    np.testing.assert_array_equal(loaded[0]["w"], old[0]["w"])
    assert names(tmp_path) == [rundir.PARAMS_FILE]
