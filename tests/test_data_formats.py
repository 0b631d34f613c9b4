"""IDX and npz parsing, and every way a data file can be wrong, on tiny synthetic files."""

import gzip
import hashlib
import io
import struct
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from jaxmnist.data import formats, synthetic
from jaxmnist.data.registry import ROLES
from jaxmnist.errors import DataError


def idx_paths(folder, spec, compress=True):
    return {f.role: folder / (f.name + (".gz" if compress else "")) for f in spec.files}


def write(folder, spec, arrays, compress=True, **overrides):
    """Write the tiny IDX set; `overrides[role]` replaces a file's bytes."""
    synthetic.write_idx_folder(folder, arrays, spec, compress=compress)
    paths = idx_paths(folder, spec, compress)
    for role, data in overrides.items():
        paths[role].write_bytes(data)
    return paths


@pytest.mark.parametrize("compress", [True, False])
def test_idx_round_trip(tmp_path, arrays, spec, compress):
    got, reports = formats.load_idx_files(write(tmp_path, spec, arrays, compress), spec)
    for role in ROLES:
        np.testing.assert_array_equal(got[role], arrays[role])
        assert got[role].dtype == np.uint8 and not got[role].flags.writeable
    assert [r.sha256 for r in reports] == [f.sha256 for f in spec.files]
    assert reports[0].shape == (6, 28, 28) and reports[1].shape == (6,)


def test_gzip_is_detected_by_magic_not_name(tmp_path, arrays, spec):
    # Gzip data without .gz in its name, and raw IDX named .gz, are both read.
    raw_paths = write(tmp_path / "raw", spec, arrays, compress=False)
    raw_paths["train_images"].write_bytes(
        gzip.compress(synthetic.idx_bytes(arrays["train_images"]))
    )
    gz_paths = write(tmp_path / "gz", spec, arrays, compress=True)
    gz_paths["test_labels"].write_bytes(synthetic.idx_bytes(arrays["test_labels"]))
    for paths in (raw_paths, gz_paths):
        got, _ = formats.load_idx_files(paths, spec)
        for role in ROLES:
            np.testing.assert_array_equal(got[role], arrays[role])


def test_multi_member_gzip(tmp_path, arrays, spec):
    data = synthetic.idx_bytes(arrays["train_images"])
    two = gzip.compress(data[:100]) + gzip.compress(data[100:])
    got, _ = formats.load_idx_files(write(tmp_path, spec, arrays, train_images=two), spec)
    np.testing.assert_array_equal(got["train_images"], arrays["train_images"])


def bad(tmp_path, spec, arrays, match, **overrides):
    with pytest.raises(DataError, match=match) as info:
        formats.load_idx_files(write(tmp_path, spec, arrays, **overrides), spec)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_checksum_mismatch(tmp_path, arrays, spec):
    spec = spec.with_checksums(test_labels="ab" * 32)
    msg = bad(tmp_path, spec, arrays, "SHA-256")
    assert "t10k-labels-idx1-ubyte.gz" in msg and "expected abababababab" in msg
    assert spec.file("test_labels").name in msg


