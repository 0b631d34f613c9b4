"""Where a dataset's files may already be on disk, and which place wins.

Search order, first match wins: an explicit `data_dir` argument, else the
`JAXMNIST_DATA_DIR` environment variable; then the user cache
(`$XDG_CACHE_HOME/jaxmnist`, default `~/.cache/jaxmnist`); then the system folder
`/usr/share/datasets` (where Debian's `dataset-fashion-mnist` installs its .gz
files). Each root holds one folder per dataset (`<root>/mnist/…`,
`<root>/fashion-mnist/…`), as ../shared/datasets does; a `data_dir` may also be
the dataset folder itself. A folder "has" the dataset if it holds the four IDX
files (raw or .gz) or, for a spec with one, the npz. This module only looks at
names; reading and verifying is `formats`, downloading is `download`.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from jaxmnist.data.registry import ROLES, DatasetSpec
from jaxmnist.errors import DataError

ENV_DATA_DIR = "JAXMNIST_DATA_DIR"
SYSTEM_DATA_ROOT = Path("/usr/share/datasets")
"""Root of system-wide dataset folders; tests pass `system_root=` instead."""


def _home() -> Path:
    """$HOME, or the account's home folder when HOME is unset, empty or relative
    (Python reads `HOME=''` as `/`, which would put the cache in `/.cache`)."""
    home = os.environ.get("HOME", "")
    if os.path.isabs(home):
        return Path(home)
    import pwd

    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # no account entry (some containers)
        home = ""
    return Path(home) if os.path.isabs(home) else Path(tempfile.gettempdir())


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/jaxmnist`, or `~/.cache/jaxmnist` when that is unset."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if os.path.isabs(xdg) else _home() / ".cache"
    return base / "jaxmnist"


@dataclass(frozen=True)
class Place:
    """A folder that may hold one dataset, and how we came to look there."""

    label: str  # "data_dir", "JAXMNIST_DATA_DIR", "cache" or "system"
    folder: Path
    # The user pointed at it: an incomplete set of files there is an error,
    # not a reason to look elsewhere.
    explicit: bool


@dataclass(frozen=True)
class Contents:
    """The dataset files present in one folder (by name only, not yet verified)."""

    folder: Path
    idx: dict[str, Path] = field(default_factory=dict)  # role -> path, those present
    npz: Path | None = None

    @property
    def complete_idx(self) -> bool:
        return len(self.idx) == len(ROLES)

    @property
    def usable(self) -> bool:
        return self.complete_idx or self.npz is not None

    @property
    def source(self) -> Path:
        """What a load reads: the folder of IDX files, or the npz."""
        return self.folder if self.complete_idx or self.npz is None else self.npz


def _dataset_folder(root: Path, spec: DatasetSpec) -> Path:
    # `<root>/<folder>` is the documented layout; a root that is the dataset
    # folder itself is accepted too (checksums catch pointing at the wrong one).
    nested = root / spec.folder
    if nested.is_dir():
        return nested
    here = scan(spec, root)
    return root if here.idx or here.npz is not None else nested


def search_path(
    spec: DatasetSpec,
    data_dir: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    system_root: str | os.PathLike | None = None,
) -> list[Place]:
    """The folders to look in for `spec`, in order (see the module docstring)."""
    places = []
    if data_dir is not None:
        places.append(Place("data_dir", _dataset_folder(Path(data_dir), spec), True))
    elif os.environ.get(ENV_DATA_DIR):
        places.append(
            Place(ENV_DATA_DIR, _dataset_folder(Path(os.environ[ENV_DATA_DIR]), spec), True)
        )
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    places.append(Place("cache", cache / spec.folder, False))
    system = Path(system_root) if system_root is not None else SYSTEM_DATA_ROOT
    places.append(Place("system", system / spec.folder, False))
    return places


def scan(spec: DatasetSpec, folder: Path) -> Contents:
    """Which of `spec`'s files `folder` holds; raw IDX is preferred over .gz."""
    idx = {}
    for f in spec.files:
        for name in (f.name, f.name + ".gz"):
            if (folder / name).is_file():
                idx[f.role] = folder / name
                break
    npz = folder / spec.npz_name if spec.npz_name else None
    return Contents(folder, idx, npz if npz is not None and npz.is_file() else None)


def locate(places: list[Place], spec: DatasetSpec) -> tuple[Place, Contents] | None:
    """The first place that has `spec`'s data, or None.

    Raises `DataError` if a place the user pointed at holds only some of the IDX
    files (and no npz): silently using other data would hide their mistake.
    Incomplete cache folders are skipped (a download completes them).
    """
    for place in places:
        contents = scan(spec, place.folder)
        if contents.usable:
            return place, contents
        if contents.idx and place.explicit:
            missing = [f.name for f in spec.files if f.role not in contents.idx]
            raise DataError(
                f"{place.folder}: has some {spec.display_name} files but not "
                f"{', '.join(missing)} (raw or .gz)"
            )
    return None
