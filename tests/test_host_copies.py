"""One copy of the data in host memory: arrays loaded so that XLA:CPU uses them in place."""

import gzip
import hashlib
import tracemalloc

import jax
import numpy as np
import pytest

from jaxmnist.data import formats, registry, synthetic
from jaxmnist.data.dataset import load_dataset


def _misaligned(arr: np.ndarray) -> np.ndarray:
    """A read-only copy of `arr` whose data starts 1 byte past a 64-byte boundary."""
    buf = np.empty(arr.nbytes + 128, np.uint8)
    start = -buf.ctypes.data % 64 + 1
    out = buf[start : start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    out.flags.writeable = False
    return out


def test_aligned_copies_a_misaligned_array_once():
    src = _misaligned(np.arange(3 * 5 * 7, dtype=np.uint8).reshape(3, 5, 7))
    out = formats.aligned(src)
    assert out.ctypes.data % formats.ALIGNMENT == 0
    assert not out.flags.writeable and out.flags.c_contiguous
    np.testing.assert_array_equal(out, src)
    assert out.shape == src.shape and out.dtype == src.dtype
    again = formats.aligned(out)  # already aligned: the same memory, no second copy
    assert np.shares_memory(again, out)


def test_device_put_uses_an_aligned_array_in_place_and_copies_a_misaligned_one():
    # The premise of `aligned`: jax.device_put on a CPU device aliases an aligned array.
    images = np.random.default_rng(0).integers(0, 256, (64, 28, 28), dtype=np.uint8)
    good = formats.aligned(images)
    assert np.shares_memory(np.asarray(jax.device_put(good)), good)
    bad = _misaligned(images)
    assert not np.shares_memory(np.asarray(jax.device_put(bad)), bad)


@pytest.mark.parametrize("kind", ["idx.gz", "idx", "npz"])
def test_loaded_arrays_are_aligned_and_go_to_the_device_in_place(
    kind, arrays, spec, tmp_path, monkeypatch
):
    monkeypatch.setitem(registry.DATASETS, spec.name, spec)
    folder = tmp_path / spec.folder
    if kind == "npz":
        folder.mkdir()
        (folder / spec.npz_name).write_bytes(synthetic.npz_bytes(arrays))
    else:
        synthetic.write_idx_folder(folder, arrays, spec, compress=kind == "idx.gz")
    ds = load_dataset(spec.name, tmp_path, download=False)
    for role in registry.ROLES:
        arr = getattr(ds, role)
        np.testing.assert_array_equal(arr, arrays[role])
        assert arr.ctypes.data % formats.ALIGNMENT == 0, role
        assert not arr.flags.writeable, role
    # The training set on the device is the loaded array itself: one copy, not two.
    assert np.shares_memory(np.asarray(jax.device_put(ds.train_images)), ds.train_images)


@pytest.mark.parametrize("compress", [True, False])
def test_an_idx_file_is_read_into_its_array_without_other_copies(tmp_path, compress):
    # Neither the file's bytes nor their decompressed copy is held beside the array:
    # the peak of what reading allocates stays near the array's own size.
    images = (np.arange(24_000 * 28 * 28) % 251).astype(np.uint8).reshape(24_000, 28, 28)
    path = tmp_path / "images"
    data = synthetic.idx_bytes(images)
    path.write_bytes(gzip.compress(data, compresslevel=1) if compress else data)
    del data
    tracemalloc.start()
    try:
        got, digest = formats.read_idx(path, formats.size_cap(images.nbytes + 16), ndim=3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, images)
    assert got.ctypes.data % formats.ALIGNMENT == 0 and not got.flags.writeable
    assert digest == hashlib.sha256(synthetic.idx_bytes(images)).hexdigest()
    assert peak < images.nbytes + 8 * formats.CHUNK, (peak, images.nbytes)  # a few pieces


def test_an_npz_is_read_into_its_arrays_without_other_copies(tmp_path):
    arrays = synthetic.tiny_arrays(train_size=24_000, test_size=100)
    spec = synthetic.tiny_spec(arrays)
    path = tmp_path / "mnist.npz"
    path.write_bytes(synthetic.npz_bytes(arrays))
    total = sum(a.nbytes for a in arrays.values())
    tracemalloc.start()
    try:
        got, reports = formats.load_npz(path, spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for role, arr in arrays.items():
        np.testing.assert_array_equal(got[role], arr)
        assert got[role].ctypes.data % formats.ALIGNMENT == 0 and not got[role].flags.writeable
    assert [r.sha256 for r in reports] == [f.sha256 for f in spec.files]
    assert peak < total + 8 * formats.CHUNK, (peak, total)
