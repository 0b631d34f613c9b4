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
it, so a training set placed on a CPU device is held once, not twice. An IDX file is
decompressed straight into its array (`read_idx`), so loading holds no other copy.
"""

from __future__ import annotations

import gzip
import hashlib
import io
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
CHUNK = 1 << 20  # bytes read or decompressed at a time
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


class _Uncompressed:
    """The uncompressed bytes of an open file, gzipped or not (by magic, not name), read
    a piece at a time and counted; gzip's errors (corrupt, truncated, bytes after the
    end; every member read, zero padding allowed) become one-line `DataError`s, and so
    does more than `max_size` bytes of output."""

    def __init__(self, f, max_size: int, source: object):
        gzipped = f.read(2) == GZIP_MAGIC
        f.seek(0)
        self.stream = gzip.GzipFile(fileobj=f, mode="rb") if gzipped else f
        self.max_size, self.source, self.total = max_size, source, 0

    def read(self, n: int) -> bytes:
        """Up to `n` bytes (fewer only at the end, or where more would pass `max_size`)."""
        out = self._guarded(self.stream.read, max(0, min(n, self.max_size + 1 - self.total)))
        self.total += len(out)
        if self.total > self.max_size:
            raise DataError(
                f"{self.source}: decompresses to more than {self.max_size} bytes, "
                "far more than this file should hold"
            )
        return out

    def readinto(self, buf: memoryview) -> int:
        """Fills `buf` a chunk at a time (gzip's own `readinto` reads the whole length
        into a temporary first); the bytes read, fewer only at the end."""
        done = 0
        while done < len(buf):
            piece = buf[done : done + CHUNK]
            n = self._guarded(self.stream.readinto, piece)
            if not n:
                break
            done += n
        self.total += done
        return done

    def drain(self) -> None:
        """Reads to the end, counting (and checking) what is left."""
        while self.read(CHUNK):
            pass

    def _guarded(self, read, arg):
        try:
            return read(arg)
        except EOFError:
            raise DataError(
                f"{self.source}: truncated gzip data (ends after {self.total} "
                "uncompressed bytes; probably an interrupted download)"
            ) from None
        except gzip.BadGzipFile as e:  # after a member's end, anything but gzip or zeros
            if str(e).startswith("Not a gzipped file"):
                raise DataError(
                    f"{self.source}: unexpected bytes after the end of the gzip data"
                ) from None
            raise DataError(f"{self.source}: corrupt gzip data ({e})") from None
        except zlib.error as e:
            raise DataError(f"{self.source}: corrupt gzip data ({e})") from None


def read_idx(path: Path, max_size: int, ndim: int, label: object = None) -> tuple[np.ndarray, str]:
    """The uint8 array of the IDX file `path`, gzipped or not, and the SHA-256 of its
    uncompressed bytes (header and data); checked as `parse_idx` checks bytes.

    Streamed: the file is decompressed a chunk at a time straight into the array
    (aligned, read-only), which is the only copy of its data this holds. Reading the
    whole compressed file and then its decompressed bytes before copying them into an
    aligned array held MNIST's training images three times over, and the host
    allocator (`hostmem`) keeps such a peak for the rest of the run. Refuses files, and
    gzip output, larger than `max_size` bytes.
    """
    label = path if label is None else label
    try:
        size = os.stat(path).st_size
        if size > max_size:
            raise DataError(
                f"{label}: file is {size} bytes, more than the {max_size} "
                "this file should ever need; not the expected data"
            )
        with open(path, "rb") as f:
            return _read_idx(_Uncompressed(f, max_size, label), ndim, label)
    except OSError as e:
        raise DataError(f"{label}: cannot read ({e.strerror or e})") from None


def parse_idx(data: bytes, *, ndim: int, source: object) -> np.ndarray:
    """The uint8 array in the uncompressed IDX bytes `data`, aligned and read-only.

    `ndim` is 1 for labels (magic 0x00000801), 3 for one-channel images (N, H, W)
    (0x00000803) and 4 for images of several channels (N, H, W, C) (0x00000804).
    The header is checked against the data length before anything is allocated.
    """
    return _read_idx(_Uncompressed(io.BytesIO(data), len(data), source), ndim, source)[0]


def _read_idx(stream: _Uncompressed, ndim: int, source: object) -> tuple[np.ndarray, str]:
    """`read_idx` on an open stream. Every error of the stream itself (gzip's, too many
    bytes) comes before those of the IDX structure, which come before those of its
    length: a header that lies is caught before its size is allocated."""
    want = f"0x{(IDX_UBYTE << 8) | ndim:08x}"
    head = stream.read(1024)  # room for the header and for an HTML page's first tags
    header_len = 4 + 4 * ndim
    problem = None
    if len(head) < 4:
        problem = f"only {len(head)} bytes, too short for an IDX file"
    elif head[0] | head[1] or head[3] != ndim:
        # Only now look for HTML: pixel bytes of a real file could spell "<html".
        if looks_like_html(head):
            stream.drain()
            raise _html_error(source)
        problem = (
            f"neither gzip nor an IDX file of the expected kind "
            f"(starts with 0x{head[:4].hex()}, expected gzip 0x1f8b or IDX {want})"
        )
    elif head[2] != IDX_UBYTE:
        problem = f"IDX element type 0x{head[2]:02x}, expected 0x08 (unsigned byte)"
    elif len(head) < header_len:
        problem = f"truncated IDX header ({len(head)} bytes)"
    if problem:
        stream.drain()
        raise DataError(f"{source}: {problem}")
    dims = struct.unpack_from(f">{ndim}I", head, 4)
    need = math.prod(dims)  # Python int: no overflow for lying headers
    digest = hashlib.sha256(head[:header_len])
    if header_len + need <= stream.max_size:  # else the header lies: nothing allocated
        out = _aligned_empty(need)
        first = head[header_len : header_len + need]
        out[: len(first)] = np.frombuffer(first, np.uint8)
        got = len(first) + stream.readinto(memoryview(out)[len(first) :])
        digest.update(memoryview(out)[:got])
    stream.drain()
    have = stream.total - header_len
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
    out.flags.writeable = False
    return out.reshape(dims), digest.hexdigest()


def _aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of `nbytes` whose data starts on an `ALIGNMENT`-byte
    boundary."""
    buf = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -buf.ctypes.data % ALIGNMENT
    return buf[start : start + nbytes]