def test_truncated_gzip(tmp_path, arrays, spec):
    gz = gzip.compress(synthetic.idx_bytes(arrays["train_images"]))
    msg = bad(tmp_path, spec, arrays, "truncated gzip", train_images=gz[: len(gz) // 2])
    assert "train-images-idx3-ubyte.gz" in msg


def test_corrupt_gzip_stream(tmp_path, arrays, spec):
    gz = bytearray(gzip.compress(synthetic.idx_bytes(arrays["train_images"])))
    gz[20:40] = b"\xff" * 20
    bad(tmp_path, spec, arrays, "corrupt gzip|truncated gzip", train_images=bytes(gz))


def test_garbage_named_gz_is_neither_gzip_nor_idx(tmp_path, arrays, spec):
    msg = bad(
        tmp_path, spec, arrays, "neither gzip nor an IDX file", train_labels=b"\x00\x01garbage" * 10
    )
    assert "train-labels-idx1-ubyte.gz" in msg and "0x00000801" in msg


def test_garbage_raw_is_not_idx(tmp_path, arrays, spec):
    paths = write(tmp_path, spec, arrays, compress=False)
    paths["train_labels"].write_bytes(b"PK\x03\x04 this is a zip, not IDX")
    with pytest.raises(DataError, match="neither gzip nor an IDX file.*IDX 0x00000801"):
        formats.load_idx_files(paths, spec)


@pytest.mark.parametrize(
    "page",
    [
        b"<!DOCTYPE html><html><body>404 Not Found</body></html>",
        b"\n  <html><head><title>Moved</title></head></html>",
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code></Error>',
    ],
)
def test_html_page_saved_as_data(tmp_path, arrays, spec, page):
    msg = bad(tmp_path, spec, arrays, "looks like an HTML", train_images=page)
    assert "failed download" in msg and "train-images-idx3-ubyte.gz" in msg


def test_wrong_magic(tmp_path, arrays, spec):
    data = bytearray(synthetic.idx_bytes(arrays["train_labels"]))
    data[3] = 3  # says images (0x803) where labels (0x801) belong
    bad(
        tmp_path,
        spec,
        arrays,
        r"starts with 0x00000803, expected gzip 0x1f8b or IDX 0x00000801",
        train_labels=gzip.compress(bytes(data)),
    )


def test_wrong_element_type(tmp_path, arrays, spec):
    data = bytearray(synthetic.idx_bytes(arrays["test_labels"]))
    data[2] = 0x0D  # float
    bad(tmp_path, spec, arrays, "element type 0x0d, expected 0x08", test_labels=bytes(data))


def test_lying_header_fails_fast_without_allocating(tmp_path, arrays, spec):
    # Claims 10^9 images of 28x28 (~784 GB) in a file of a few hundred bytes.
    lie = struct.pack(">I3I", 0x803, 10**9, 28, 28) + bytes(300)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        msg = bad(tmp_path, spec, arrays, "header says 1000000000x28x28", train_images=lie)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 1.0
    assert peak < 10 * 2**20
    assert "holds 300" in msg


@pytest.mark.parametrize("compress", [True, False])
def test_trailing_bytes_after_the_declared_data(tmp_path, arrays, spec, compress):
    # The header's own count is the authority: longer content is refused by the
    # parser, before (and whatever) the checksum says.
    data = synthetic.idx_bytes(arrays["train_labels"]) + b"\x00" * 5
    msg = bad(
        tmp_path,
        spec,
        arrays,
        r"5 trailing bytes after the 6 = 6 bytes of data declared by the IDX header",
        train_labels=gzip.compress(data) if compress else data,
    )
    assert "train-labels-idx1-ubyte" in msg and "SHA-256" not in msg
    with pytest.raises(DataError, match=r"^here: 5 trailing bytes after the 6 = 6 bytes"):
        formats.parse_idx(data, ndim=1, source="here")
    images = synthetic.idx_bytes(arrays["train_images"]) + bytes(28)
    with pytest.raises(DataError, match="28 trailing bytes after the 6x28x28 = 4704 bytes"):
        formats.parse_idx(images, ndim=3, source="here")


def test_gzip_bomb_is_capped(tmp_path, arrays, spec):
    bomb = gzip.compress(bytes(2 * 2**20))  # 2 MiB of zeros in ~2 KiB
    tracemalloc.start()
    try:
        bad(tmp_path, spec, arrays, "decompresses to more than", test_labels=bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20


def test_oversized_file_refused_before_reading(tmp_path, arrays, spec):
    bad(tmp_path, spec, arrays, "more than the", train_labels=bytes(10**6))


def test_count_mismatch(tmp_path, arrays, spec):
    short = synthetic.idx_bytes(arrays["train_labels"][:5])
    bad(tmp_path, spec, arrays, "holds 5 labels but .* holds 6 images", train_labels=short)


def test_counts_disagree_with_spec(tmp_path, arrays, spec):
    more = synthetic.tiny_arrays(train_size=7)
    bad(tmp_path, spec, more, "holds 7 examples, expected 6")


def test_labels_out_of_range(tmp_path, arrays, spec):
    labels = arrays["test_labels"].copy()
    labels[2] = 10
    bad(
        tmp_path,
        spec,
        arrays,
        r"label 10 at index 2 is outside \[0, 10\)",
        test_labels=synthetic.idx_bytes(labels),
    )


def test_wrong_image_shape(tmp_path, spec):
    big = synthetic.tiny_arrays(image_shape=(32, 32))
    bad(tmp_path, spec, big, "images are 32x32, expected 28x28")


# --- npz ---------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_npz_round_trip_matches_idx_checksums(tmp_path, arrays, spec, compress):
    path = tmp_path / "mnist.npz"
    path.write_bytes(synthetic.npz_bytes(arrays, compress=compress))
    got, reports = formats.load_npz(path, spec)
    for role in ROLES:
        np.testing.assert_array_equal(got[role], arrays[role])
        assert not got[role].flags.writeable
    assert [r.sha256 for r in reports] == [f.sha256 for f in spec.files]
    assert [r.member for r in reports] == ["x_train", "y_train", "x_test", "y_test"]


def npz_with(tmp_path, **members):
    buf = io.BytesIO()
    np.savez(buf, **members)
    path = tmp_path / "mnist.npz"
    path.write_bytes(buf.getvalue())
    return path


def npz_members(arrays):
    return {
        "x_train": arrays["train_images"],
        "y_train": arrays["train_labels"],
        "x_test": arrays["test_images"],
        "y_test": arrays["test_labels"],
    }


def test_npz_missing_key(tmp_path, arrays, spec):
    members = npz_members(arrays)
    del members["y_test"]
    with pytest.raises(DataError, match="lacks array.*y_test"):
        formats.load_npz(npz_with(tmp_path, **members), spec)


def test_npz_wrong_dtype(tmp_path, arrays, spec):
    members = npz_members(arrays)
    members["x_train"] = members["x_train"].astype(np.int8)
    with pytest.raises(DataError, match="x_train has dtype int8, expected uint8"):
        formats.load_npz(npz_with(tmp_path, **members), spec)


def test_npz_pickled_objects_refused(tmp_path, arrays, spec):
    members = npz_members(arrays)
    members["y_train"] = np.array([{"evil": 1}] * 6, dtype=object)
    with pytest.raises(DataError, match="y_train holds Python objects"):
        formats.load_npz(npz_with(tmp_path, **members), spec)


def test_npz_checksum_mismatch(tmp_path, arrays, spec):
    members = npz_members(arrays)
    members["x_test"] = members["x_test"] ^ 1
    with pytest.raises(DataError, match=r"\[x_test\]: SHA-256 of t10k-images-idx3-ubyte"):
        formats.load_npz(npz_with(tmp_path, **members), spec)


def test_npz_count_mismatch(tmp_path, arrays, spec):
    members = npz_members(arrays)
    members["y_train"] = members["y_train"][:5]
    with pytest.raises(DataError, match="holds 5 labels but"):
        formats.load_npz(npz_with(tmp_path, **members), spec)


def test_npz_lying_header_not_allocated(tmp_path, spec):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (10**9, 28, 28)}
    )
    path = tmp_path / "mnist.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for key in ("x_train", "y_train", "x_test", "y_test"):
            zf.writestr(key + ".npy", header.getvalue() + bytes(100))
    with pytest.raises(DataError, match=r"x_train has shape \(1000000000, 28, 28\)"):
        formats.load_npz(path, spec)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"<html><body>Service Unavailable</body></html>", "looks like an HTML"),
        (b"\x93NUMPY not a zip", "not an npz"),
        (b"", "not an npz"),
    ],
)
def test_npz_not_an_npz(tmp_path, spec, content, match):
    path = tmp_path / "mnist.npz"
    path.write_bytes(content)
    with pytest.raises(DataError, match=match):
        formats.load_npz(path, spec)


