"""Shared pytest setup: tf-keras before TensorFlow, quiet TF logs, and small fixtures."""

import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/ from the current compiler output instead of comparing",
    )
    parser.addoption(
        "--write-matrix",
        metavar="PATH",
        help="write the fault and bad-input matrix of the collected tests as Markdown to PATH",
    )


# ---- the fault and bad-input matrix (docs/reliability.md) ------------------------------------
# A test that injects a fault carries `@pytest.mark.fault("what is done")`; one that feeds bad
# input carries `@pytest.mark.bad_input("what is given")` (each parametrized case counts once).
# A test that checks nothing was lost calls the `ledger` fixture: `ledger("pushes", 2, found)`.
# `make test` ends with one line of totals, the figures docs/reliability.md ends with.

_MATRIX = {"fault": 0, "bad_input": 0, "fault_failed": 0, "bad_input_failed": 0}
_LEDGER: dict[str, list[int]] = {}  # kind -> [expected, found]


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.failed):
        for kind in ("fault", "bad_input"):
            if kind in report.keywords:
                _MATRIX[kind if report.passed else f"{kind}_failed"] += 1
    for name, value in report.user_properties:
        if name == "ledger":
            kind, expected, found = value
            totals = _LEDGER.setdefault(kind, [0, 0])
            totals[0] += expected
            totals[1] += found


@pytest.fixture
def ledger(request):
    """Count records a test expected and found: `ledger(kind, expected, found)`; 0 lost passes."""

    def count(kind: str, expected: int, found: int) -> None:
        request.node.user_properties.append(("ledger", (kind, expected, found)))

    return count


def pytest_terminal_summary(terminalreporter):
    faults, bad = _MATRIX["fault"], _MATRIX["bad_input"]
    if not (faults or bad or _MATRIX["fault_failed"] or _MATRIX["bad_input_failed"]):
        return
    expected = sum(e for e, _ in _LEDGER.values())
    lost = sum(max(e - f, 0) for e, f in _LEDGER.values())
    failed = _MATRIX["fault_failed"] + _MATRIX["bad_input_failed"]
    terminalreporter.write_line(
        f"reliability matrix: {faults} faults injected and survived, {bad} bad inputs rejected "
        f"cleanly, {lost} of {expected} records lost"
        + (f"; {failed} matrix rows FAILED" if failed else "")
    )


def pytest_collection_modifyitems(config, items):
    path = config.getoption("--write-matrix")
    if path:
        from tests.matrix_table import render

        with open(path, "w", encoding="utf-8") as f:
            f.write(render(items))