def aligned(arr: np.ndarray) -> np.ndarray:
    """`arr` (any shape and dtype) as a read-only C-contiguous array whose data starts on
    an `ALIGNMENT`-byte boundary: `arr` itself when it already does, else a copy."""
    if arr.flags.c_contiguous and arr.ctypes.data % ALIGNMENT == 0:
        out = arr.view()
    else:
        out = _aligned_empty(arr.nbytes).view(arr.dtype).reshape(arr.shape)
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


def _read_spec_idx(path: Path, spec: DatasetSpec, role: str, label: object):
    """(array, SHA-256) of the IDX file holding `role` of `spec` (`read_idx`)."""
    return read_idx(
        path, size_cap(expected_idx_size(spec, role)), len(spec.array_shape(role)), label
    )


def _finish_idx(
    digest: str, arr: np.ndarray, path: Path, spec: DatasetSpec, role: str, label: object
) -> FileReport:
    _check_array(arr, spec, role, label)
    f = spec.file(role)
    _check_sha256(digest, f.sha256, label, f.name)
    return FileReport(Path(path), f.name, None, arr.shape, digest)


def load_idx_file(
    path: Path, spec: DatasetSpec, role: str, *, label: object = None
) -> tuple[np.ndarray, FileReport]:
    """Read and fully verify one IDX file holding `role` of `spec`.

    `label` names the file in errors (default: the path; downloads pass the URL).
    """
    label = path if label is None else label
    arr, digest = _read_spec_idx(path, spec, role, label)
    return arr, _finish_idx(digest, arr, path, spec, role, label)


def load_idx_files(
    paths: Mapping[str, Path], spec: DatasetSpec
) -> tuple[dict[str, np.ndarray], list[FileReport]]:
    """Read and fully verify the four IDX files `paths[role]` for `spec`.

    Returns the arrays by role (uint8, read-only; images (N, *spec.image_shape), labels (N,))
    and one `FileReport` per file. Raises `DataError` on the first problem; the
    image/label count agreement is checked before the per-file checks.
    """
    parsed = {role: _read_spec_idx(paths[role], spec, role, paths[role]) for role in ROLES}
    _check_counts({role: arr for role, (arr, _) in parsed.items()}, paths)
    arrays = {role: arr for role, (arr, _) in parsed.items()}
    reports = [
        _finish_idx(digest, arr, paths[role], spec, role, paths[role])
        for role, (arr, digest) in parsed.items()
    ]
    return arrays, reports


def _read_npz_member(
    npz: np.lib.npyio.NpzFile, key: str, spec: DatasetSpec, role: str, label: object
) -> np.ndarray:
    """An npz member's array, its .npy header checked before anything is allocated, read
    a chunk at a time straight into an aligned array (as `read_idx` reads a file)."""
    with npz.zip.open(key + ".npy") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
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
        out = _aligned_empty(math.prod(shape))
        view, done = memoryview(out), 0
        while done < len(out) and (n := f.readinto(view[done : done + CHUNK])):
            done += n
    if done < len(out):
        raise DataError(f"{label}: corrupt npz file (array {key} ends after {done} bytes)")
    if fortran:  # column-major on disk: the C-ordered copy is the one kept
        return aligned(out.reshape(shape[::-1]).T)
    out.flags.writeable = False
    return out.reshape(shape)


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
                arrays[role] = _read_npz_member(npz, key, spec, role, label)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(f"{label}: corrupt npz file ({e})") from None
    where = {r: f"{label} [{k}]" for r, k in NPZ_KEYS.items()}
    _check_counts(arrays, where)
    reports = []
    for role, key in NPZ_KEYS.items():
        arr = arrays[role]
        _check_array(arr, spec, role, where[role])
        h = hashlib.sha256(idx_header(arr.shape))
        h.update(arr.data)
        f = spec.file(role)
        _check_sha256(h.hexdigest(), f.sha256, where[role], f.name)
        reports.append(FileReport(path, f.name, key, arr.shape, h.hexdigest()))
    return arrays, reports