def test_npz_truncated(tmp_path, arrays, spec):
    data = synthetic.npz_bytes(arrays)
    path = tmp_path / "mnist.npz"
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(DataError, match="corrupt npz"):
        formats.load_npz(path, spec)


def test_npz_member_shorter_than_its_header_says(tmp_path, arrays, spec):
    # A well-formed zip whose x_train.npy stops 100 bytes short of its declared shape.
    path = tmp_path / "mnist.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for key, arr in npz_members(arrays).items():
            buf = io.BytesIO()
            np.save(buf, arr)
            data = buf.getvalue()
            zf.writestr(key + ".npy", data[:-100] if key == "x_train" else data)
    with pytest.raises(DataError, match=r"corrupt npz file \(array x_train ends after \d+ bytes"):
        formats.load_npz(path, spec)


def test_npz_in_fortran_order_is_read_in_c_order(tmp_path, arrays, spec):
    members = {k: np.asfortranarray(v) for k, v in npz_members(arrays).items()}
    got, _ = formats.load_npz(npz_with(tmp_path, **members), spec)
    np.testing.assert_array_equal(got["train_images"], arrays["train_images"])
    assert got["train_images"].flags.c_contiguous and not got["train_images"].flags.writeable


def test_idx_header_matches_published_layout(arrays):
    data = synthetic.idx_bytes(arrays["train_images"])
    assert data[:4] == b"\x00\x00\x08\x03" and struct.unpack(">3I", data[4:16]) == (6, 28, 28)
    assert (
        hashlib.sha256(data).hexdigest() == synthetic.tiny_spec(arrays).file("train_images").sha256
    )


def test_pixels_spelling_html_are_still_data(tmp_path, arrays, spec):
    images = arrays["train_images"].copy()
    images.reshape(-1)[:20] = np.frombuffer(b"<!DOCTYPE html><html", np.uint8)
    spec = synthetic.tiny_spec({**arrays, "train_images": images})
    got, _ = formats.load_idx_files(write(tmp_path, spec, {**arrays, "train_images": images}), spec)
    np.testing.assert_array_equal(got["train_images"], images)
