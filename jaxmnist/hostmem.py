"""Host memory on Linux: keep freed buffers for reuse instead of handing them back.

XLA:CPU allocates each call's working memory afresh (one block for the whole program,
hundreds of MB for a population of CNNs) and frees it when the call ends. glibc serves a
block that large with a fresh `mmap` (always, in the per-thread arenas XLA's worker
threads allocate from) and unmaps it on free, so every call faults its pages in again and
the kernel zeroes them. Told to use one arena, never to mmap and (almost) never to trim,
glibc serves the same blocks from its heap and the next call reuses them, and a
population trains with far less time in the kernel (`benchmarks/host_memory.py`
measures it; docs/results.md has the figures).

The cost is memory held: the heap keeps its high-water mark and every thread allocates
from one arena, which on a many-core host may contend. It can also hold a large block
twice: once a large block is freed, a small request may be cut from it, and the next
request of the same size no longer fits there and is taken from fresh memory while the
old block's pages stay resident. Between programs of different sizes (an epoch's steps,
then each evaluation) `hand_back` returns the free blocks' pages to the kernel, so a
run's peak is what its programs hold, not what its allocation order happened to be.

Within a phase one program runs again and again and reuses its block, but the same can
happen between two of its calls: XLA:CPU frees a call's working memory on a worker
thread after its outputs are ready, so the next call may allocate before that free, and
a small request cut from the freed block makes the next call take fresh memory again.
Left alone, the resident set climbs by a whole block at a time, to several blocks.
`GrowthCheck` keeps it to one: after each call it waits for that free, and while a call
runs it hands back as soon as the resident set has grown by more than an eighth of the
program's working memory, which returns the freed block's pages while the call's own
block, in use, stays. An evaluation that follows another of no smaller working memory is
meant to reuse that one's freed block without a hand-back; the same watch catches it when
the allocator serves it fresh pages instead (a better-fitting free block, handed back
earlier, is taken first) and hands the freed block back while it runs.

`JAXMNIST_KEEP_HOST_MEMORY=0` leaves glibc as it is. It must run before XLA starts its
threads (`jaxmnist.cli.main` calls it first thing); later, it would reach only threads
created afterwards.

On a TPU the host memory that matters is another: the runtime copies between host and
chip through a buffer of pinned host memory that it maps when it opens (libtpu's
`TPU_PREMAPPED_BUFFER_SIZE`; a copy larger than `TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES`
takes a much slower path). Mapping libtpu's default of 4 GiB is most of the time the chip
takes to open, and unmapping it much of the time the process takes to end, though a run
of jaxmnist copies far less at once. `size_tpu_transfer_buffer` sizes it to the run's
largest copy, unless the user set either variable.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import time

ENV = "JAXMNIST_KEEP_HOST_MEMORY"
# mallopt parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
TRIM_THRESHOLD = 2**31 - 1  # bytes free at the heap's top before it shrinks: mallopt's most
# Growth of the resident set during a call that `GrowthCheck` lets stand: at least the
# noise of the heap's small allocations, and an eighth of the program's working memory (a
# fresh block shows long before it is whole; smaller growth, handed back, would only be
# faulted in again).
GROWTH_SLACK = 2 * 2**20
GROWTH_FRACTION = 8
# What the heap may hold beyond its use before a call, once the call's working memory
# (a population's: tens to hundreds of MB) counts as freed.
FREE_SLACK = 32 * 2**20
FREE_POLL_SECONDS = 2e-4  # how often `GrowthCheck` looks for that free

TPU_BUFFER_ENV = "TPU_PREMAPPED_BUFFER_SIZE"
TPU_THRESHOLD_ENV = "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"
TPU_BUFFER_MIN = 256 * 2**20  # room for MNIST's training images twice over, and more
TPU_BUFFER_MAX = 4 * 2**30  # libtpu's own default: never more than it would map anyway

_state: dict = {"trim": None, "tpu_buffer": None}  # malloc_trim; the buffer size set here


def keep_freed_memory() -> bool:
    """Sets glibc's allocator to reuse freed memory (module docstring); True when it did.
    Does nothing off Linux/glibc or with JAXMNIST_KEEP_HOST_MEMORY=0."""
    if _state["trim"] is not None:
        return True
    if not sys.platform.startswith("linux") or os.environ.get(ENV, "1") == "0":
        return False
    if accelerator_installed():  # one arena would serialise the compiler's threads there
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


def accelerator_installed() -> bool:
    """Whether JAX may run on an accelerator here: its TPU or GPU plugin is installed and
    JAX_PLATFORMS does not pin the CPU. Decided without starting JAX (the allocator is set
    before its threads start); there, programs compile at once on threads, which one
    arena would make wait on each other's allocations."""
    if _jax_platforms() == {"cpu"}:
        return False
    plugins = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin")
    return any(importlib.util.find_spec(name) is not None for name in plugins)


def tpu_buffer_size(largest_copy: int) -> int:
    """The smallest power of two holding two copies of `largest_copy` bytes at once,
    within `TPU_BUFFER_MIN` .. `TPU_BUFFER_MAX`."""
    return min(max(1 << max(2 * largest_copy - 1, 1).bit_length(), TPU_BUFFER_MIN), TPU_BUFFER_MAX)


