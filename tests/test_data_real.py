"""The real MNIST and Fashion-MNIST files, from $JAXMNIST_DATA_DIR (skipped without it).

Set e.g. JAXMNIST_DATA_DIR=../shared/datasets. These read ~100 MB and take about
a second each; they check the published checksums, shapes, label ranges, and that
the Keras npz and the IDX files hold identical arrays.
"""

import os
import time
from pathlib import Path

import numpy as np
import pytest

from jaxmnist.data import load_dataset, verify_dataset
from jaxmnist.data.registry import ROLES

DATA_DIR = os.environ.get("JAXMNIST_DATA_DIR")

pytestmark = pytest.mark.skipif(
    not DATA_DIR or not Path(DATA_DIR).is_dir(),
    reason="real data: set JAXMNIST_DATA_DIR to a folder holding mnist/ and fashion-mnist/",
)


@pytest.fixture
def offline(tmp_path):
    """Search only DATA_DIR: an empty cache and system folder, and no download."""
    return {"cache_dir": tmp_path / "cache", "system_root": tmp_path / "system", "download": False}


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_real_idx(name, offline):
    start = time.perf_counter()
    ds = load_dataset(name, DATA_DIR, **offline)
    elapsed = time.perf_counter() - start
    assert Path(ds.source) == Path(DATA_DIR) / ds.spec.folder
    assert ds.train_images.shape == (60000, 28, 28) and ds.test_images.shape == (10000, 28, 28)
    assert ds.train_labels.shape == (60000,) and ds.test_labels.shape == (10000,)
    for labels in (ds.train_labels, ds.test_labels):
        assert labels.dtype == np.uint8 and set(np.unique(labels)) == set(range(10))
    assert ds.train_images.dtype == np.uint8 and ds.train_images.max() == 255
    assert elapsed < 5.0, f"loading {name} took {elapsed:.2f}s"


def test_real_mnist_npz_equals_idx(tmp_path, offline):
    npz_only = tmp_path / "npz" / "mnist"
    npz_only.mkdir(parents=True)
    (npz_only / "mnist.npz").symlink_to(Path(DATA_DIR).resolve() / "mnist" / "mnist.npz")
    from_npz = load_dataset("mnist", tmp_path / "npz", **offline)
    from_idx = load_dataset("mnist", DATA_DIR, **offline)
    assert from_npz.source.endswith("mnist.npz")
    for role in ROLES:
        np.testing.assert_array_equal(getattr(from_npz, role), getattr(from_idx, role))


def test_real_verify_mnist(offline):
    del offline["download"]
    reports = verify_dataset("mnist", DATA_DIR, **offline)
    assert len(reports) == 8  # four IDX files and the four npz arrays
    assert [r.sha256 for r in reports[:4]] == [r.sha256 for r in reports[4:]]
