"""The reliability matrix as Markdown, from the collected tests' `fault` and `bad_input` marks.

`pytest --collect-only -q --write-matrix FILE` writes it (tests/conftest.py); docs/reliability.md
carries the same tables between its `<!-- matrix -->` markers, and
tests/faults/test_reliability_doc.py fails when they drift apart.
"""

from __future__ import annotations

import inspect
import re

KINDS = (
    ("fault", "Faults", "What is done to the system"),
    ("bad_input", "Bad input", "What is given"),
)


def must_happen(item) -> str:
    """What the test proves: its docstring's first line, or its name read as a sentence."""
    doc = inspect.getdoc(getattr(item, "function", None)) or ""
    if doc:
        return doc.splitlines()[0].rstrip(".")
    name = item.originalname if hasattr(item, "originalname") else item.name
    words = re.sub(r"^test_", "", name).replace("_", " ")
    return words[:1].upper() + words[1:]


def rows(items, kind: str) -> list[tuple[str, str, str]]:
    """(what, must happen, test) per test function; its parametrized cases are listed in one."""
    grouped: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for item in items:
        mark = item.get_closest_marker(kind)
        if mark is None:
            continue
        what = str(mark.args[0]) if mark.args else item.name
        test, _, case = item.nodeid.partition("[")
        _, cases = grouped.setdefault((what, test), (must_happen(item), []))
        if case:
            cases.append(case.rstrip("]"))
    found = []
    for (what, test), (happen, cases) in grouped.items():
        listed = f" (case {cases[0]})" if len(cases) == 1 else ""
        listed = f" ({len(cases)} cases: {', '.join(cases)})" if len(cases) > 1 else listed
        cell = f"`{test}`{listed}"
        found.append((what, happen, cell))
    return sorted(found, key=lambda row: (row[2], row[0]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(items) -> str:
    out = []
    for kind, title, column in KINDS:
        table = rows(items, kind)
        cases = sum(1 for item in items if item.get_closest_marker(kind))
        out += [f"### {title} ({len(table)} rows, {cases} cases)", ""]
        out += [f"| {column} | What must happen | Test |", "|---|---|---|"]
        out += [f"| {_cell(w)} | {_cell(m)} | {_cell(t)} |" for w, m, t in table]
        out.append("")
    return "\n".join(out)
