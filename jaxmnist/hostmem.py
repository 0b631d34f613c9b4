"""Host memory on Linux: keep freed buffers for reuse instead of handing them back.

XLA:CPU allocates each call's working memory afresh (one block for the whole program,
hundreds of MB for a population of CNNs) and frees it when the call ends. glibc serves a
block that large with a fresh `mmap` (always, in the per-thread arenas XLA's worker
threads allocate from) and unmaps it on free, so every call faults its pages in again and
the kernel zeroes them. Told to use one arena, never to mmap and (almost) never to trim,
glibc serves the same blocks from its heap and the next call reuses them, and a
population trains with far less time in the kernel (`benchmarks/host_memory.py`
measures it; the README's Results have the figures).

The cost is memory held: the heap keeps its high-water mark and every thread allocates
from one arena, which on a many-core host may contend. It can also hold a large block
twice: once a large block is freed, a small request may be cut from it, and the next
request of the same size no longer fits there and is taken from fresh memory while the
old block's pages stay resident. Between programs of different sizes (an epoch's steps,
then each evaluation) `hand_back` returns the free blocks' pages to the kernel, so a
run's peak is what its programs hold, not what its allocation order happened to be;
within a phase, where one program runs again and again, the blocks are reused.

`JAXMNIST_KEEP_HOST_MEMORY=0` leaves glibc as it is. It must run before XLA starts its
threads (`jaxmnist.cli.main` calls it first thing); later, it would reach only threads
created afterwards.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "JAXMNIST_KEEP_HOST_MEMORY"
# mallopt parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
TRIM_THRESHOLD = 2**31 - 1  # bytes free at the heap's top before it shrinks: mallopt's most

_state: dict = {"trim": None}  # glibc's malloc_trim, once keep_freed_memory applied


def keep_freed_memory() -> bool:
    """Sets glibc's allocator to reuse freed memory (module docstring); True when it did.
    Does nothing off Linux/glibc or with JAXMNIST_KEEP_HOST_MEMORY=0."""
    if _state["trim"] is not None:
        return True
    if not sys.platform.startswith("linux") or os.environ.get(ENV, "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(None)
        _ = libc.gnu_get_libc_version  # glibc only: musl's mallopt ignores these
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not all(mallopt(param, value) == 1 for param, value in settings):
        return False
    _state["trim"] = libc.malloc_trim
    return True


def hand_back() -> None:
    """Returns the pages of the heap's free blocks to the kernel (glibc's `malloc_trim`),
    where `keep_freed_memory` applied; the blocks stay the allocator's, and the next use
    faults their pages in again (module docstring)."""
    if _state["trim"] is not None:
        _state["trim"](0)


def describe() -> str:
    """What `environment.json` records about the host allocator."""
    if _state["trim"] is not None:
        return "glibc, freed memory kept for reuse (one arena, no mmap)"
    return "default"
