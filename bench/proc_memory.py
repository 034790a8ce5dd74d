"""A Linux process's own memory, read from /proc: its RSS and peak RSS, and the peak's reset,
for benchmarks that measure what a stretch of work allocates in a fresh process."""

from __future__ import annotations


def status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
