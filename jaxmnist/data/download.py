"""Downloading a dataset into the cache: mirrors, retries, verification, locking.

pooch's `HTTPDownloader` (requests underneath) does the HTTP transfer, bounded in
size and total time by `transfer`. pooch's own hash check is not used, because it
hashes the downloaded file and our checksums are of the uncompressed IDX content
(mirrors recompress, and npz containers differ). Instead each file goes to a
temporary name in the destination folder, is parsed and verified in full by
`formats`, and only then `os.replace`d into place; on any failure or interruption
the temporary file is deleted (one left by a killed process goes on the next run).
So a file under its final name has always been verified, whoever wrote it. A
`filelock` lock per dataset folder makes concurrent processes on an empty cache
wait for one downloader instead of all fetching; a waiter says so on stderr and
gives up after `DownloadPolicy.lock_wait`. A complete cache is used without the
lock, so a read-only one works.

Sources are tried in the spec's order (for MNIST the Keras npz first: one request
for everything). Per URL, transient failures (connection errors, timeouts, a
connection closed early, HTTP 5xx/408/429) are retried `retries` times with
exponential backoff, all within the per-file `deadline`; anything else (404, a web
page, too many bytes, bad content) moves straight on to the next source. A host
that cannot be reached, or is too slow, is skipped for the remaining files. .gz
mirrors are used per file, so the four files may come from different mirrors. A
full disk stops the download at once, naming the file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from jaxmnist.data import formats, transfer
from jaxmnist.data.locate import default_cache_dir, scan
from jaxmnist.data.registry import DatasetSpec, get_spec
from jaxmnist.errors import DataError, WriteError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DownloadPolicy:
    """How hard to try and how long to wait.

    `timeout` (s) bounds connecting and each read; `deadline` (s) bounds each file
    from one mirror in total, retries included (a trickling server cannot hold the
    download, or the lock, longer); `retries` per URL on transient errors, the
    first `backoff` wait (s, doubling each retry); `lock_wait` (s): how long to wait
    for another process downloading the same dataset before giving up; whether to
    draw a `progressbar` (needs tqdm installed; silently off without it).
    """

    timeout: float = 30.0
    retries: int = 2
    backoff: float = 1.0
    progressbar: bool = False
    deadline: float = 300.0
    lock_wait: float = 900.0


LOCK_NOTICE_SECONDS = 2.0
"""How long a process waits on another's download lock before saying so on stderr."""


class DownloadError(DataError):
    """No source gave a verified copy; `attempts` is (url, reason) per failure."""

    def __init__(self, message: str, attempts: list[tuple[str, str]]):
        super().__init__(message)
        self.attempts = attempts


def hosts(urls) -> list[str]:
    """Distinct hosts of `urls`, in order (for short messages)."""
    return list(dict.fromkeys(urlsplit(u).netloc or u for u in urls))


def _fetch(url: str, dest: Path, policy: DownloadPolicy, max_bytes: int) -> None:
    """Download `url` to `dest`, retrying transient failures with backoff, all within
    `policy.deadline` seconds."""
    # pooch draws its progress bar with tqdm, an optional dependency: without it,
    # no bar rather than an error.
    bar = policy.progressbar and importlib.util.find_spec("tqdm") is not None
    give_up_at = time.monotonic() + policy.deadline
    too_slow = f"too slow: no complete file within {policy.deadline:g} s"
    for attempt in range(policy.retries + 1):
        left = give_up_at - time.monotonic()
        if left <= 0:
            raise transfer.TooSlow(too_slow)
        try:
            transfer.fetch(
                url,
                dest,
                max_bytes=max_bytes,
                deadline=left,
                timeout=policy.timeout,
                progressbar=bar,
            )
            return
        except transfer.TooSlow:
            raise transfer.TooSlow(too_slow) from None
        except transfer.TransferError as err:
            if not err.transient or attempt == policy.retries:
                raise
            wait = min(policy.backoff * 2**attempt, max(0.0, give_up_at - time.monotonic()))
            log.warning("%s: %s; retrying in %.1f s", url, err.reason, wait)
            time.sleep(wait)


def _fetch_verified(
    url: str, folder: Path, policy: DownloadPolicy, max_bytes: int, verify, final_name
) -> Path:
    """Fetch `url` into `folder`, run `verify(tmp_path)`, then rename into place.

    `final_name(tmp_path)` picks the name (it may depend on the content: raw or
    gzip). The temporary file never survives a failure or an interrupt; one left by
    a killed process is removed later (`remove_stale_parts`).
    """
    # A unique hidden name, created with open(..., "x") so it gets the umask's
    # permissions (mkstemp's 0600 would make a shared cache unreadable to others).
    tmp = folder / f".{Path(urlsplit(url).path).name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        try:
            open(tmp, "xb").close()
        except OSError as e:
            raise WriteError.from_os_error(e, tmp) from None
        log.info("downloading %s", url)
        _fetch(url, tmp, policy, max_bytes)
        verify(tmp)
        dest = folder / final_name(tmp)
        try:
            os.replace(tmp, dest)
        except OSError as e:
            raise WriteError.from_os_error(e, dest) from None
        return dest
    finally:
        tmp.unlink(missing_ok=True)


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == formats.GZIP_MAGIC


def _valid_files(spec: DatasetSpec, folder: Path, quiet: bool = False) -> tuple[bool, set[str]]:
    """(npz is valid, roles whose IDX file is valid) among files already in `folder`."""
    contents = scan(spec, folder)
    good = set()
    for role, path in contents.idx.items():
        try:
            formats.load_idx_file(path, spec, role)
            good.add(role)
        except DataError as err:
            if not quiet:
                log.warning("will replace %s: %s", path, err)
    if contents.npz is not None:
        try:
            formats.load_npz(contents.npz, spec)
            return True, good
        except DataError as err:
            if not quiet:
                log.warning("will replace %s: %s", contents.npz, err)
    return False, good


