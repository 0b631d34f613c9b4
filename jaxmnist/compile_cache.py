"""JAX's persistent compilation cache: on when it can be written, and kept readable.

The cache lives in `<jaxmnist cache>/xla`. If that folder cannot be created or
written (a read-only file system, a file in its place, a path too long), the cache
stays off with one warning and the run goes on: it only saves compile time.

JAX stores each compiled program as `<key>-cache` (JAX's `LRUCache`): the program
serialised behind a 4-byte compile time, compressed with zlib (zstd where JAX finds
it). An entry that cannot be read (random bytes, a truncated write, flipped bits)
costs JAX a multi-line warning on every run, for ever, because JAX never replaces
an existing entry. So `enable` first checks each entry it has not seen before:
it must decompress (zlib's checksum catches truncation and flipped bits; zstd
frames without a checksum catch most, not all) and hold more than the compile time.
Bad entries are removed with one warning. Entries found good are remembered by
size and modification time in `CHECKED_FILE`, so each is read once, not every run;
entries younger than `SETTLE_SECONDS` may still be being written by another process
and wait for the next run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import jax

log = logging.getLogger(__name__)

CHECKED_FILE = ".jaxmnist-checked.json"
SETTLE_SECONDS = 60.0
_ENTRY_SUFFIX = "-cache"  # JAX's LRUCache names entries <key>-cache (and <key>-atime)


def _decompress():
    """JAX's own decompressor for its entries (it picks zstd or zlib), or None."""
    try:
        from jax._src.compilation_cache import decompress_executable
    except ImportError:  # moved in a later JAX: then do not judge entries at all
        return None
    return decompress_executable


def _readable(path: Path, decompress) -> bool:
    try:
        return len(decompress(path.read_bytes())) > 4  # 4 bytes of compile time, then the program
    except OSError:
        return True  # unreadable for us now (vanished, permissions): not ours to judge
    except Exception:  # noqa: BLE001 -- zlib.error, zstd errors: the entry is damaged
        return False


def remove_bad_entries(path: Path) -> list[str]:
    """Removes entries of the cache folder `path` that cannot be decompressed; returns
    their names. Entries checked before (same size and mtime) are not read again."""
    decompress = _decompress()
    if decompress is None:
        return []
    index_path = path / CHECKED_FILE
    try:
        checked = json.loads(index_path.read_text())
        checked = checked if isinstance(checked, dict) else {}
    except (OSError, ValueError):
        checked = {}
    now, good, bad = time.time(), {}, []
    for entry in sorted(path.glob(f"*{_ENTRY_SUFFIX}")):
        try:
            st = entry.stat()
        except OSError:
            continue
        stamp = [st.st_size, st.st_mtime_ns]
        if checked.get(entry.name) == stamp:
            good[entry.name] = stamp
        elif now - st.st_mtime < SETTLE_SECONDS:
            continue  # perhaps still being written
        elif _readable(entry, decompress):
            good[entry.name] = stamp
        else:
            bad.append(entry.name)
            for name in (entry.name, entry.name[: -len(_ENTRY_SUFFIX)] + "-atime"):
                try:
                    (path / name).unlink(missing_ok=True)
                except OSError:
                    pass
    if good != checked:
        tmp = index_path.with_name(f"{CHECKED_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(good))
            os.replace(tmp, index_path)
        except OSError:
            tmp.unlink(missing_ok=True)  # only a cache of our checks: next run reads again
    return bad


def enable(path: Path) -> Path | None:
    """Turns on JAX's persistent compilation cache in `path`; returns it, or None (with
    one warning) when the folder cannot be written. Every program is cached, however
    quick to compile; unreadable entries are removed first (see the module docstring)."""
    probe = path / f".jaxmnist-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "xb"):
            pass
        probe.unlink()
    except OSError as e:
        log.warning("compilation cache off: cannot write %s (%s)", path, e.strerror or e)
        return None
    bad = remove_bad_entries(path)
    if bad:
        log.warning(
            "compilation cache: removed %d unreadable entr%s from %s",
            len(bad),
            "y" if len(bad) == 1 else "ies",
            path,
        )
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
