"""Tiny, valid datasets for tests: arrays, IDX/npz bytes, and a spec.

A test that needs the loader or downloader to accept its files builds a spec
whose checksums match them: `tiny_spec(arrays)` is MNIST with the sizes, image
shape and SHA-256s of `arrays`, so every real check still runs, on kilobytes.
Other shapes are one argument away: `tiny_arrays(image_shape=(32, 32), channels=3,
num_classes=5)` and `tiny_spec(arrays, class_names=...)` make a colour dataset.

    arrays = tiny_arrays()
    spec = tiny_spec(arrays)
    write_idx_folder(tmp_path / spec.folder, arrays, spec)
    ds = load_dataset(spec, tmp_path, download=False)
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
from pathlib import Path

import numpy as np

from jaxmnist.data.formats import idx_header
from jaxmnist.data.registry import MNIST, NPZ_KEYS, ROLES, DatasetSpec, idx_files


def tiny_arrays(
    train_size: int = 6,
    test_size: int = 4,
    *,
    seed: int = 0,
    image_shape: tuple[int, int] = MNIST.image_shape,
    channels: int = 1,
    num_classes: int = MNIST.num_classes,
) -> dict[str, np.ndarray]:
    """Random uint8 arrays by role: images (N, H, W), or (N, H, W, channels) for more than
    one channel, with (H, W) = `image_shape`; labels (N,) < num_classes."""
    rng = np.random.default_rng(seed)
    shape = tuple(image_shape) if channels == 1 else (*image_shape, channels)
    out = {}
    for role in ROLES:
        n = train_size if role.startswith("train") else test_size
        if role.endswith("images"):
            out[role] = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        else:
            out[role] = rng.integers(0, num_classes, n, dtype=np.uint8)
    return out


def idx_bytes(arr: np.ndarray) -> bytes:
    """The uncompressed IDX file holding uint8 `arr`."""
    return idx_header(arr.shape) + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def tiny_spec(
    arrays: dict[str, np.ndarray],
    base: DatasetSpec = MNIST,
    *,
    name: str = "tiny",
    sources: tuple[str, ...] = (),
    class_names: tuple[str, ...] | None = None,
    preprocessing: str | None = None,
) -> DatasetSpec:
    """`base` with the sizes, image shape and IDX checksums of `arrays`, folder `name`;
    `class_names` and `preprocessing` replace the base's when given."""
    images = arrays["train_images"]
    height, width, *channels = images.shape[1:]
    spec = dataclasses.replace(
        base,
        name=name,
        folder=name,
        display_name=f"tiny {base.display_name}",
        height=height,
        width=width,
        channels=channels[0] if channels else 1,
        class_names=base.class_names if class_names is None else tuple(class_names),
        preprocessing=preprocessing or base.preprocessing,
        train_size=len(images),
        test_size=len(arrays["test_images"]),
        files=idx_files(tuple(f.sha256 for f in base.files), images.ndim),
        sources=tuple(sources),
    )
    return spec.with_checksums(
        **{r: hashlib.sha256(idx_bytes(arrays[r])).hexdigest() for r in ROLES}
    )


def write_idx_folder(
    folder: Path, arrays: dict[str, np.ndarray], spec: DatasetSpec = MNIST, *, compress: bool = True
) -> Path:
    """Write the four IDX files (named as in `spec`, .gz if `compress`) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for f in spec.files:
        data = idx_bytes(arrays[f.role])
        if compress:
            (folder / (f.name + ".gz")).write_bytes(gzip.compress(data, mtime=0))
        else:
            (folder / f.name).write_bytes(data)
    return folder


def npz_bytes(arrays: dict[str, np.ndarray], *, compress: bool = True) -> bytes:
    """A Keras-layout npz (x_train, y_train, x_test, y_test) holding `arrays`."""
    buf = io.BytesIO()
    save = np.savez_compressed if compress else np.savez
    save(buf, **{NPZ_KEYS[r]: arrays[r] for r in ROLES})
    return buf.getvalue()
