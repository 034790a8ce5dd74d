"""This machine's CPUs and memory as a local run reads them: /proc/meminfo and cgroup v2."""

import os

from pipelines.runners.local.machine import Machine, this_machine

MEMINFO = "MemTotal:       24683784 kB\nMemFree:        21277568 kB\n"


def affinity() -> int:
    return len(os.sched_getaffinity(0))


def test_the_machine_is_its_cpus_and_memtotal_without_a_cgroup(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    found = this_machine(tmp_path / "meminfo", tmp_path / "no-cgroup")
    assert found == Machine(cpus=affinity(), memory_bytes=24683784 * 1024)


def test_a_containers_cgroup_limits_count(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("50000 100000\n")  # half a CPU: rounds up to one
    (cgroup / "memory.max").write_text(f"{2 << 30}\n")
    assert this_machine(tmp_path / "meminfo", cgroup) == Machine(cpus=1, memory_bytes=2 << 30)
    (cgroup / "cpu.max").write_text("max 100000\n")  # no quota, no memory limit
    (cgroup / "memory.max").write_text("max\n")
    found = this_machine(tmp_path / "meminfo", cgroup)
    assert found == Machine(cpus=affinity(), memory_bytes=24683784 * 1024)


def test_memory_not_found_is_zero_which_nothing_checks(tmp_path):
    (tmp_path / "meminfo").write_text("MemFree: 12 kB\n")
    assert this_machine(tmp_path / "meminfo", tmp_path).memory_bytes == 0
    assert this_machine(tmp_path / "missing", tmp_path).memory_bytes == 0