def size_tpu_transfer_buffer(largest_copy: int = 0) -> int | None:
    """Sizes the TPU runtime's premapped transfer buffer (module docstring) for copies of
    up to `largest_copy` bytes (`tpu_buffer_size`), the same bytes as the threshold.
    Returns the size set, or None where the user set either variable (then
    both are left alone). Only grows what it set before; it takes effect only before
    the TPU runtime opens, which reads the variables once (and only a TPU reads them)."""
    own = _state["tpu_buffer"]
    if own is None and (TPU_BUFFER_ENV in os.environ or TPU_THRESHOLD_ENV in os.environ):
        return None
    if own is not None and os.environ.get(TPU_BUFFER_ENV) != str(own):
        return None  # changed since by someone else: theirs now
    size = max(tpu_buffer_size(largest_copy), own or 0)
    os.environ[TPU_BUFFER_ENV] = os.environ[TPU_THRESHOLD_ENV] = str(size)
    _state["tpu_buffer"] = size
    return size


def tpu_installed() -> bool:
    """Whether JAX's TPU plugin (libtpu) is installed and JAX_PLATFORMS does not exclude
    it: where the transfer buffer's size can matter. Decided without starting JAX."""
    platforms = _jax_platforms()
    if platforms and "tpu" not in platforms:
        return False
    return importlib.util.find_spec("libtpu") is not None


def _jax_platforms() -> set[str]:
    """The platforms JAX_PLATFORMS pins JAX to; empty where it pins none."""
    return {p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}


def hand_back() -> None:
    """Returns the pages of the heap's free blocks to the kernel (glibc's `malloc_trim`),
    where `keep_freed_memory` applied; the blocks stay the allocator's, and the next use
    faults their pages in again (module docstring)."""
    if _state["trim"] is not None:
        _state["trim"](0)


def resident_bytes() -> int:
    """The process's resident set, from /proc/self/statm (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Mallinfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (2.33 and later): ten size_t fields.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def heap_in_use():
    """A function returning the bytes the heap has handed out (glibc's `mallinfo2`), or
    None where there is none."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    return lambda: fn().uordblks


class GrowthCheck:
    """Keeps the calls of one program to one block of working memory (module docstring).
    `reset` where a phase starts (after `hand_back`, or `from_now` without one); then, for
    each call, `before_call` before it, `watch(ready)` once it is dispatched, and
    `after_call` once its outputs are ready.

    `watch` polls, every `poll` seconds until `ready()` is true, the resident set; once
    it lies more than `slack` (from `block`, the program's working memory in bytes:
    `GROWTH_SLACK`, `GROWTH_FRACTION`) above the least it has been after a call of the
    phase, the call has taken fresh memory while a freed block stays resident, and it
    hands back (the block the call uses is not free, so it stays). `after_call` then
    waits, up to `wait` seconds, until the heap has no more than `FREE_SLACK` in use
    beyond what it had before the call (the worker thread's free of its working memory),
    so that the next call can take that block again. Does nothing where
    `keep_freed_memory` did not apply."""

    def __init__(self, block: int = 0, wait=0.05, poll=1e-3, rss=resident_bytes):
        self.slack = max(GROWTH_SLACK, block // GROWTH_FRACTION)
        self.wait, self.poll, self.rss = wait, poll, rss
        self.in_use = heap_in_use() if _state["trim"] is not None else None
        self.floor: int | None = None  # the least resident set after a call of the phase
        self.before = 0  # the heap's bytes in use before the call
        self.handed_back = 0

    def reset(self, from_now: bool = False) -> None:
        """Starts a phase: its first call sets the floor, or, `from_now`, the resident set
        now does (a call that should take a block already resident and free)."""
        self.floor = self.rss() if from_now and _state["trim"] is not None else None

    def before_call(self) -> None:
        if self.in_use is not None:
            self.before = self.in_use()

    def watch(self, ready) -> None:
        if self.floor is None:  # the phase's first call, or memory not kept
            return
        limit = self.floor + self.slack
        while not ready():
            if self.rss() > limit:
                hand_back()
                self.handed_back += 1
                return
            time.sleep(self.poll)

    def after_call(self) -> None:
        if _state["trim"] is None:
            return
        if self.in_use is not None:
            deadline = time.perf_counter() + self.wait
            while self.in_use() > self.before + FREE_SLACK and time.perf_counter() < deadline:
                time.sleep(FREE_POLL_SECONDS)
        now = self.rss()
        self.floor = now if self.floor is None else min(self.floor, now)


def describe_tpu_buffer() -> dict | None:
    """What `environment.json` records of the TPU's transfer buffer: its bytes and who
    set them ("jaxmnist" or "user"), or None where neither did (libtpu's default)."""
    size = os.environ.get(TPU_BUFFER_ENV)
    if size is None:
        return None
    own = _state["tpu_buffer"] is not None and size == str(_state["tpu_buffer"])
    return {"bytes": int(size) if size.isdigit() else size, "set_by": "jaxmnist" if own else "user"}


def describe() -> str:
    """What `environment.json` records about the host allocator."""
    if _state["trim"] is not None:
        return "glibc, freed memory kept for reuse (one arena, no mmap)"
    return "default"
