"""This machine's CPUs and memory, which a local run's worker processes share.

Read once, at the edge (`gptpipe run --local`: `this_machine()`), and carried in the LocalRun,
so that `runner.preflight` can refuse a run the machine cannot hold before any step starts: more
workers than its CPUs run (`TrainJob.check_local`) or a micro-batch past its memory
(`capacity.check_fits_host`). A container's cgroup limits count, as the kernel enforces them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

PROC_MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2's unified hierarchy: cpu.max, memory.max


@dataclass(frozen=True)
class Machine:
    """What a local run's workers have to share."""

    cpus: int  # CPUs this process may run on: its affinity, under a cgroup's CPU quota
    memory_bytes: int  # physical memory, under a cgroup's limit; 0: not known (not checked)


def this_machine(meminfo: Path = PROC_MEMINFO, cgroup: Path = CGROUP) -> Machine:
    """This machine as the kernel reports it to this process (Linux; elsewhere the CPU count
    and no memory). The cgroup files are those a container sees at its cgroup's root; a
    process in a nested cgroup of a host is bounded by its affinity and MemTotal alone."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux: the CPUs this process may use
    cpus = len(affinity(0)) if affinity else os.cpu_count() or 1
    quota = _cpu_quota(_read(cgroup / "cpu.max"))
    limits = [n for n in (_mem_total(_read(meminfo)), _number(_read(cgroup / "memory.max"))) if n]
    return Machine(cpus=min(cpus, quota) if quota else cpus, memory_bytes=min(limits, default=0))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return ""


def _mem_total(meminfo: str) -> int:
    """MemTotal of /proc/meminfo, in bytes (the file says kB, meaning KiB); 0 without it."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            return _number(value.strip().removesuffix("kB")) * 1024
    return 0


def _cpu_quota(cpu_max: str) -> int:
    """The CPUs cgroup v2's `cpu.max` ("QUOTA PERIOD", or "max PERIOD") allows, rounded up;
    0 for none."""
    quota, _, period = cpu_max.strip().partition(" ")
    q, p = _number(quota), _number(period)
    return math.ceil(q / p) if q and p else 0


def _number(text: str) -> int:
    """A whole number, or 0 ("max", nothing, anything else)."""
    text = text.strip()
    return int(text) if text.isdigit() else 0
