"""Reading and checking data files: IDX (raw or gzipped) and Keras-layout npz.

Pure functions over bytes and paths; nothing here searches folders or touches the
network. Every way a file can be wrong (HTML error page saved as data, truncated
or oversized gzip, wrong IDX magic, a header that disagrees with the file length,
counts or shapes that do not match the dataset, labels out of range, checksum
mismatch) raises a one-line `DataError` naming the file. Structure is checked
before content and sizes before allocation: a header claiming 10^9 images in a
small file is rejected from the header alone, and gzip output is capped at twice
the expected size. Arrays are read-only and start on a 64-byte boundary
(`aligned`): XLA:CPU then uses their memory as the device buffer instead of copying
it, so a training set placed on a CPU device is held once, not twice.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxmnist.data.registry import NPZ_KEYS, ROLES, DatasetSpec
from jaxmnist.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
# XLA:CPU's buffer alignment: `jax.device_put` of a host array aligned to it aliases the
# array's memory rather than copying it (a misaligned one is copied).
ALIGNMENT = 64
IDX_UBYTE = 0x08
_HTML_MARKERS = (b"<!doctype", b"<html", b"<?xml", b"<head", b"<body", b"<title")


@dataclass(frozen=True)
class FileReport:
    """One verified array: where it came from, its shape and content hash."""

    path: Path
    idx_name: str  # the IDX file this content corresponds to
    member: str | None  # array name inside an npz, None for an IDX file
    shape: tuple[int, ...]
    sha256: str  # of the uncompressed IDX bytes (header + payload)

    def __str__(self) -> str:
        where = f"{self.path} [{self.member}]" if self.member else str(self.path)
        return (
            f"{where}: {self.idx_name} {'x'.join(map(str, self.shape))}, "
            f"sha256 {self.sha256[:12]}... ok"
        )


def idx_header(shape: tuple[int, ...]) -> bytes:
    """The IDX header of a uint8 array of `shape` (magic 0x0000080N, then dims)."""
    return struct.pack(f">BBBB{len(shape)}I", 0, 0, IDX_UBYTE, len(shape), *shape)


def expected_idx_size(spec: DatasetSpec, role: str) -> int:
    shape = spec.array_shape(role)
    return len(idx_header(shape)) + math.prod(shape)


def size_cap(expected: int) -> int:
    """Most bytes we read or decompress for a file whose content is `expected` bytes.

    Twice the content, plus room for gzip/zip framing around tiny test files.
    """
    return 2 * expected + 4096


def looks_like_html(data: bytes) -> bool:
    head = bytes(data[:1024]).lstrip().lower()
    return head.startswith(_HTML_MARKERS) or b"<html" in head


def _html_error(source: object) -> DataError:
    return DataError(
        f"{source}: looks like an HTML/XML page, not data "
        "(probably a failed download saved as the file); delete it and download again"
    )


def gunzip(data: bytes, max_size: int, source: object) -> bytes:
    """Decompress gzip `data` (all members), refusing more than `max_size` bytes."""
    parts, total, rest = [], 0, data
    while True:
        d = zlib.decompressobj(wbits=31)  # 31: expect a gzip header and trailer
        try:
            out = d.decompress(rest, max_size + 1 - total)
        except zlib.error as e:
            raise DataError(f"{source}: corrupt gzip data ({e})") from None
        total += len(out)
        parts.append(out)
        if total > max_size:
            raise DataError(
                f"{source}: decompresses to more than {max_size} bytes, "
                "far more than this file should hold"
            )
        if not d.eof:
            raise DataError(
                f"{source}: truncated gzip data (ends after {total} "
                "uncompressed bytes; probably an interrupted download)"
            )
        rest = d.unused_data
        if not rest.strip(b"\0"):  # trailing zero padding is allowed by gzip(1)
            break
        if not rest.startswith(GZIP_MAGIC):
            raise DataError(f"{source}: unexpected bytes after the end of the gzip data")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_idx_bytes(path: Path, max_size: int, label: object = None) -> bytes:
    """The uncompressed IDX bytes of `path`, gzipped or not (by magic, not name).

    Refuses files, and gzip output, larger than `max_size` bytes.
    """
    label = path if label is None else label
    try:
        size = os.stat(path).st_size
        if size > max_size:
            raise DataError(
                f"{label}: file is {size} bytes, more than the {max_size} "
                "this file should ever need; not the expected data"
            )
        data = Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"{label}: cannot read ({e.strerror or e})") from None
    if data.startswith(GZIP_MAGIC):
        return gunzip(data, max_size, label)
    return data  # raw IDX (whatever the name says); parse_idx checks it


def parse_idx(data: bytes, *, ndim: int, source: object) -> np.ndarray:
    """The uint8 array in IDX `data`, a read-only view (no copy).

    `ndim` is 1 for labels (magic 0x00000801), 3 for one-channel images (N, H, W)
    (0x00000803) and 4 for images of several channels (N, H, W, C) (0x00000804).
    The header is checked against the data length before anything is allocated.
    """
    want = f"0x{(IDX_UBYTE << 8) | ndim:08x}"
    if len(data) < 4:
        raise DataError(f"{source}: only {len(data)} bytes, too short for an IDX file")
    zero, dtype, got_ndim = data[0] | data[1], data[2], data[3]
    if zero or got_ndim != ndim:
        # Only now look for HTML: pixel bytes of a real file could spell "<html".
        if looks_like_html(data):
            raise _html_error(source)
        raise DataError(
            f"{source}: neither gzip nor an IDX file of the expected kind "
            f"(starts with 0x{data[:4].hex()}, expected gzip 0x1f8b or IDX {want})"
        )
    if dtype != IDX_UBYTE:
        raise DataError(f"{source}: IDX element type 0x{dtype:02x}, expected 0x08 (unsigned byte)")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(f"{source}: truncated IDX header ({len(data)} bytes)")
    dims = struct.unpack_from(f">{ndim}I", data, 4)
    need = math.prod(dims)  # Python int: no overflow for lying headers
    have = len(data) - header_len
    if have < need:
        raise DataError(
            f"{source}: IDX header says {'x'.join(map(str, dims))} = {need} bytes "
            f"of data but the file holds {have}; the file is truncated or corrupt"
        )
    if have > need:
        raise DataError(
            f"{source}: {have - need} trailing bytes after the {'x'.join(map(str, dims))} "
            f"= {need} bytes of data declared by the IDX header; the file is corrupt"
        )
    return np.frombuffer(data, dtype=np.uint8, count=need, offset=header_len).reshape(dims)


def aligned(arr: np.ndarray) -> np.ndarray:
    """`arr` (any shape and dtype) as a read-only C-contiguous array whose data starts on
    an `ALIGNMENT`-byte boundary: `arr` itself when it already does, else a copy."""
    if arr.flags.c_contiguous and arr.ctypes.data % ALIGNMENT == 0:
        out = arr.view()
    else:
        buf = np.empty(arr.nbytes + ALIGNMENT, np.uint8)
        start = -buf.ctypes.data % ALIGNMENT
        out = buf[start : start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
        out[...] = arr
    out.flags.writeable = False
    return out


def _check_counts(arrays: Mapping[str, np.ndarray], where: Mapping[str, object]) -> None:
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if len(images) != len(labels):
            raise DataError(
                f"{where[f'{split}_labels']}: holds {len(labels)} labels but "
                f"{where[f'{split}_images']} holds {len(images)} images"
            )


def _check_array(arr: np.ndarray, spec: DatasetSpec, role: str, source: object) -> None:
    """Shape and label range of one parsed array against `spec`."""
    want = spec.array_shape(role)
    if arr.shape[1:] != want[1:]:
        raise DataError(
            f"{source}: images are {'x'.join(map(str, arr.shape[1:]))}, "
            f"expected {'x'.join(map(str, want[1:]))} for {spec.display_name}"
        )
    if arr.shape[0] != want[0]:
        raise DataError(
            f"{source}: holds {arr.shape[0]} examples, expected {want[0]} "
            f"for {spec.display_name} {role.split('_')[0]}"
        )
    if role.endswith("labels") and arr.size and int(arr.max()) >= spec.num_classes:
        i = int(np.argmax(arr >= spec.num_classes))
        raise DataError(
            f"{source}: label {arr[i]} at index {i} is outside "
            f"[0, {spec.num_classes}) for {spec.display_name}"
        )


def _check_sha256(digest: str, expected: str, source: object, idx_name: str) -> None:
    if digest != expected:
        raise DataError(
            f"{source}: SHA-256 of {idx_name} content is {digest[:12]}..., expected "
            f"{expected[:12]}...; the file is corrupt or not the official data"
        )


def _read_idx(path: Path, spec: DatasetSpec, role: str, label: object) -> tuple[bytes, np.ndarray]:
    raw = read_idx_bytes(path, size_cap(expected_idx_size(spec, role)), label)
    return raw, parse_idx(raw, ndim=len(spec.array_shape(role)), source=label)


def _finish_idx(
    raw: bytes, arr: np.ndarray, path: Path, spec: DatasetSpec, role: str, label: object
) -> FileReport:
    _check_array(arr, spec, role, label)
    f = spec.file(role)
    digest = hashlib.sha256(raw).hexdigest()
    _check_sha256(digest, f.sha256, label, f.name)
    return FileReport(Path(path), f.name, None, arr.shape, digest)


def load_idx_file(
    path: Path, spec: DatasetSpec, role: str, *, label: object = None
) -> tuple[np.ndarray, FileReport]:
    """Read and fully verify one IDX file holding `role` of `spec`.

    `label` names the file in errors (default: the path; downloads pass the URL).
    """
    label = path if label is None else label
    raw, arr = _read_idx(path, spec, role, label)
    return arr, _finish_idx(raw, arr, path, spec, role, label)


def load_idx_files(
    paths: Mapping[str, Path], spec: DatasetSpec
) -> tuple[dict[str, np.ndarray], list[FileReport]]:
    """Read and fully verify the four IDX files `paths[role]` for `spec`.

    Returns the arrays by role (uint8, read-only; images (N, *spec.image_shape), labels (N,))
    and one `FileReport` per file. Raises `DataError` on the first problem; the
    image/label count agreement is checked before the per-file checks.
    """
    parsed = {role: _read_idx(paths[role], spec, role, paths[role]) for role in ROLES}
    _check_counts({role: arr for role, (_, arr) in parsed.items()}, paths)
    arrays, reports = {}, []
    for role in ROLES:
        raw, arr = parsed.pop(role)
        reports.append(_finish_idx(raw, arr, paths[role], spec, role, paths[role]))
        arrays[role] = aligned(arr)  # then the decompressed bytes are freed, one file at a time
        del raw, arr
    return arrays, reports


def _npz_header(
    npz: np.lib.npyio.NpzFile, key: str, spec: DatasetSpec, role: str, label: object
) -> None:
    """Check an npz member's .npy header before np.load allocates what it claims."""
    with npz.zip.open(key + ".npy") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise DataError(f"{label}: array {key} uses .npy format {version}, expected 1.0 or 2.0")
    if dtype.hasobject:
        raise DataError(
            f"{label}: array {key} holds Python objects (pickled data); refusing to load it"
        )
    if dtype != np.uint8:
        raise DataError(f"{label}: array {key} has dtype {dtype}, expected uint8")
    want = spec.array_shape(role)
    if len(shape) != len(want) or math.prod(shape) > math.prod(want):
        raise DataError(f"{label}: array {key} has shape {shape}, expected {want}")


