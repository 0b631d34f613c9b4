"""One HTTP transfer into a file, bounded in size and in total time, with short reasons.

pooch's `HTTPDownloader` (requests underneath) does the transfer; this module bounds
it, because requests alone cannot: its `timeout` applies to each socket read and
restarts with every byte (a server trickling one byte a second is never timed out),
and nothing stops an endless body or a gzip `Content-Encoding` that inflates without
end. So:

- pooch writes the body into a `_Sink` (it accepts any object with `write`), which
  counts the decoded bytes and stops past `max_bytes`, recognises a web page in the
  first chunk, and turns a full disk into `WriteError` naming the file;
- the transfer runs in a daemon thread and the caller waits at most `deadline`
  seconds. Then the sink refuses further writes and the response's socket is shut
  down (urllib3's `HTTPResponse.shutdown`, meant for unblocking a read from another
  thread), which ends the worker's read at once. A worker still before its response
  (name lookup, a server trickling its headers) is left to its per-read timeout; it
  can no longer write anything.

Every failure becomes a `TransferError` with a short `reason` for the per-mirror
summary ("connection closed after 100 of 5000 bytes"), never urllib3's raw text.
"""

from __future__ import annotations

import threading
from pathlib import Path

from jaxmnist.data import formats
from jaxmnist.errors import DataError, JaxmnistError, WriteError

REASON_MAX = 160
"""Longest reason kept from an exception's text (some are a kilobyte of urllib3 repr)."""

_NOT_A_PAGE = (formats.GZIP_MAGIC, b"PK", b"\0\0")  # gzip, zip (npz), raw IDX


class TransferError(DataError):
    """A transfer that gave no file. `reason` is short (it follows "mirror X: ");
    `transient`: worth retrying the same URL; `skip_host`: when retries are spent, do
    not ask this host for the other files."""

    def __init__(self, reason: str, *, transient: bool = False, skip_host: bool = False):
        super().__init__(reason)
        self.reason, self.transient, self.skip_host = reason, transient, skip_host


class TooSlow(TransferError):
    """The deadline passed before the file was complete."""

    def __init__(self, reason: str):
        super().__init__(reason, skip_host=True)


class _Stopped(Exception):
    """Raised into the worker when the caller has given up on it."""


class _Sink:
    """The file-like object pooch writes to: counts, caps, sniffs, and can be stopped."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes, self.count = path, max_bytes, 0
        self._lock = threading.Lock()
        self._stopped = False
        try:
            # Closed by close(), which the caller always reaches (a `finally`).
            self._fh = open(path, "wb")  # noqa: SIM115
        except OSError as e:
            raise WriteError.from_os_error(e, path) from None

    def write(self, chunk: bytes) -> int:
        with self._lock:
            if self._stopped:
                raise _Stopped
            first = not self.count and not chunk.startswith(_NOT_A_PAGE)
            if first and formats.looks_like_html(chunk):
                raise TransferError("returned a web page instead of data")
            self.count += len(chunk)
            if self.count > self.max_bytes:
                raise TransferError(
                    f"sent more than {self.max_bytes:,} bytes, more than this file can be; "
                    "not the expected data"
                )
            try:
                return self._fh.write(chunk)
            except OSError as e:
                raise WriteError.from_os_error(e, self.path) from None

    def flush(self) -> None:
        with self._lock:
            if self._stopped:
                raise _Stopped
            try:
                self._fh.flush()
            except OSError as e:
                raise WriteError.from_os_error(e, self.path) from None

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    def close(self) -> None:
        """Stops the sink and closes the file (flushing it: a full disk may show only now)."""
        with self._lock:
            self._stopped = True
            try:
                self._fh.close()
            except OSError as e:
                raise WriteError.from_os_error(e, self.path) from None


def _shutdown(response) -> None:
    """Ends a blocked read of `response`'s body from another thread, if it has begun."""
    raw = getattr(response, "raw", None)
    try:
        raw.shutdown()
    except (AttributeError, ValueError, RuntimeError, OSError):
        pass  # no socket any more (already released or closed): nothing blocks on it


def _reason(err: BaseException, sink: _Sink, response) -> TransferError:
    """A requests/urllib3 exception as a short `TransferError`."""
    import requests  # deferred: requests is only needed when downloading

    if isinstance(err, requests.HTTPError) and err.response is not None:
        status = err.response.status_code
        return TransferError(f"HTTP {status}", transient=status >= 500 or status in (408, 429))
    if isinstance(err, requests.exceptions.ChunkedEncodingError):
        got = getattr(getattr(response, "raw", None), "tell", lambda: sink.count)()
        length = response.headers.get("Content-Length") if response is not None else None
        of = f" of {int(length):,}" if length and length.isdigit() else ""
        return TransferError(f"connection closed after {got:,}{of} bytes", transient=True)
    if isinstance(err, requests.exceptions.ContentDecodingError):
        return TransferError("sent corrupt compressed data")
    if isinstance(err, requests.Timeout):
        return TransferError("timed out", transient=True, skip_host=True)
    if isinstance(err, requests.ConnectionError):
        return TransferError("connection failed", transient=True, skip_host=True)
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return TransferError(text[:REASON_MAX])


def fetch(
    url: str,
    dest: Path,
    *,
    max_bytes: int,
    deadline: float,
    timeout: float,
    progressbar: bool = False,
) -> None:
    """Download `url` into `dest` (created or truncated), in at most `deadline` seconds.

    `timeout` bounds connecting and each read; `max_bytes` bounds the decoded body.
    Raises `TransferError` (`TooSlow` past the deadline) or `WriteError`; a
    KeyboardInterrupt while waiting stops the transfer and propagates. `dest` may
    hold a partial body afterwards: the caller deletes it.
    """
    import pooch

    seen: dict = {}
    outcome: dict = {}

    def on_response(response, *args, **kwargs):
        seen["response"] = response
        length = response.headers.get("Content-Length", "")
        encoded = response.headers.get("Content-Encoding", "identity") != "identity"
        if response.ok and length.isdigit() and int(length) > max_bytes and not encoded:
            response.close()
            raise TransferError(
                f"announced {int(length):,} bytes, more than the {max_bytes:,} this file can be"
            )
        return response

    downloader = pooch.HTTPDownloader(
        progressbar=progressbar,
        timeout=timeout,
        chunk_size=1 << 16,
        hooks={"response": on_response},
    )

    def work() -> None:
        try:
            downloader(url, sink, None)
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
            outcome["error"] = e

    worker = threading.Thread(target=work, name="jaxmnist-download", daemon=True)
    sink = _Sink(dest, max_bytes)
    late = False
    try:
        worker.start()
        worker.join(deadline)
    finally:  # also when the wait is interrupted (Ctrl-C)
        if worker.is_alive():
            late = True
            sink.stop()
            _shutdown(seen.get("response"))
            worker.join(1.0)
        if seen.get("response") is not None:
            seen["response"].close()  # pooch leaves a failed streaming response open
        try:
            sink.close()
        except WriteError:
            if not late and "error" not in outcome:
                raise  # else the transfer failed anyway: its own reason is the one to report
    if late:
        raise TooSlow(f"too slow: no complete file within {deadline:g} s")
    err = outcome.get("error")
    if err is None:
        return
    if isinstance(err, (JaxmnistError, KeyboardInterrupt)):
        raise err
    raise _reason(err, sink, seen.get("response")) from None
