"""MNIST-family datasets: find, download, verify and load them as uint8 arrays.

`load_dataset("mnist")` returns a `Dataset` of read-only uint8 arrays, every file
checked against the SHA-256 of its uncompressed IDX content. Modules: `registry`
(the facts about each dataset: image shape, classes, files, how a person's image is
preprocessed), `formats` (parsing and checks), `locate` (where
files may be), `download` (mirrors, retries, cache), `dataset` (this API) and
`synthetic` (tiny valid datasets for tests).

The names below are imported on first use, so that reading the registry (the command
line's `--help` lists the datasets) does not import numpy.
"""

import importlib

_PUBLIC = {  # name -> the module that defines it
    "DATASETS": "jaxmnist.data.registry",
    "Dataset": "jaxmnist.data.dataset",
    "DatasetSpec": "jaxmnist.data.registry",
    "DownloadPolicy": "jaxmnist.data.download",
    "FileReport": "jaxmnist.data.formats",
    "dataset_info": "jaxmnist.data.dataset",
    "default_cache_dir": "jaxmnist.data.locate",
    "download_dataset": "jaxmnist.data.download",
    "get_spec": "jaxmnist.data.registry",
    "load_dataset": "jaxmnist.data.dataset",
    "load_dataset_ahead": "jaxmnist.data.dataset",
    "verify_dataset": "jaxmnist.data.dataset",
}

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetSpec",
    "DownloadPolicy",
    "FileReport",
    "dataset_info",
    "default_cache_dir",
    "download_dataset",
    "get_spec",
    "load_dataset",
    "load_dataset_ahead",
    "verify_dataset",
]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'jaxmnist.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
