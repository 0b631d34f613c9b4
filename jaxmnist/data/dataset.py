"""The public entry points: load, verify and describe a dataset.

`load_dataset` finds the data (see `locate` for the search order), downloads it
into the cache if it is nowhere (see `download`), and reads it with every check in
`formats`. Files that are present but wrong are always an error, never a reason to
quietly use another copy. Each file is read, decompressed and hashed once; arrays
are read-only, aligned for XLA:CPU to use in place (`formats.aligned`).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxmnist.data import formats
from jaxmnist.data.download import (
    DownloadError,
    DownloadPolicy,
    fetch_dataset,
    hosts,
    remove_stale_parts,
    summarize,
)
from jaxmnist.data.formats import FileReport
from jaxmnist.data.locate import ENV_DATA_DIR, Contents, Place, locate, scan, search_path
from jaxmnist.data.registry import DatasetSpec, get_spec
from jaxmnist.errors import DataError

PathLike = str | os.PathLike


# eq=False: field-wise == on arrays is ambiguous; identity equality and hashing
# let a Dataset be a dict key or a static argument.
@dataclass(frozen=True, eq=False)
class Dataset:
    """One dataset in host memory; arrays are uint8 and read-only."""

    spec: DatasetSpec
    train_images: np.ndarray  # (N, *spec.image_shape) uint8: (N, H, W) or (N, H, W, C)
    train_labels: np.ndarray  # (N,) uint8
    test_images: np.ndarray  # (M, *spec.image_shape) uint8
    test_labels: np.ndarray  # (M,) uint8
    source: str  # human-readable: the folder or file it was read from, and any download
    folder: Path | None = None  # the dataset folder it was read from (None: not from files)


def _how_to_supply(spec: DatasetSpec) -> str:
    hint = (
        f"supply the files with --data-dir or {ENV_DATA_DIR} (a folder holding "
        f"{spec.folder}/{spec.files[0].name}.gz and the other three IDX files"
    )
    hint += f", or {spec.folder}/{spec.npz_name})" if spec.npz_name else ")"
    hint += f", or run `jaxmnist data download {spec.name}` where there is network"
    if spec.system_package:
        hint += f", or `apt-get install {spec.system_package}`"
    return hint


def _not_found(spec: DatasetSpec, places: list[Place], download_failure: str | None) -> DataError:
    looked = ", ".join(str(p.folder) for p in places)
    tail = (
        f"; download failed ({download_failure})"
        if download_failure is not None
        else "; download disabled"
    )
    return DataError(f"{spec.display_name} not found in {looked}{tail}; {_how_to_supply(spec)}")


def _read(
    spec: DatasetSpec, contents: Contents, place_label: str
) -> tuple[dict[str, np.ndarray], list[FileReport]]:
    try:
        if contents.complete_idx:
            return formats.load_idx_files(contents.idx, spec)
        return formats.load_npz(contents.npz, spec)
    except DataError as err:
        if place_label == "cache":
            raise DataError(
                f"{err} (in the cache: `jaxmnist data download {spec.name}` replaces it)"
            ) from None
        raise


def load_dataset(
    name: str | DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    download: bool = True,
    cache_dir: PathLike | None = None,
    system_root: PathLike | None = None,
    sources: list[str] | tuple[str, ...] | None = None,
    policy: DownloadPolicy | None = None,
) -> Dataset:
    """Load dataset `name` (a name in `DATASETS`, or a `DatasetSpec`), verified.

    Looks in `data_dir` (else `$JAXMNIST_DATA_DIR`), the cache, then the system
    folder; if none has it and `download` is true, downloads into the cache
    (`cache_dir`, default `default_cache_dir()`) from `sources` (default: the
    spec's mirrors). Raises `ConfigError` for an unknown name and `DataError` for
    missing or bad data, in one line naming the file.
    """
    spec = get_spec(name)
    places = search_path(spec, data_dir, cache_dir=cache_dir, system_root=system_root)
    for place in places:
        if place.label == "cache" and place.folder.is_dir():
            remove_stale_parts(place.folder)  # a killed download's temporaries
    found = locate(places, spec)
    note = ""
    if found is None:
        if not download:
            raise _not_found(spec, places, None)
        try:
            folder, urls = fetch_dataset(spec, cache_dir, sources=sources, policy=policy)
        except DownloadError as err:
            raise _not_found(spec, places, summarize(err.attempts)) from None
        found = Place("cache", folder, False), scan(spec, folder)
        if urls:
            note = f" (downloaded from {', '.join(hosts(urls))})"
    place, contents = found
    arrays, _ = _read(spec, contents, place.label)
    return Dataset(
        spec,
        arrays["train_images"],
        arrays["train_labels"],
        arrays["test_images"],
        arrays["test_labels"],
        f"{contents.source}{note}",
        contents.folder,
    )


def load_dataset_ahead(name: str | DatasetSpec, data_dir: PathLike | None = None, **kw) -> Future:
    """`load_dataset(name, data_dir, **kw)` on a daemon thread, from now on: a Future of
    the Dataset, whose `result()` raises what loading raised. For a command that has
    other waiting to do meanwhile (opening an accelerator)."""
    future: Future = Future()

    def load() -> None:
        try:
            future.set_result(load_dataset(name, data_dir, **kw))
        except BaseException as e:  # noqa: BLE001  raised by the Future, to whoever waits
            future.set_exception(e)

    threading.Thread(target=load, name="jaxmnist-load-data", daemon=True).start()
    return future


def verify_dataset(
    name: str | DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    cache_dir: PathLike | None = None,
    system_root: PathLike | None = None,
) -> list[FileReport]:
    """Fully verify every file of `name` at the place `load_dataset` would use.

    Checks the IDX set and the npz when both are there. Returns one `FileReport`
    per verified array; raises `DataError` on the first bad file or if there is no
    data (never downloads).
    """
    spec = get_spec(name)
    places = search_path(spec, data_dir, cache_dir=cache_dir, system_root=system_root)
    found = locate(places, spec)
    if found is None:
        raise _not_found(spec, places, None)
    place, contents = found
    reports = []
    if contents.complete_idx:
        reports += _read(spec, Contents(contents.folder, contents.idx), place.label)[1]
    if contents.npz is not None:
        reports += _read(spec, Contents(contents.folder, {}, contents.npz), place.label)[1]
    return reports


def dataset_info(
    name: str | DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    cache_dir: PathLike | None = None,
    system_root: PathLike | None = None,
) -> dict:
    """Facts about `name` and where it would be loaded from (JSON-serialisable).

    `location` is the folder or npz `load_dataset` would read, or None (then
    `problem` says why); nothing is read or verified beyond file names.
    """
    spec = get_spec(name)
    places = search_path(spec, data_dir, cache_dir=cache_dir, system_root=system_root)
    location = kind = problem = None
    try:
        found = locate(places, spec)
    except DataError as err:
        found, problem = None, str(err)
    if found is not None:
        location = str(found[1].source)
        kind = "idx" if found[1].complete_idx else "npz"
    elif problem is None:
        problem = "not found locally; it will be downloaded on first use"
    return {
        "name": spec.name,
        "display_name": spec.display_name,
        "folder": spec.folder,
        "num_classes": spec.num_classes,
        "class_names": list(spec.class_names),
        "image_shape": list(spec.image_shape),
        "channels": spec.channels,
        "preprocessing": spec.preprocessing,
        "train_size": spec.train_size,
        "test_size": spec.test_size,
        "files": {f.name: f.sha256 for f in spec.files},
        "npz_name": spec.npz_name,
        "sources": list(spec.sources),
        "system_package": spec.system_package,
        "search_path": [{"place": p.label, "folder": str(p.folder)} for p in places],
        "location": location,
        "format": kind,
        "problem": problem,
    }
