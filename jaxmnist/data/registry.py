"""What each dataset is: sizes, class names, file names, checksums and sources.

This module owns the facts, not the code that uses them. A dataset is one frozen
`DatasetSpec` in `DATASETS`; KMNIST or EMNIST join by adding one entry here (the
loader, downloader and CLI read everything they need from the spec).

Checksums are SHA-256 of the *uncompressed* IDX bytes (16- or 8-byte header plus
payload), from ../shared/datasets/README.md. Gzip output differs between
compressors and mirrors recompress, so the hash of a .gz file is not a stable
fingerprint; neither is the hash of an .npz container. An npz array is checked by
hashing the IDX header it would have plus its bytes (see `formats.idx_header`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jaxmnist.errors import ConfigError

ROLES = ("train_images", "train_labels", "test_images", "test_labels")
"""The four arrays of every dataset, in the order `DatasetSpec.files` lists them."""

NPZ_KEYS = {
    "train_images": "x_train",
    "train_labels": "y_train",
    "test_images": "x_test",
    "test_labels": "y_test",
}
"""Keras npz layout: array name inside the .npz for each role."""


@dataclass(frozen=True)
class IdxFile:
    """One IDX file: `name` without `.gz`; `sha256` of its uncompressed bytes."""

    role: str  # one of ROLES
    name: str
    sha256: str


@dataclass(frozen=True)
class DatasetSpec:
    """Everything jaxmnist knows about one dataset, before any file is read.

    `sources` are tried in order when downloading. An entry ending in `.npz` is the
    URL of a Keras-layout npz holding all four arrays; any other entry is a base URL
    (ending in `/`) serving the four IDX files as `<base><file name>.gz`.
    """

    name: str  # the CLI / config name, e.g. "fashion_mnist"
    folder: str  # on-disk folder under a data root, e.g. "fashion-mnist"
    display_name: str
    class_names: tuple[str, ...]
    image_shape: tuple[int, int]
    train_size: int
    test_size: int
    files: tuple[IdxFile, ...]  # one per role, in ROLES order
    sources: tuple[str, ...]
    npz_name: str | None = None  # file name of the npz copy in a data folder, if any
    system_package: str | None = None  # Debian/Ubuntu package shipping the .gz files

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def file(self, role: str) -> IdxFile:
        """The IDX file holding `role` (one of `ROLES`)."""
        for f in self.files:
            if f.role == role:
                return f
        raise KeyError(role)

    def num_examples(self, role: str) -> int:
        return self.train_size if role.startswith("train") else self.test_size

    def array_shape(self, role: str) -> tuple[int, ...]:
        """Shape of the uint8 array for `role`, e.g. (60000, 28, 28) or (60000,)."""
        n = self.num_examples(role)
        return (n, *self.image_shape) if role.endswith("images") else (n,)

    def with_checksums(self, **sha256_by_role: str) -> DatasetSpec:
        """A copy with some IDX checksums replaced (for tests and new mirrors)."""
        files = tuple(
            dataclasses.replace(f, sha256=sha256_by_role.get(f.role, f.sha256)) for f in self.files
        )
        return dataclasses.replace(self, files=files)


def _idx_files(sha256s: tuple[str, str, str, str]) -> tuple[IdxFile, ...]:
    names = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )
    return tuple(IdxFile(r, n, h) for r, n, h in zip(ROLES, names, sha256s))


MNIST = DatasetSpec(
    name="mnist",
    folder="mnist",
    display_name="MNIST",
    class_names=tuple(str(d) for d in range(10)),
    image_shape=(28, 28),
    train_size=60_000,
    test_size=10_000,
    files=_idx_files(
        (
            "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        )
    ),
    # The Keras npz first: one request for all four arrays, from a CDN that has
    # stayed up for years. Then the .gz mirrors: PyTorch's S3 copy, the
    # TensorFlow Datasets copy, and the publisher's site last (it has answered
    # 403 to scripted downloads at times).
    sources=(
        "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz",
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
        "https://yann.lecun.com/exdb/mnist/",
    ),
    npz_name="mnist.npz",
)

FASHION_MNIST = DatasetSpec(
    name="fashion_mnist",
    folder="fashion-mnist",
    display_name="Fashion-MNIST",
    class_names=(
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
    image_shape=(28, 28),
    train_size=60_000,
    test_size=10_000,
    files=_idx_files(
        (
            "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        )
    ),
    # The publisher's S3 site, the Keras copy of the same .gz files, then the
    # publisher's GitHub repository (rate-limited, so last).
    sources=(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
        "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
    ),
    system_package="dataset-fashion-mnist",
)

DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (MNIST, FASHION_MNIST)}
"""All known datasets by name."""


def get_spec(name: str | DatasetSpec) -> DatasetSpec:
    """The spec for `name`; a `DatasetSpec` passes through (tests use custom ones).

    Raises `ConfigError` for an unknown name, listing the known ones.
    """
    if isinstance(name, DatasetSpec):
        return name
    key = str(name).strip().lower().replace("-", "_")
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    return DATASETS[key]
