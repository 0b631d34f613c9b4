"""One rule for every command that takes a run directory: exit 2 for what the user named
wrongly (no such directory, a directory that is not a run, a run with nothing to use
yet), exit 1 for a run whose files are damaged; one line on stderr either way."""

import io
import shutil
import struct
import zipfile
import zlib

import jax
import numpy as np
import pytest

from jaxmnist.cli import main

# Every command that reads a run directory; RUN is where the directory goes.
COMMANDS = {
    "eval": ["eval", "RUN"],
    "predict": ["predict", "RUN", "INPUT"],
    "export": ["export", "RUN", "--out", "OUT"],
    "serve": ["serve", "RUN", "--port", "0"],
    "report": ["report", "RUN", "--out", "OUT"],
    "compare": ["compare", "RUN", "GOOD", "--out", "OUT"],
    "resume": ["train", "--resume", "RUN", "--no-compile-cache"],
}
# Those that read the parameters (a finished run's params.npz).
READ_PARAMS = ("eval", "predict", "export", "serve")


@pytest.fixture
def call(tiny_model_run, tmp_path, monkeypatch, capsys):
    """`call(command, run) -> (exit code, stderr)`, never a running server."""
    image = tmp_path / "digit.npy"
    np.save(image, np.zeros((28, 28), np.uint8))

    def call(command: str, run) -> tuple[int, str]:
        if command == "serve":  # needs the serve extra; must fail before it serves
            uvicorn = pytest.importorskip("uvicorn")
            monkeypatch.setattr(uvicorn.Server, "run", lambda *a, **k: pytest.fail("served"))
        subst = {"RUN": str(run), "INPUT": str(image), "OUT": str(tmp_path / "out.file")}
        subst["GOOD"] = str(tiny_model_run)
        code = main([subst.get(a, a) for a in COMMANDS[command]])
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("jaxmnist "), err  # one line, no traceback
        return code, err[0]

    return call


def copy_run(tiny_model_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_model_run, run)
    return run


@pytest.mark.parametrize("command", COMMANDS)
def test_no_such_directory_exits_2(call, command, tmp_path):
    code, err = call(command, tmp_path / "nonexistent")
    assert code == 2 and "no such run directory" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_that_is_not_a_run_exits_2(call, command, tmp_path):
    (tmp_path / "empty").mkdir()
    code, err = call(command, tmp_path / "empty")
    assert code == 2 and "not a run directory" in err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "resume"])  # resume: restarts
def test_a_run_with_nothing_saved_yet_exits_2(call, command, tiny_model_run, tmp_path):
    run = tmp_path / "started"
    run.mkdir()
    shutil.copy(tiny_model_run / "config.json", run)
    code, err = call(command, run)
    assert code == 2 and ("no params.npz" in err or "did not finish" in err), err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_damaged_config_exits_1(call, command, tiny_model_run, tmp_path):
    run = copy_run(tiny_model_run, tmp_path)
    (run / "config.json").write_text('{"data": ')
    code, err = call(command, run)
    assert code == 1 and "config.json" in err


@pytest.mark.parametrize("command", READ_PARAMS)
def test_a_truncated_params_file_exits_1(call, command, tiny_model_run, tmp_path):
    run = copy_run(tiny_model_run, tmp_path)
    data = (run / "params.npz").read_bytes()
    (run / "params.npz").write_bytes(data[: len(data) // 2])
    code, err = call(command, run)
    assert code == 1 and "params.npz: corrupt" in err


def flip_a_weight(path, fix_crc: bool) -> None:
    """Flips a bit inside the first array's values; with `fix_crc`, rewrites the zip
    member's CRC-32 to match (a deliberate edit: no damage the zip can see)."""
    data = bytearray(path.read_bytes())
    first = zipfile.ZipFile(io.BytesIO(bytes(data))).infolist()[0]
    assert first.compress_type == zipfile.ZIP_STORED  # np.savez: values stored as they are
    name_len, extra_len = struct.unpack(
        "<HH", data[first.header_offset + 26 : first.header_offset + 30]
    )
    start = first.header_offset + 30 + name_len + extra_len  # the .npy member's bytes
    data[start + first.file_size - 2] ^= 0x40  # a mantissa bit of the last float32
    if fix_crc:
        crc = struct.pack("<I", zlib.crc32(data[start : start + first.file_size]))
        data[first.header_offset + 14 : first.header_offset + 18] = crc
        central = data.rindex(b"PK\x01\x02", 0, data.rindex(b"PK\x05\x06"))
        while struct.unpack("<I", data[central + 42 : central + 46])[0] != first.header_offset:
            central = data.rindex(b"PK\x01\x02", 0, central)
        data[central + 16 : central + 20] = crc
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("command", READ_PARAMS)
def test_a_flipped_bit_in_params_exits_1(call, command, tiny_model_run, tmp_path):
    """Each zip member carries a CRC-32 that numpy checks as it reads the array to its
    end: a flipped bit (disk or copy damage) is caught without a checksum of our own."""
    run = copy_run(tiny_model_run, tmp_path)
    flip_a_weight(run / "params.npz", fix_crc=False)
    code, err = call(command, run)
    assert code == 1 and "params.npz: corrupt" in err and "CRC" in err


def test_a_deliberate_edit_with_its_crc_is_read_as_it_is(tiny_model_run, tmp_path):
    """A value changed together with its CRC is an edit, not damage; no checksum kept in the
    run could tell it apart either (the editor would rewrite that too): it is read."""
    from jaxmnist.runs.reader import open_run

    run = copy_run(tiny_model_run, tmp_path)
    flip_a_weight(run / "params.npz", fix_crc=True)
    edited = jax.tree.leaves(open_run(run).params)
    before = jax.tree.leaves(open_run(tiny_model_run).params)
    assert sum(not np.array_equal(a, b) for a, b in zip(edited, before)) == 1
