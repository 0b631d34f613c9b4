"""MNIST-family datasets: find, download, verify and load them as uint8 arrays.

`load_dataset("mnist")` returns a `Dataset` of read-only uint8 arrays, every file
checked against the SHA-256 of its uncompressed IDX content. Modules: `registry`
(the facts about each dataset: image shape, classes, files, how a person's image is
preprocessed), `formats` (parsing and checks), `locate` (where
files may be), `download` (mirrors, retries, cache), `dataset` (this API) and
`synthetic` (tiny valid datasets for tests).
"""

from jaxmnist.data.dataset import Dataset, dataset_info, load_dataset, verify_dataset
from jaxmnist.data.download import DownloadPolicy, download_dataset
from jaxmnist.data.formats import FileReport
from jaxmnist.data.locate import default_cache_dir
from jaxmnist.data.registry import DATASETS, DatasetSpec, get_spec

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
    "verify_dataset",
]
