"""The host allocator setting: freed buffers are reused, not unmapped and faulted in again."""

import subprocess
import sys

import pytest

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
