"""The host allocator setting: freed buffers are reused, not unmapped and faulted in again."""

import subprocess
import sys

import pytest
from test_validation import tiny_cfg

from jaxmnist import hostmem
from jaxmnist.training import loop, population

# Allocates (malloc), touches and frees a 256 MB block five times and prints the page faults of
# the last four rounds. glibc's default maps a block that large afresh every time.
PROBE = """
import ctypes, resource
from jaxmnist import hostmem
print(hostmem.keep_freed_memory(), hostmem.describe())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(5):
    if i == 1:
        start = faults()
    block = libc.malloc(2**28)
    ctypes.memset(block, 1, 2**28)
    libc.free(block)
print(faults() - start)
"""


def _probe(keep: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={"JAXMNIST_KEEP_HOST_MEMORY": keep, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_and_the_default_is_kept_on_request():
    pages = 4 * 2**28 // 4096  # four rounds of a 256 MB buffer, in 4 KiB pages
    said, faults = _probe("1")
    assert said == "True glibc, freed memory kept for reuse (one arena, no mmap)"
    assert faults < pages // 20  # the heap's block is reused: next to no new pages
    said, faults = _probe("0")
    assert said == "False default"
    assert faults > pages // 2  # glibc's default: every round maps and faults it anew


# A freed 256 MB block that cannot rejoin the heap's top (another block lies above it), a
# 16 MB request cut from it, then 256 MB again: it no longer fits in what is left, so the
# heap grows while the old block's pages stay resident. Prints how far the peak resident
# set rose for the second block, with or without `hand_back` first (argv[1] == "1").
SPLIT_PROBE = """
import ctypes, sys
from jaxmnist import hostmem
print(hostmem.keep_freed_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def peak_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) // 1024
size = 2**28
block = libc.malloc(size)
ctypes.memset(block, 1, size)
above = libc.malloc(size)  # never touched: no resident pages
libc.free(block)
cut = libc.malloc(2**24)
assert cut == block, "the request was not cut from the freed block"
if sys.argv[1] == "1":
    hostmem.hand_back()
before = peak_mb()
again = libc.malloc(size)
ctypes.memset(again, 1, size)
print(peak_mb() - before)
"""


def _split_probe(hand_back: bool) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SPLIT_PROBE, str(int(hand_back))],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "True"
    return int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_hand_back_keeps_a_block_cut_from_a_freed_one_from_being_held_twice():
    assert _split_probe(hand_back=False) >= 250  # both blocks' pages resident at once
    assert _split_probe(hand_back=True) < 64  # the freed block's pages went back first


def test_the_loop_hands_back_before_each_phase(tiny_dataset, monkeypatch):
    """Every epoch's steps and every evaluation (test and validation, each with the
    ensemble, and the training subset) start right after `hand_back`."""
    calls: list[str] = []
    monkeypatch.setattr(hostmem, "hand_back", lambda: calls.append("hand_back"))
    for name in ("plan_epoch", "evaluate"):
        original = getattr(population.Population, name)

        def record(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(population.Population, name, record)
    cfg = tiny_cfg(seeds=2, epochs=2, eval_train=True, eval_train_examples=64)
    loop.train_population(cfg, population.seed_members(cfg), tiny_dataset)
    phases = [i for i, c in enumerate(calls) if c != "hand_back"]
    # per epoch: its plan, then the test set, the validation split and the training subset
    assert [calls[i] for i in phases[:4]] == ["plan_epoch", *["evaluate"] * 3]
    assert len(phases) == 8
    assert all(calls[i - 1] == "hand_back" for i in phases)
