"""What a benchmark reports: figures with their targets and inputs, the machine, the table.

A `Figure` is one number (mostly a ratio against a reference measured in the same run), the
target it is held to, and everything it was measured with. `report` turns a run's figures into
bench/results.json's document and `markdown_table` into the table the README carries. A figure
that misses its target, or could not be measured, is still a row: never hide a shortfall.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import platform
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

# Packages whose versions every result records (those not installed are left out).
VERSIONED = ("tensorflow", "tf-keras", "keras", "tensorflow-text", "sentencepiece", "kfp")


@dataclass(frozen=True)
class Target:
    """A bound on a figure: `op` is ">=" or "<=", `value` in the figure's own unit."""

    op: str  # ">=" or "<="
    value: float  # the bound

    def met(self, value: float | None) -> bool | None:
        """Whether `value` meets the bound; None when there is no value."""
        if value is None:
            return None
        return value >= self.value if self.op == ">=" else value <= self.value


@dataclass
class Figure:
    """One reported number, its target and what it was measured with."""

    name: str  # what it is, in words, as the table shows it
    value: float | None  # None: not measured (`note` says why)
    unit: str = "x"  # "x" a ratio, "%" a fraction shown in per cent, else a unit name
    target: Target | None = None  # None: reported without a target
    inputs: dict[str, Any] = field(default_factory=dict)  # config, tokens, threads, steps...
    details: dict[str, Any] = field(default_factory=dict)  # the measurements behind the value
    note: str = ""  # a caveat shown beside the value (a fallback, a skip, an error)
    bench: str = ""  # the module that measured it; set by the runner
    failed: bool = False  # the benchmark raised (the runner's row for a broken module)

    @property
    def met(self) -> bool | None:
        return self.target.met(self.value) if self.target else None


def format_value(value: float | None, unit: str) -> str:
    """A figure's value as the table shows it."""
    if value is None:
        return "n/a"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value * 100:.1f}%"
    return f"{value:,.4g} {unit}".strip()


def format_target(target: Target | None, unit: str) -> str:
    """A target as the table shows it, e.g. ">= 1.15x" or "<= 10.0%"."""
    if target is None:
        return "-"
    return f"{target.op} {format_value(target.value, unit)}"


def format_met(met: bool | None, has_target: bool) -> str:
    if not has_target:
        return "-"
    return {True: "yes", False: "**no**", None: "**no** (not measured)"}[met]


def markdown_table(figures: list[Figure]) -> str:
    """The run's figures as a Markdown table: figure, value, target, met?"""
    lines = ["| figure | value | target | met? |", "|---|---|---|---|"]
    for f in figures:
        value = format_value(f.value, f.unit) + (f" ({f.note})" if f.note else "")
        cells = (f.name, value, format_target(f.target, f.unit), format_met(f.met, bool(f.target)))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def cpu_model(cpuinfo: str) -> str:
    """The first `model name` in /proc/cpuinfo's text, or ""."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return ""


def memory_gib(meminfo: str) -> float | None:
    """MemTotal of /proc/meminfo's text, in GiB; None when it is not there."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def machine() -> dict[str, Any]:
    """The machine the figures were measured on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "cpu": cpu_model(_read("/proc/cpuinfo")) or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": memory_gib(_read("/proc/meminfo")),
        "os": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def versions() -> dict[str, str]:
    """Python's version and the installed versions of VERSIONED."""
    found = {"python": platform.python_version()}
    for name in VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def report(figures: list[Figure], tier: str, argv: list[str], wall_s: float) -> dict[str, Any]:
    """bench/results.json's document for one run."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tier": tier,
        "argv": argv,
        "wall_s": round(wall_s, 1),
        "machine": machine(),
        "versions": versions(),
        "figures": [
            {**dataclasses.asdict(f), "met": f.met, "shown": format_value(f.value, f.unit)}
            for f in figures
        ],
    }


def heading(doc: dict[str, Any]) -> str:
    """One line above the table: when, where, which tier, how long."""
    m = doc["machine"]
    v = doc["versions"]
    return (
        f"`make bench` (tier: {doc['tier']}), {doc['date'][:10]}, {m['cpu']}, "
        f"{m['usable_cores']} cores, Python {v['python']}, TensorFlow {v.get('tensorflow', '?')}, "
        f"{doc['wall_s'] / 60:.1f} min"
    )
