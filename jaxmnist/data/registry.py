"""What each dataset is: sizes, class names, file names, checksums and sources.

This module owns the facts, not the code that uses them. A dataset is one frozen
`DatasetSpec` in `DATASETS`; KMNIST, EMNIST or a colour dataset join by adding one
entry here: the loader, downloader and CLI, the models' input shape, augmentation,
the preprocessing of a person's image (`preprocessing`), predict, serve and export
read everything they need from the spec. Images stay as the files hold them: (N, H, W)
for one channel, (N, H, W, C) for more (IDX files of 4 dimensions).

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

PREPROCESSINGS = ("mnist", "fashion", "none")
"""How a person's image is made into a model input (`jaxmnist.use.preprocess`): "mnist"
(ink centred by mass in a box of 20/28 of the field, as MNIST's digits), "fashion"
(trimmed and scaled to fill the field, as Fashion-MNIST's products), "none" (resized)."""


@dataclass(frozen=True)
class IdxFile:
    """One IDX file: `name` without `.gz`; `sha256` of its uncompressed bytes."""

    role: str  # one of ROLES
    name: str
    sha256: str


@dataclass(frozen=True)
class DatasetSpec:
    """Everything jaxmnist knows about one dataset, before any file is read.

    An image is `height` x `width` pixels of `channels` uint8 values; `image_shape` is
    (H, W) for one channel and (H, W, C) for more, the shape of one image in the arrays.
    `preprocessing` (one of `PREPROCESSINGS`) says how a person's image is made like
    this dataset's. `sources` are tried in order when downloading. An entry ending in
    `.npz` is the URL of a Keras-layout npz holding all four arrays; any other entry is a
    base URL (ending in `/`) serving the four IDX files as `<base><file name>.gz`.
    """

    name: str  # the CLI / config name, e.g. "fashion_mnist"
    folder: str  # on-disk folder under a data root, e.g. "fashion-mnist"
    display_name: str
    class_names: tuple[str, ...]
    height: int
    width: int
    channels: int  # 1: grayscale, arrays (N, H, W); 3: RGB, arrays (N, H, W, 3)
    preprocessing: str  # one of PREPROCESSINGS
    train_size: int
    test_size: int
    files: tuple[IdxFile, ...]  # one per role, in ROLES order
    sources: tuple[str, ...]
    npz_name: str | None = None  # file name of the npz copy in a data folder, if any
    system_package: str | None = None  # Debian/Ubuntu package shipping the .gz files

    def __post_init__(self):
        # A wrong entry is a bug in the registry (or a test's spec): fail where it is made.
        if self.preprocessing not in PREPROCESSINGS:
            raise ValueError(
                f"{self.name}: preprocessing {self.preprocessing!r}, "
                f"expected one of {', '.join(PREPROCESSINGS)}"
            )
        if min(self.height, self.width, self.channels) < 1 or len(self.class_names) < 2:
            raise ValueError(f"{self.name}: needs positive sizes and at least two classes")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, ...]:
        """One image's shape in the arrays: (H, W) for one channel, (H, W, C) for more."""
        hw = (self.height, self.width)
        return hw if self.channels == 1 else (*hw, self.channels)

    def describe_shape(self) -> str:
        """One image's size in words: "28x28", "32x32 RGB", "32x32x4"."""
        hw = f"{self.height}x{self.width}"
        if self.channels == 1:
            return hw
        return f"{hw} RGB" if self.channels == 3 else f"{hw}x{self.channels}"

    def file(self, role: str) -> IdxFile:
        """The IDX file holding `role` (one of `ROLES`)."""
        for f in self.files:
            if f.role == role:
                return f
        raise KeyError(role)

    def num_examples(self, role: str) -> int:
        return self.train_size if role.startswith("train") else self.test_size

    def array_shape(self, role: str) -> tuple[int, ...]:
        """Shape of the uint8 array for `role`: (N, *image_shape) or (N,)."""
        n = self.num_examples(role)
        return (n, *self.image_shape) if role.endswith("images") else (n,)

    def with_checksums(self, **sha256_by_role: str) -> DatasetSpec:
        """A copy with some IDX checksums replaced (for tests and new mirrors)."""
        files = tuple(
            dataclasses.replace(f, sha256=sha256_by_role.get(f.role, f.sha256)) for f in self.files
        )
        return dataclasses.replace(self, files=files)


def idx_files(sha256s: tuple[str, ...], image_dims: int = 3) -> tuple[IdxFile, ...]:
    """The four IDX files by MNIST's names; images of `image_dims` dimensions (4 for
    (N, H, W, C)) are named `idx<image_dims>` as the format's convention has it."""
    names = (
        f"train-images-idx{image_dims}-ubyte",
        "train-labels-idx1-ubyte",
        f"t10k-images-idx{image_dims}-ubyte",
        "t10k-labels-idx1-ubyte",
    )
    return tuple(IdxFile(r, n, h) for r, n, h in zip(ROLES, names, sha256s, strict=True))


MNIST = DatasetSpec(
    name="mnist",
    folder="mnist",
    display_name="MNIST",
    class_names=tuple(str(d) for d in range(10)),
    height=28,
    width=28,
    channels=1,
    preprocessing="mnist",
    train_size=60_000,
    test_size=10_000,
    files=idx_files(
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
    height=28,
    width=28,
    channels=1,
    preprocessing="fashion",
    train_size=60_000,
    test_size=10_000,
    files=idx_files(
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


def spec_to_dict(spec: DatasetSpec) -> dict:
    """`spec` as plain JSON-able data; `spec_from_dict` makes it again (a process tells
    another about a dataset registered at run time)."""
    return dataclasses.asdict(spec)


def spec_from_dict(d: dict) -> DatasetSpec:
    """The `DatasetSpec` that `spec_to_dict` made `d` of."""
    return DatasetSpec(
        **{
            **d,
            "class_names": tuple(d["class_names"]),
            "files": tuple(IdxFile(**f) for f in d["files"]),
            "sources": tuple(d["sources"]),
        }
    )


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