def _complete(spec: DatasetSpec, folder: Path, quiet: bool = False) -> bool:
    npz_ok, good = _valid_files(spec, folder, quiet)
    return npz_ok or len(good) == len(spec.files)


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

    def attempt(url, max_bytes, verify, final_name) -> Path | None:
        try:
            return _fetch_verified(url, folder, policy, max_bytes, verify, final_name)
        except WriteError:
            raise  # a full disk here: no other mirror can help
        except transfer.TransferError as err:
            attempts.append((url, err.reason))
            if err.skip_host:
                unreachable.add(hosts([url])[0])
        except DataError as err:  # the content failed verification
            attempts.append((url, str(err).removeprefix(f"{url}: ")))
        log.warning("%s: %s", url, attempts[-1][1])
        return None

    npz_bytes = formats.size_cap(sum(formats.expected_idx_size(spec, f.role) for f in spec.files))
    for source in sources:
        if hosts([source])[0] in unreachable:  # offline, down or too slow: skip it
            continue
        if source.endswith(".npz"):
            if spec.npz_name and attempt(
                source,
                npz_bytes,
                lambda p, u=source: formats.load_npz(p, spec, label=u),
                lambda _: spec.npz_name,
            ):
                return fetched + [source]
            continue
        for f in list(missing):
            url = source.rstrip("/") + "/" + f.name + ".gz"
            dest = attempt(
                url,
                formats.size_cap(formats.expected_idx_size(spec, f.role)),
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
    """`mirror host: reason` per distinct failure, e.g. for 4 files x 3 mirrors, one line."""
    counts: dict[tuple[str, str], int] = {}
    for url, reason in attempts:
        key = (hosts([url])[0], reason)
        counts[key] = counts.get(key, 0) + 1
    return (
        "; ".join(
            f"mirror {h}: {r}" + (f" ({n} files)" if n > 1 else "") for (h, r), n in counts.items()
        )
        or "no sources given"
    )


@contextlib.contextmanager
def _download_lock(spec: DatasetSpec, folder: Path, policy: DownloadPolicy):
    """Hold `folder`'s lock; say so on stderr when another process holds it, and give
    up with a clear message after `policy.lock_wait` seconds."""
    import filelock

    lock = filelock.FileLock(folder / ".lock")
    notice = min(LOCK_NOTICE_SECONDS, policy.lock_wait)
    try:
        try:
            lock.acquire(timeout=notice)
        except filelock.Timeout:
            # A warning reaches stderr even when nothing configured logging.
            log.warning(
                "waiting for another jaxmnist process to finish downloading %s into %s …",
                spec.name,
                folder,
            )
            lock.acquire(timeout=max(0.0, policy.lock_wait - notice))
    except filelock.Timeout:
        raise DataError(
            f"gave up after {policy.lock_wait:g} s waiting for another jaxmnist process to "
            f"finish downloading {spec.name} into {folder} (it holds {folder / '.lock'}); "
            "try again when it has finished"
        ) from None
    except OSError as e:
        raise DataError(f"{folder}: cannot lock the cache folder ({e.strerror or e})") from None
    try:
        yield
    finally:
        lock.release()


def remove_stale_parts(folder: Path) -> None:
    """Delete the `.part` temporaries that killed downloads left in `folder`.

    A live download holds the folder's lock for as long as its temporaries exist,
    so when the lock can be taken at once, every `.part` file there is stale. Cheap
    when there is none; does nothing when the folder cannot be locked (read-only,
    or a download is running).
    """
    if not any(folder.glob(".*.part")):
        return
    import filelock

    try:
        with filelock.FileLock(folder / ".lock", timeout=0):
            for stale in folder.glob(".*.part"):
                stale.unlink(missing_ok=True)
    except (filelock.Timeout, OSError):
        pass


def fetch_dataset(
    spec: DatasetSpec, cache_dir=None, *, sources=None, policy: DownloadPolicy | None = None
) -> tuple[Path, list[str]]:
    """Like `download_dataset`, also returning the URLs actually fetched."""
    folder = Path(cache_dir if cache_dir is not None else default_cache_dir()) / spec.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"{folder}: cannot create the cache folder ({e.strerror or e})") from None
    # Verified files can be read by anyone: a complete (perhaps read-only) cache needs
    # no lock. Problems are reported under the lock, where they get fixed.
    if _complete(spec, folder, quiet=True):
        return folder, []
    policy = policy or DownloadPolicy()
    with _download_lock(spec, folder, policy):
        sources = spec.sources if sources is None else tuple(sources)
        urls = _download_into(spec, folder, sources, policy)
    return folder, urls


def download_dataset(
    name: str | DatasetSpec,
    cache_dir: str | os.PathLike | None = None,
    *,
    sources: list[str] | tuple[str, ...] | None = None,
    policy: DownloadPolicy | None = None,
) -> Path:
    """Ensure a verified copy of dataset `name` in the cache; return its folder.

    Files already in `<cache_dir>/<folder>` that verify are kept (no network, no
    lock); corrupt ones are replaced. `sources` overrides the spec's URLs (an entry
    ending in `.npz` is an npz URL, anything else a base URL for the .gz files).
    Raises `DownloadError` (a `DataError`) naming each source's failure, or
    `WriteError` when the disk is full.
    """
    return fetch_dataset(get_spec(name), cache_dir, sources=sources, policy=policy)[0]
