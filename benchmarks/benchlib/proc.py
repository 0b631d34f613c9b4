"""What Linux says of this process: fields of /proc/self/status."""

from __future__ import annotations


def status_kb(field: str) -> int:
    """A /proc/self/status field in kB: `VmRSS` (the resident set now), `VmHWM` (its peak
    since the process started, or since /proc/self/clear_refs reset it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")
