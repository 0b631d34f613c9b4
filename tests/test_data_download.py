"""Downloads against a local HTTP server on 127.0.0.1: mirrors, retries, cache, concurrency.

The tiny synthetic spec's checksums match the files the server hands out, so the
real verification runs on every download.
"""

import gzip
import http.server
import multiprocessing
import threading
import time

import numpy as np
import pooch
import pytest

from jaxmnist.data import DownloadPolicy, download_dataset, load_dataset, synthetic
from jaxmnist.data.registry import ROLES
from jaxmnist.errors import DataError, WriteError

FAST = DownloadPolicy(timeout=5.0, retries=1, backoff=0.0)
IDX_NAMES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


class Server:
    """Serves `routes[path]`: a list of responses used in turn (the last repeats).

    A response is `(status, body)`, or `(status, body, declared_length)` to send a
    Content-Length larger than the body and hang up (an interrupted transfer), or
    `(status, write)` where `write(handler)` sends headers and body itself.
    `hits[path]` counts requests; `delay` slows every response.
    """

    def __init__(self):
        self.routes, self.hits, self.delay = {}, {}, 0.0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                time.sleep(server.delay)
                responses = server.routes.get(self.path, [(404, b"<html>404</html>")])
                resp = responses[min(server.hits[self.path], len(responses)) - 1]
                status, body = resp[0], resp[1]
                self.send_response(status)
                if callable(body):
                    return body(self)
                self.send_header("Content-Length", str(resp[2] if len(resp) > 2 else len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def serve(self, prefix, files, *responses_before):
        """Serve `files` ({name: bytes}) under `prefix`, after `responses_before`."""
        for name, data in files.items():
            self.routes[f"/{prefix}/{name}"] = [*responses_before, (200, data)]
        return f"{self.base}/{prefix}/"

    def stop(self):
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join()
            self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("JAXMNIST_DATA_DIR", raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


def gz_files(arrays):
    return {
        f"{n}.gz": gzip.compress(synthetic.idx_bytes(arrays[r])) for n, r in zip(IDX_NAMES, ROLES)
    }


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name != ".lock" and p.name.startswith("."))


def assert_valid_cache(folder, spec, arrays):
    ds = load_dataset(spec, download=False, cache_dir=folder.parent, system_root=folder / "none")
    for role in ROLES:
        np.testing.assert_array_equal(getattr(ds, role), arrays[role])
    assert leftovers(folder) == []


def test_download_gz_then_load(tmp_path, server, arrays, spec):
    url = server.serve("m", gz_files(arrays))
    ds = load_dataset(
        spec, cache_dir=tmp_path / "c", system_root=tmp_path / "s", sources=[url], policy=FAST
    )
    for role in ROLES:
        np.testing.assert_array_equal(getattr(ds, role), arrays[role])
    folder = tmp_path / "c" / spec.folder
    assert sorted(p.name for p in folder.glob("*.gz")) == sorted(f"{n}.gz" for n in IDX_NAMES)
    assert ds.source == f"{folder} (downloaded from 127.0.0.1:{server.httpd.server_address[1]})"
    assert leftovers(folder) == []


def test_download_npz(tmp_path, server, arrays, spec):
    server.routes["/k/mnist.npz"] = [(200, synthetic.npz_bytes(arrays))]
    folder = download_dataset(
        spec, tmp_path / "c", sources=[server.base + "/k/mnist.npz"], policy=FAST
    )
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == ["mnist.npz"]
    assert_valid_cache(folder, spec, arrays)


def test_raw_content_under_gz_url_is_stored_raw(tmp_path, server, arrays, spec):
    raw = {f"{n}.gz": synthetic.idx_bytes(arrays[r]) for n, r in zip(IDX_NAMES, ROLES)}
    folder = download_dataset(spec, tmp_path / "c", sources=[server.serve("raw", raw)], policy=FAST)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(
        IDX_NAMES
    )
    assert_valid_cache(folder, spec, arrays)


def test_checksum_failure_moves_to_next_mirror(tmp_path, server, arrays, spec, caplog):
    wrong = server.serve("wrong", gz_files(synthetic.tiny_arrays(seed=1)))
    good = server.serve("good", gz_files(arrays))
    folder = download_dataset(spec, tmp_path / "c", sources=[wrong, good], policy=FAST)
    assert_valid_cache(folder, spec, arrays)
    for name in IDX_NAMES:  # bad content is not retried on the same mirror
        assert server.hits[f"/wrong/{name}.gz"] == 1 and server.hits[f"/good/{name}.gz"] == 1
    assert "SHA-256" in caplog.text


def test_404_and_500_mirrors_fall_back(tmp_path, server, arrays, spec):
    missing = f"{server.base}/missing/"
    broken = server.serve("broken", gz_files(arrays), (500, b"oops"), (500, b"oops"))
    html = server.serve("html", {f"{n}.gz": b"<!DOCTYPE html><p>moved</p>" for n in IDX_NAMES})
    good = server.serve("good", gz_files(arrays))
    folder = download_dataset(
        spec, tmp_path / "c", sources=[missing, broken, html, good], policy=FAST
    )
    assert_valid_cache(folder, spec, arrays)
    name = "train-images-idx3-ubyte.gz"
    assert server.hits[f"/missing/{name}"] == 1  # 404 is final
    assert server.hits[f"/broken/{name}"] == 2  # 500 is retried once (FAST.retries)
    assert server.hits[f"/html/{name}"] == 1 and server.hits[f"/good/{name}"] == 1


def test_transient_failure_is_retried_on_same_mirror(tmp_path, server, arrays, spec):
    url = server.serve("flaky", gz_files(arrays), (503, b"busy"))
    folder = download_dataset(spec, tmp_path / "c", sources=[url], policy=FAST)
    assert_valid_cache(folder, spec, arrays)
    assert all(server.hits[f"/flaky/{n}.gz"] == 2 for n in IDX_NAMES)


def test_unreachable_host_is_not_asked_for_every_file(tmp_path, server, arrays, spec, caplog):
    dead = Server()
    dead_url = f"{dead.base}/m/"
    dead.stop()  # nothing listens on its port any more: connection refused
    good = server.serve("good", gz_files(arrays))
    folder = download_dataset(
        spec, tmp_path / "c", sources=[dead_url, dead.base + "/npz/x.npz", good], policy=FAST
    )
    assert_valid_cache(folder, spec, arrays)
    asked = {r.getMessage().split(": ")[0] for r in caplog.records if dead.base in r.getMessage()}
    assert asked == {dead_url + "train-images-idx3-ubyte.gz"}  # one file, then the host is skipped


def test_cache_hit_needs_no_network(tmp_path, server, arrays, spec):
    url = server.serve("m", gz_files(arrays))
    folder = download_dataset(spec, tmp_path / "c", sources=[url], policy=FAST)
    server.stop()
    assert download_dataset(spec, tmp_path / "c", sources=[url], policy=FAST) == folder
    ds = load_dataset(spec, cache_dir=tmp_path / "c", system_root=tmp_path / "s", sources=[url])
    assert ds.source == str(folder)
    assert sum(server.hits.values()) == 4


def test_offline_everywhere_is_one_clear_line(tmp_path, server, spec):
    url = f"{server.base}/m/"
    server.stop()
    start = time.perf_counter()
    with pytest.raises(DataError) as info:
        load_dataset(
            spec,
            tmp_path / "mine",
            cache_dir=tmp_path / "c",
            system_root=tmp_path / "s",
            sources=[url],
            policy=FAST,
        )
    assert time.perf_counter() - start < 10
    msg = str(info.value)
    assert "\n" not in msg
    for part in (
        str(tmp_path / "mine"),
        str(tmp_path / "c"),
        str(tmp_path / "s"),
        "download failed",
        "127.0.0.1",
        "connection failed",
        "--data-dir",
        "JAXMNIST_DATA_DIR",
        "jaxmnist data download",
    ):
        assert part in msg
    assert leftovers(tmp_path / "c" / spec.folder) == []


def test_truncated_transfer_leaves_nothing(tmp_path, server, arrays, spec):
    files = gz_files(arrays)
    name = "train-images-idx3-ubyte.gz"
    server.routes[f"/cut/{name}"] = [(200, files[name][:100], len(files[name]))]
    with pytest.raises(DataError, match="could not download"):
        download_dataset(spec, tmp_path / "c", sources=[f"{server.base}/cut/"], policy=FAST)
    folder = tmp_path / "c" / spec.folder
    assert list(folder.glob("train-images*")) == [] and leftovers(folder) == []
    assert server.hits[f"/cut/{name}"] == 2  # a broken transfer counts as transient


def test_interrupted_download_leaves_nothing(tmp_path, monkeypatch, server, arrays, spec):
    def interrupted(self, url, output_file, pooch_, check_only=False):
        output_file.write(b"\x1f\x8b partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(pooch.HTTPDownloader, "__call__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        download_dataset(spec, tmp_path / "c", sources=[server.serve("m", gz_files(arrays))])
    folder = tmp_path / "c" / spec.folder
    assert [p.name for p in folder.iterdir()] == [".lock"]


def test_corrupt_cached_file_is_replaced_and_stale_parts_removed(tmp_path, server, arrays, spec):
    url = server.serve("m", gz_files(arrays))
    folder = download_dataset(spec, tmp_path / "c", sources=[url], policy=FAST)
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bjunk")
    (folder / ".t10k-images-idx3-ubyte.gz.abc.part").write_bytes(b"left by a killed process")
    download_dataset(spec, tmp_path / "c", sources=[url], policy=FAST)
    assert server.hits["/m/t10k-images-idx3-ubyte.gz"] == 2
    assert server.hits["/m/train-images-idx3-ubyte.gz"] == 1
    assert_valid_cache(folder, spec, arrays)


def test_concurrent_processes_on_empty_cache(tmp_path, server, arrays, spec):
    server.delay = 0.25  # keep the downloads in flight while the others start
    url = server.serve("m", gz_files(arrays))
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=download_dataset,
            args=(spec, tmp_path / "c"),
            kwargs={"sources": [url], "policy": FAST},
        )
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    for p in procs:
        p.close()
    assert_valid_cache(tmp_path / "c" / spec.folder, spec, arrays)
    assert all(server.hits[f"/m/{n}.gz"] == 1 for n in IDX_NAMES)  # the lock: one download


# --- A hostile mirror: endless bodies, gzip bombs, trickles, web pages, a full disk ---

IMAGES = "train-images-idx3-ubyte.gz"


def endless(sent, limit):
    """A body without Content-Length that never ends (until `limit` bytes, so a test
    without the cap still finishes); `sent[0]` counts the bytes the client took."""

    def write(handler):
        handler.send_header("Connection", "close")
        handler.end_headers()
        chunk = b"\0\0\x08\x03" + bytes(65532)  # the start of an IDX file, then zeros
        try:
            while sent[0] < limit:
                handler.wfile.write(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass  # the client hung up

    return write


def test_endless_body_stops_at_the_size_cap(tmp_path, server, arrays, spec):
    sent = [0]
    server.routes[f"/endless/{IMAGES}"] = [(200, endless(sent, 256 << 20))]
    with pytest.raises(DataError, match="sent more than") as info:
        download_dataset(spec, tmp_path / "c", sources=[f"{server.base}/endless/"], policy=FAST)
    assert len(str(info.value)) < 300
    # Cap: twice the file's size plus framing, a few KiB here; the socket buffers
    # hold a few MiB more. Without the cap the whole 256 MiB would be taken.
    assert sent[0] < 32 << 20
    assert leftovers(tmp_path / "c" / spec.folder) == []


def test_gzip_bomb_content_encoding_stops_at_the_size_cap(tmp_path, server, arrays, spec):
    bomb = gzip.compress(b"\0\0\x08\x03" + bytes(64 << 20), compresslevel=9)  # ~64 KiB

    def write(handler):
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(bomb)))
        handler.end_headers()
        handler.wfile.write(bomb)

    server.routes[f"/bomb/{IMAGES}"] = [(200, write)]
    with pytest.raises(DataError) as info:
        download_dataset(spec, tmp_path / "c", sources=[f"{server.base}/bomb/"], policy=FAST)
    # Refused while streaming, from the decoded size, not after writing 64 MiB.
    assert "sent more than" in str(info.value)
    assert leftovers(tmp_path / "c" / spec.folder) == []


def test_trickling_mirror_meets_the_deadline_then_the_next_mirror(tmp_path, server, arrays, spec):
    sent = [0]

    def trickle(handler):  # one byte every 0.2 s, for at most 10 s
        handler.send_header("Content-Length", "5000")
        handler.end_headers()
        try:
            for _ in range(50):
                handler.wfile.write(b"\x1f")
                handler.wfile.flush()
                sent[0] += 1
                time.sleep(0.2)
        except OSError:
            pass

    for name in IDX_NAMES:
        server.routes[f"/slow/{name}.gz"] = [(200, trickle)]
    other = Server()  # a host that is too slow is skipped: the good mirror is elsewhere
    good = other.serve("good", gz_files(arrays))
    policy = DownloadPolicy(timeout=5.0, retries=1, backoff=0.0, deadline=1.0)
    start = time.perf_counter()
    folder = download_dataset(
        spec, tmp_path / "c", sources=[f"{server.base}/slow/", good], policy=policy
    )
    assert time.perf_counter() - start < 6  # deadline 1 s; the trickle alone lasts 10 s
    assert_valid_cache(folder, spec, arrays)
    assert server.hits[f"/slow/{IMAGES}"] == 1  # too slow is not retried...
    assert f"/slow/{IDX_NAMES[1]}.gz" not in server.hits  # ...nor asked for the other files
    assert sent[0] < 20  # the transfer was dropped at the deadline, not left running
    other.stop()


def test_truncated_transfer_says_how_many_bytes(tmp_path, server, arrays, spec):
    data = gz_files(arrays)[IMAGES]
    server.routes[f"/cut/{IMAGES}"] = [(200, data[:100], len(data))]
    with pytest.raises(DataError) as info:
        load_dataset(
            spec,
            cache_dir=tmp_path / "c",
            system_root=tmp_path / "s",
            sources=[f"{server.base}/cut/"],
            policy=FAST,
        )
    msg = str(info.value)
    port = server.httpd.server_address[1]
    assert f"mirror 127.0.0.1:{port}: connection closed after 100 of {len(data):,} bytes" in msg
    assert "urllib3" not in msg and "IncompleteRead" not in msg and len(msg) < 600


def test_web_page_from_a_mirror_is_named_as_such(tmp_path, server, spec):
    page = b"<!DOCTYPE html><html><body>Please log in</body></html>" * 10
    url = server.serve("portal", {f"{n}.gz": page for n in IDX_NAMES})
    with pytest.raises(DataError) as info:
        download_dataset(spec, tmp_path / "c", sources=[url], policy=FAST)
    msg = str(info.value)
    assert "returned a web page instead of data" in msg
    assert "delete it" not in msg  # nothing was saved: there is nothing to delete


def test_full_disk_while_downloading_names_the_disk(tmp_path, server, arrays, spec, small_tmpfs):
    cache = small_tmpfs(64)
    (cache / "filler").write_bytes(bytes(63 << 10))  # leave ~1 KiB free
    with pytest.raises(WriteError) as info:
        load_dataset(
            spec,
            cache_dir=cache,
            system_root=tmp_path / "s",
            sources=[server.serve("m", gz_files(arrays)), server.serve("m2", gz_files(arrays))],
            policy=FAST,
        )
    msg = str(info.value)
    assert info.value.exit_code == 1
    assert msg.startswith(f"disk full while writing {cache / spec.folder}/.train-images")
    assert "network" not in msg and "127.0.0.1" not in msg
    assert "/m2/train-images-idx3-ubyte.gz" not in server.hits  # no other mirror can help
    assert leftovers(cache / spec.folder) == []


def test_waiting_on_another_download_says_so_first(tmp_path, server, arrays, spec):
    import logging

    import filelock

    folder = tmp_path / "c" / spec.folder
    folder.mkdir(parents=True)
    lock = filelock.FileLock(folder / ".lock")  # held as another downloading process holds it
    notices = []

    class OtherProcessFinishes(logging.Handler):  # ...as soon as the waiter says it waits
        def emit(self, record):
            if "waiting for another jaxmnist process" in record.getMessage():
                notices.append(record)
                lock.release()

    handler = OtherProcessFinishes()
    logging.getLogger("jaxmnist.data.download").addHandler(handler)
    lock.acquire()
    start = time.time()
    try:
        policy = DownloadPolicy(timeout=5.0, retries=0, lock_wait=20.0)
        download_dataset(
            spec, tmp_path / "c", sources=[server.serve("m", gz_files(arrays))], policy=policy
        )
    finally:
        logging.getLogger("jaxmnist.data.download").removeHandler(handler)
        if lock.is_locked:
            lock.release()
    assert len(notices) == 1 and notices[0].levelname == "WARNING"  # stderr when unconfigured
    assert notices[0].created - start < 10  # said within seconds, not after the 20 s wait
    msg = notices[0].getMessage()
    assert msg.startswith(f"waiting for another jaxmnist process to finish downloading {spec.name}")


def test_waiting_on_another_download_gives_up_after_lock_wait(tmp_path, server, spec):
    import filelock

    folder = tmp_path / "c" / spec.folder
    folder.mkdir(parents=True)
    policy = DownloadPolicy(timeout=5.0, retries=0, lock_wait=2.5)
    # The lock is held as another process downloading would hold it.
    with filelock.FileLock(folder / ".lock"), pytest.raises(DataError) as info:
        download_dataset(spec, tmp_path / "c", sources=[f"{server.base}/m/"], policy=policy)
    assert str(info.value).startswith("gave up after 2.5 s waiting for another jaxmnist process")
    assert server.hits == {}


def test_stale_part_of_a_killed_download_goes_on_the_next_run(tmp_path, arrays, spec):
    folder = tmp_path / "c" / spec.folder
    synthetic.write_idx_folder(folder, arrays, spec)
    stale = folder / f".{IMAGES}.999999.0badf00d.part"
    stale.write_bytes(b"left by a killed download")
    load_dataset(spec, cache_dir=tmp_path / "c", system_root=tmp_path / "s", download=False)
    assert not stale.exists()


def test_part_of_a_running_download_is_left_alone(tmp_path, arrays, spec):
    import filelock

    folder = tmp_path / "c" / spec.folder
    synthetic.write_idx_folder(folder, arrays, spec)
    live = folder / f".{IMAGES}.1.0badf00d.part"
    live.write_bytes(b"being written")
    with filelock.FileLock(folder / ".lock"):  # its downloader holds the lock
        load_dataset(spec, cache_dir=tmp_path / "c", system_root=tmp_path / "s", download=False)
    assert live.exists()


def test_complete_cache_needs_no_lock(tmp_path, monkeypatch, arrays, spec):
    import filelock

    folder = tmp_path / "c" / spec.folder
    synthetic.write_idx_folder(folder, arrays, spec)

    class ReadOnly(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(filelock, "FileLock", ReadOnly)
    assert download_dataset(spec, tmp_path / "c", sources=[], policy=FAST) == folder
    assert not (folder / ".lock").exists()


@pytest.fixture
def sinks(monkeypatch):
    """Every transfer's sink, as `(max_bytes, bytes taken, bytes in its file when closed)`."""
    from jaxmnist.data import transfer

    seen = []

    class Spy(transfer._Sink):
        def close(self):
            super().close()
            seen.append((self.max_bytes, self.count, self.path.stat().st_size))

    monkeypatch.setattr(transfer, "_Sink", Spy)
    return seen


@pytest.mark.parametrize("body", ["endless", "gzip bomb"])
def test_the_transfer_itself_stops_at_the_cap(tmp_path, server, arrays, spec, sinks, body):
    """The cap acts while the body streams: the sink takes at most one chunk past
    `max_bytes` and its file never holds more than the cap (not a refusal of a finished
    256 MiB body by a later check)."""
    sent = [0]
    if body == "endless":
        server.routes[f"/hostile/{IMAGES}"] = [(200, endless(sent, 256 << 20))]
    else:
        bomb = gzip.compress(b"\0\0\x08\x03" + bytes(256 << 20), compresslevel=9)

        def write(handler):
            handler.send_header("Content-Encoding", "gzip")
            handler.send_header("Content-Length", str(len(bomb)))
            handler.end_headers()
            handler.wfile.write(bomb)

        server.routes[f"/hostile/{IMAGES}"] = [(200, write)]
    with pytest.raises(DataError) as info:
        download_dataset(spec, tmp_path / "c", sources=[f"{server.base}/hostile/"], policy=FAST)
    assert sinks  # one per attempt at the hostile file
    for max_bytes, taken, stored in sinks:  # the bytes first: the message alone proves nothing
        assert max_bytes < 1 << 20  # the tiny images file's cap: a few KiB
        assert taken <= max_bytes + (1 << 16)  # stopped within one chunk of the cap
        assert stored <= max_bytes
    assert "sent more than" in str(info.value)