def load_npz(
    path: Path, spec: DatasetSpec, *, label: object = None
) -> tuple[dict[str, np.ndarray], list[FileReport]]:
    """Read and fully verify a Keras-layout npz (x_train, y_train, x_test, y_test).

    Each array is checked against the IDX checksum of the same content,
    sha256(idx_header(shape) + array bytes), so any npz holding the official arrays
    passes whatever its container bytes. Returns arrays by role (uint8, read-only)
    and one `FileReport` per array. `label` names the file in errors.
    """
    path = Path(path)
    label = path if label is None else label
    max_size = size_cap(sum(expected_idx_size(spec, r) for r in ROLES))
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as fh:
            head = fh.read(1024)
    except OSError as e:
        raise DataError(f"{label}: cannot read ({e.strerror or e})") from None
    if not head.startswith(b"PK") and looks_like_html(head):
        raise _html_error(label)
    if size > max_size:
        raise DataError(
            f"{label}: file is {size} bytes, more than the {max_size} an npz of "
            f"{spec.display_name} should ever need"
        )
    if not head.startswith(b"PK"):
        raise DataError(
            f"{label}: not an npz (zip) file (starts with {head[:4].hex() or 'nothing'})"
        )
    arrays: dict[str, np.ndarray] = {}
    try:
        # We open the file ourselves: np.load leaks its own handle when the zip
        # directory is unreadable (truncated download).
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as npz:
            missing = [k for k in NPZ_KEYS.values() if k not in npz.files]
            if missing:
                raise DataError(
                    f"{label}: npz lacks array(s) {', '.join(missing)} "
                    f"(has {', '.join(npz.files) or 'none'})"
                )
            for role, key in NPZ_KEYS.items():
                _npz_header(npz, key, spec, role, label)
                arrays[role] = npz[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(f"{label}: corrupt npz file ({e})") from None
    where = {r: f"{label} [{k}]" for r, k in NPZ_KEYS.items()}
    _check_counts(arrays, where)
    reports = []
    for role, key in NPZ_KEYS.items():
        arrays[role] = arr = aligned(arrays[role])
        _check_array(arr, spec, role, where[role])
        h = hashlib.sha256(idx_header(arr.shape))
        h.update(arr.data)
        f = spec.file(role)
        _check_sha256(h.hexdigest(), f.sha256, where[role], f.name)
        reports.append(FileReport(path, f.name, key, arr.shape, h.hexdigest()))
    return arrays, reports
