"""Registry facts, the search order, and load/verify/info on local folders (no network)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from jaxmnist.cli import main
from jaxmnist.data import (
    DATASETS,
    DatasetSpec,
    dataset_info,
    default_cache_dir,
    get_spec,
    load_dataset,
    load_dataset_ahead,
    synthetic,
    verify_dataset,
)
from jaxmnist.data.locate import search_path
from jaxmnist.data.registry import ROLES
from jaxmnist.errors import ConfigError, DataError


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Never touch the real cache or a user's JAXMNIST_DATA_DIR."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("JAXMNIST_DATA_DIR", raising=False)


@pytest.fixture
def roots(tmp_path):
    """Keyword arguments that confine the search to tmp_path (and never download)."""
    return {"cache_dir": tmp_path / "cache", "system_root": tmp_path / "system"}


def assert_loaded(ds, arrays):
    for role in ROLES:
        np.testing.assert_array_equal(getattr(ds, role), arrays[role])


# --- registry ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(DATASETS))
def test_registry_specs_are_complete(name):
    spec = DATASETS[name]
    assert get_spec(name) is spec
    assert tuple(f.role for f in spec.files) == ROLES
    assert all(re.fullmatch(r"[0-9a-f]{64}", f.sha256) for f in spec.files)
    assert spec.num_classes == len(spec.class_names) == 10
    assert spec.image_shape == (28, 28) and (spec.train_size, spec.test_size) == (60000, 10000)
    assert spec.sources and all(s.endswith((".npz", "/")) for s in spec.sources)
    hash(spec)  # frozen and hashable: usable as a static argument or dict key


def test_fashion_class_names_and_system_package():
    spec = get_spec("fashion_mnist")
    assert spec.class_names[0] == "T-shirt/top" and spec.class_names[9] == "Ankle boot"
    assert spec.folder == "fashion-mnist" and spec.system_package == "dataset-fashion-mnist"
    assert get_spec("Fashion-MNIST") is spec


def test_mnist_sources_npz_first():
    spec = get_spec("mnist")
    assert (
        spec.sources[0] == "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
    )
    assert spec.npz_name == "mnist.npz" and spec.class_names == tuple("0123456789")


def test_unknown_dataset_is_config_error():
    with pytest.raises(ConfigError, match="unknown dataset 'kmnist'.*mnist, fashion_mnist") as info:
        get_spec("kmnist")
    assert info.value.exit_code == 2


def test_spec_passes_through(spec):
    assert get_spec(spec) is spec and isinstance(spec, DatasetSpec)


# --- search order ------------------------------------------------------------


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "jaxmnist"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "jaxmnist"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "jaxmnist"


@pytest.mark.parametrize("nested", [True, False])
def test_load_from_data_dir(tmp_path, arrays, spec, roots, nested):
    root = tmp_path / "data"
    folder = root / spec.folder if nested else root
    synthetic.write_idx_folder(folder, arrays, spec)
    ds = load_dataset(spec, root, download=False, **roots)
    assert_loaded(ds, arrays)
    assert ds.source == str(folder) and ds.spec is spec


def test_a_dataset_loaded_ahead_is_the_one_loaded_now_and_its_errors_come_with_it(
    tmp_path, arrays, spec, roots
):
    root = tmp_path / "data"
    synthetic.write_idx_folder(root, arrays, spec)
    ahead = load_dataset_ahead(spec, root, download=False, **roots)
    assert_loaded(ahead.result(timeout=30), arrays)
    missing = load_dataset_ahead(spec, tmp_path / "nothing", download=False, **roots)
    with pytest.raises(DataError, match="not found"):
        missing.result(timeout=30)


def test_env_var_is_used_and_data_dir_overrides_it(tmp_path, monkeypatch, arrays, spec, roots):
    synthetic.write_idx_folder(tmp_path / "env" / spec.folder, arrays, spec)
    monkeypatch.setenv("JAXMNIST_DATA_DIR", str(tmp_path / "env"))
    assert load_dataset(spec, download=False, **roots).source == str(tmp_path / "env" / spec.folder)
    synthetic.write_idx_folder(tmp_path / "arg" / spec.folder, arrays, spec, compress=False)
    ds = load_dataset(spec, tmp_path / "arg", download=False, **roots)
    assert ds.source == str(tmp_path / "arg" / spec.folder)


def test_data_dir_alone_is_searched_when_env_is_set_too(tmp_path, monkeypatch, arrays, spec, roots):
    # A good copy where the environment points: an empty --data-dir must not fall back to it.
    env = tmp_path / "env"
    synthetic.write_idx_folder(env / spec.folder, arrays, spec)
    monkeypatch.setenv("JAXMNIST_DATA_DIR", str(env))
    empty = tmp_path / "empty"
    empty.mkdir()
    places = search_path(spec, empty, **roots)
    assert [p.label for p in places] == ["data_dir", "cache", "system"]
    assert not any(p.folder.is_relative_to(env) for p in places)
    with pytest.raises(DataError, match="tiny MNIST not found in") as info:
        load_dataset(spec, empty, download=False, **roots)
    assert str(empty) in str(info.value) and str(env) not in str(info.value)
    with pytest.raises(DataError, match="not found"):
        verify_dataset(spec, empty, **roots)
    assert dataset_info(spec, empty, **roots)["location"] is None
    assert load_dataset(spec, download=False, **roots).source == str(env / spec.folder)


def test_cli_data_dir_overrides_env(tiny_data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAXMNIST_DATA_DIR", str(tiny_data_dir))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["data", "verify", "tiny"]) == 0  # the environment's copy is there and good
    capsys.readouterr()
    for argv in (
        ["data", "verify", "tiny", "--data-dir", str(empty)],
        [
            "train",
            "--dataset",
            "tiny",
            "--data-dir",
            str(empty),
            "--run-dir",
            str(tmp_path / "run"),
            "--no-compile-cache",
            "data.download=false",
        ],
    ):
        assert main(argv) == 1, argv[:2]
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "not found in" in err
        assert str(empty) in err and str(tiny_data_dir) not in err


def test_cache_then_system(tmp_path, arrays, spec, roots):
    synthetic.write_idx_folder(roots["system_root"] / spec.folder, arrays, spec)
    assert load_dataset(spec, download=False, **roots).source == str(
        roots["system_root"] / spec.folder
    )
    synthetic.write_idx_folder(roots["cache_dir"] / spec.folder, arrays, spec)
    assert load_dataset(spec, download=False, **roots).source == str(
        roots["cache_dir"] / spec.folder
    )


def test_npz_only_folder(tmp_path, arrays, spec, roots):
    folder = tmp_path / "data" / spec.folder
    folder.mkdir(parents=True)
    (folder / "mnist.npz").write_bytes(synthetic.npz_bytes(arrays))
    ds = load_dataset(spec, tmp_path / "data", download=False, **roots)
    assert_loaded(ds, arrays)
    assert ds.source == str(folder / "mnist.npz")


def test_corrupt_explicit_file_is_reported_not_skipped(tmp_path, arrays, spec, roots):
    synthetic.write_idx_folder(roots["cache_dir"] / spec.folder, arrays, spec)  # a good copy
    bad = synthetic.write_idx_folder(tmp_path / "data" / spec.folder, arrays, spec)
    (bad / "t10k-labels-idx1-ubyte.gz").write_bytes(b"<html>Not Found</html>")
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz: looks like an HTML"):
        load_dataset(spec, tmp_path / "data", download=False, **roots)


def test_incomplete_explicit_folder_is_an_error(tmp_path, arrays, spec, roots):
    folder = synthetic.write_idx_folder(tmp_path / "data" / spec.folder, arrays, spec)
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(
        DataError, match="has some tiny MNIST files but not train-labels-idx1-ubyte"
    ):
        load_dataset(spec, tmp_path / "data", download=False, **roots)


def test_incomplete_cache_is_skipped(arrays, spec, roots):
    cache = synthetic.write_idx_folder(roots["cache_dir"] / spec.folder, arrays, spec)
    (cache / "train-labels-idx1-ubyte.gz").unlink()
    synthetic.write_idx_folder(roots["system_root"] / spec.folder, arrays, spec)
    assert load_dataset(spec, download=False, **roots).source == str(
        roots["system_root"] / spec.folder
    )


def test_corrupt_cache_names_the_fix(arrays, spec, roots):
    cache = synthetic.write_idx_folder(roots["cache_dir"] / spec.folder, arrays, spec)
    (cache / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(DataError, match="jaxmnist data download tiny"):
        load_dataset(spec, download=False, **roots)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_not_found_offline_message(tmp_path, roots, name):
    with pytest.raises(DataError) as info:
        load_dataset(name, tmp_path / "nothing", download=False, **roots)
    msg = str(info.value)
    assert "\n" not in msg and info.value.exit_code == 1
    assert str(roots["cache_dir"]) in msg and str(roots["system_root"]) in msg
    assert "--data-dir" in msg and "JAXMNIST_DATA_DIR" in msg and "jaxmnist data download" in msg
    assert ("apt-get install dataset-fashion-mnist" in msg) == (name == "fashion_mnist")


# --- verify and info ---------------------------------------------------------


def test_verify_reports_every_file(tmp_path, arrays, spec, roots):
    folder = synthetic.write_idx_folder(tmp_path / "data" / spec.folder, arrays, spec)
    (folder / "mnist.npz").write_bytes(synthetic.npz_bytes(arrays))
    reports = verify_dataset(spec, tmp_path / "data", **roots)
    assert len(reports) == 8
    assert [r.sha256 for r in reports] == [f.sha256 for f in spec.files] * 2
    assert {r.member for r in reports} == {None, "x_train", "y_train", "x_test", "y_test"}
    assert reports[0].path == folder / "train-images-idx3-ubyte.gz"


def test_verify_raises_on_bad_npz_next_to_good_idx(tmp_path, arrays, spec, roots):
    folder = synthetic.write_idx_folder(tmp_path / "data" / spec.folder, arrays, spec)
    (folder / "mnist.npz").write_bytes(b"PK\x03\x04truncated")
    with pytest.raises(DataError, match="mnist.npz: corrupt npz"):
        verify_dataset(spec, tmp_path / "data", **roots)


def test_verify_without_data_raises(tmp_path, spec, roots):
    with pytest.raises(DataError, match="not found"):
        verify_dataset(spec, **roots)


def test_dataset_info(tmp_path, arrays, spec, roots):
    info = dataset_info("mnist", **roots)
    json.dumps(info)
    assert info["location"] is None and "downloaded" in info["problem"]
    assert info["num_classes"] == 10 and info["files"]["train-images-idx3-ubyte"].startswith(
        "ba8910"
    )
    assert [p["place"] for p in info["search_path"]] == ["cache", "system"]
    folder = synthetic.write_idx_folder(tmp_path / "data" / spec.folder, arrays, spec)
    info = dataset_info(spec, tmp_path / "data", **roots)
    assert info["location"] == str(folder) and info["format"] == "idx" and info["problem"] is None
    (folder / "t10k-images-idx3-ubyte.gz").unlink()
    info = dataset_info(spec, tmp_path / "data", **roots)
    assert info["location"] is None and "t10k-images-idx3-ubyte" in info["problem"]


def test_arrays_are_read_only_views(tmp_path, arrays, spec, roots):
    synthetic.write_idx_folder(tmp_path / "d" / spec.folder, arrays, spec)
    ds = load_dataset(spec, tmp_path / "d", download=False, **roots)
    with pytest.raises(ValueError):
        ds.train_images[0, 0, 0] = 1
    assert isinstance(ds.source, str) and Path(ds.source).is_dir()
