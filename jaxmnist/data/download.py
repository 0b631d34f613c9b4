"""Downloading a dataset into the cache: mirrors, retries, verification, locking.

pooch's `HTTPDownloader` (requests underneath) does the HTTP transfer. pooch's own
hash check is not used, because it hashes the downloaded file and our checksums are
of the uncompressed IDX content (mirrors recompress, and npz containers differ).
Instead each file goes to a temporary name in the destination folder, is parsed
and verified in full by `formats`, and only then `os.replace`d into place; on any
failure or interruption the temporary file is deleted. So a file under its final
name has always been verified, whoever wrote it. A `filelock` lock per dataset
folder makes concurrent processes on an empty cache wait for one downloader
instead of all fetching.

Sources are tried in the spec's order (for MNIST the Keras npz first: one request
for everything). Per URL, transient failures (connection errors, timeouts, HTTP
5xx/408/429) are retried `retries` times with exponential backoff; anything else
(404, bad content) moves straight on to the next source. .gz mirrors are used per
file, so the four files may come from different mirrors.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from jaxmnist.data import formats
from jaxmnist.data.locate import default_cache_dir, scan
from jaxmnist.data.registry import DatasetSpec, get_spec
from jaxmnist.errors import DataError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DownloadPolicy:
    """How hard to try: per-request `timeout` (s), `retries` per URL on transient
    errors, first `backoff` wait (s, doubling each retry), and whether to draw a
    `progressbar` (needs tqdm installed; silently off without it)."""

    timeout: float = 30.0
    retries: int = 2
    backoff: float = 1.0
    progressbar: bool = False


class DownloadError(DataError):
    """No source gave a verified copy; `attempts` is (url, reason) per failure."""

    def __init__(self, message: str, attempts: list[tuple[str, str]]):
        super().__init__(message)
        self.attempts = attempts


def hosts(urls) -> list[str]:
    """Distinct hosts of `urls`, in order (for short messages)."""
    return list(dict.fromkeys(urlsplit(u).netloc or u for u in urls))


def _is_transient(err: Exception) -> bool:
    import requests  # deferred: requests is only needed when downloading

    if isinstance(err, requests.HTTPError):
        status = err.response.status_code if err.response is not None else 0
        return status >= 500 or status in (408, 429)
    return isinstance(
        err, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
    )


UNREACHABLE = ("connection failed", "timed out")
"""Reasons that condemn a host for the rest of a download, not just one file."""


def _reason(err: Exception, url: str) -> str:
    import requests

    if isinstance(err, requests.HTTPError) and err.response is not None:
        return f"HTTP {err.response.status_code}"
    if isinstance(err, requests.Timeout):
        return "timed out"
    if isinstance(err, requests.ConnectionError):
        return "connection failed"
    return str(err).removeprefix(f"{url}: ")


def _fetch(url: str, dest: Path, policy: DownloadPolicy) -> None:
    """Download `url` to `dest`, retrying transient failures with backoff."""
    import pooch

    # pooch draws its progress bar with tqdm, an optional dependency: without it,
    # no bar rather than an error.
    bar = policy.progressbar and importlib.util.find_spec("tqdm") is not None
    downloader = pooch.HTTPDownloader(progressbar=bar, timeout=policy.timeout, chunk_size=1 << 16)
    for attempt in range(policy.retries + 1):
        try:
            downloader(url, str(dest), None)
            return
        except OSError as err:  # requests' exceptions are OSErrors
            if not _is_transient(err) or attempt == policy.retries:
                raise
            wait = policy.backoff * 2**attempt
            log.warning("%s: %s; retrying in %.1f s", url, _reason(err, url), wait)
            time.sleep(wait)


def _fetch_verified(url: str, folder: Path, policy: DownloadPolicy, verify, final_name) -> Path:
    """Fetch `url` into `folder`, run `verify(tmp_path)`, then rename into place.

    `final_name(tmp_path)` picks the name (it may depend on the content: raw or
    gzip). The temporary file never survives a failure or an interrupt.
    """
    # A unique hidden name, created with open(..., "x") so it gets the umask's
    # permissions (mkstemp's 0600 would make a shared cache unreadable to others).
    tmp = folder / f".{Path(urlsplit(url).path).name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        open(tmp, "xb").close()
        log.info("downloading %s", url)
        _fetch(url, tmp, policy)
        verify(tmp)
        dest = folder / final_name(tmp)
        os.replace(tmp, dest)
        return dest
    finally:
        tmp.unlink(missing_ok=True)


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == formats.GZIP_MAGIC


def _valid_files(spec: DatasetSpec, folder: Path) -> tuple[bool, set[str]]:
    """(npz is valid, roles whose IDX file is valid) among files already in `folder`."""
    contents = scan(spec, folder)
    good = set()
    for role, path in contents.idx.items():
        try:
            formats.load_idx_file(path, spec, role)
            good.add(role)
        except DataError as err:
            log.warning("will replace %s: %s", path, err)
    if contents.npz is not None:
        try:
            formats.load_npz(contents.npz, spec)
            return True, good
        except DataError as err:
            log.warning("will replace %s: %s", contents.npz, err)
    return False, good


def _download_into(
    spec: DatasetSpec, folder: Path, sources: tuple[str, ...], policy: DownloadPolicy
) -> list[str]:
    """Make `folder` hold a verified copy of `spec`; returns the URLs fetched."""
    for stale in folder.glob(".*.part"):  # left by a killed process; we hold the lock
        stale.unlink(missing_ok=True)
    npz_ok, good = _valid_files(spec, folder)
    missing = [f for f in spec.files if f.role not in good]
    if npz_ok or not missing:
        return []
    fetched: list[str] = []
    attempts: list[tuple[str, str]] = []
    unreachable: set[str] = set()  # hosts that failed to connect even after retries

    def attempt(url, verify, final_name) -> Path | None:
        try:
            return _fetch_verified(url, folder, policy, verify, final_name)
        except (DataError, OSError) as err:  # requests' errors are OSErrors too
            attempts.append((url, _reason(err, url)))
            log.warning("%s: %s", url, attempts[-1][1])
            if attempts[-1][1] in UNREACHABLE:
                unreachable.add(hosts([url])[0])
            return None

    for source in sources:
        if hosts([source])[0] in unreachable:  # offline or down: no use asking it again
            continue
        if source.endswith(".npz"):
            if spec.npz_name and attempt(
                source,
                lambda p, u=source: formats.load_npz(p, spec, label=u),
                lambda _: spec.npz_name,
            ):
                return fetched + [source]
            continue
        for f in list(missing):
            url = source.rstrip("/") + "/" + f.name + ".gz"
            dest = attempt(
                url,
                lambda p, u=url, r=f.role: formats.load_idx_file(p, spec, r, label=u),
                lambda p, n=f.name: n + ".gz" if _is_gzip(p) else n,
            )
            if dest is None:
                if hosts([url])[0] in unreachable:
                    break
                continue
            # Drop a stale copy under the other name (raw vs .gz) so scans agree.
            other = f.name if dest.name.endswith(".gz") else f.name + ".gz"
            (folder / other).unlink(missing_ok=True)
            fetched.append(url)
            missing.remove(f)
        if not missing:
            return fetched
    raise DownloadError(
        f"could not download {spec.display_name} into {folder}: {summarize(attempts)}", attempts
    )


def summarize(attempts: list[tuple[str, str]]) -> str:
    """`host: reason` per distinct failure, e.g. for 4 files x 3 mirrors, one line."""
    counts: dict[tuple[str, str], int] = {}
    for url, reason in attempts:
        key = (hosts([url])[0], reason)
        counts[key] = counts.get(key, 0) + 1
    return (
        "; ".join(f"{h}: {r}" + (f" ({n} files)" if n > 1 else "") for (h, r), n in counts.items())
        or "no sources given"
    )


def fetch_dataset(
    spec: DatasetSpec, cache_dir=None, *, sources=None, policy: DownloadPolicy | None = None
) -> tuple[Path, list[str]]:
    """Like `download_dataset`, also returning the URLs actually fetched."""
    import filelock

    folder = Path(cache_dir if cache_dir is not None else default_cache_dir()) / spec.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"{folder}: cannot create the cache folder ({e.strerror or e})") from None
    with filelock.FileLock(folder / ".lock"):
        sources = spec.sources if sources is None else tuple(sources)
        urls = _download_into(spec, folder, sources, policy or DownloadPolicy())
    return folder, urls


def download_dataset(
    name: str | DatasetSpec,
    cache_dir: str | os.PathLike | None = None,
    *,
    sources: list[str] | tuple[str, ...] | None = None,
    policy: DownloadPolicy | None = None,
) -> Path:
    """Ensure a verified copy of dataset `name` in the cache; return its folder.

    Files already in `<cache_dir>/<folder>` that verify are kept (no network);
    corrupt ones are replaced. `sources` overrides the spec's URLs (an entry ending
    in `.npz` is an npz URL, anything else a base URL for the .gz files).
    Raises `DownloadError` (a `DataError`) naming each source's failure.
    """
    return fetch_dataset(get_spec(name), cache_dir, sources=sources, policy=policy)[0]
