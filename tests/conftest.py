"""Shared pytest setup: tf-keras before TensorFlow, quiet TF logs, the reliability matrix, and
the fixtures tests in several folders use.

- `gcs_server` (session): gcp-storage-emulator (tests/doubles/gcs), started once; its base URL.
- `gcs` (function): a fresh bucket on it, STORAGE_EMULATOR_HOST pointing at the server, and
  `components.storage` using a client for it. Yields a `Gcs` (client, bucket, `uri(...)`).
  The emulator ignores preconditions (`ifGenerationMatch` and the rest): this is the raw one.
- `gcs_strict` (function): the same bucket behind `FaultProxy` with no faults, which enforces
  preconditions as GCS does. STORAGE_EMULATOR_HOST names the proxy, so subprocesses that make
  a default client go through it too. Yields a `Gcs`.
- `gcs_faults` (function): as `gcs_strict`, and yields `(Gcs, FaultProxy)` so a test can make
  chosen requests fail (tests/doubles/gcs/proxy.py); `proxy.gate.refused` lists the requests
  refused for a precondition.
- `googleapis` (function): GCS's public HTTPS hosts in front of the `gcs` bucket's emulator
  (tests/doubles/gcs/googleapis.py), for TensorFlow's own gs:// file system; pass its `env` to
  a TensorFlow subprocess (TensorFlow in this process would block the emulator's threads).
  Yields a `GoogleApis` whose `log` lists the requests TensorFlow made.
- `examples` (session): a tiny Examples artifact (tests/tiny.py), tokenized once for the
  session. Read-only: copy it into tmp_path before changing it.
- `tiny_model` (session): a Model artifact trained briefly on `examples`. Read-only too.
- `unlinked_op_model` (session): a Model artifact TF Serving could not load, its SavedModel
  running a TF Text op the model server does not link (tests/tiny.py). Read-only too.
"""

import os
from collections.abc import Iterator
from pathlib import Path

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


# ---- GCS: gcp-storage-emulator, and a proxy that enforces preconditions and injects faults ----


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    from tests.doubles.gcs import emulator

    with emulator.running() as url:
        yield url


@pytest.fixture
def gcs(gcs_server: str, monkeypatch: pytest.MonkeyPatch):
    from components import storage
    from tests.doubles.gcs import emulator

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server)
    bucket = emulator.new_bucket(gcs_server)
    storage.set_client(bucket.client)
    try:
        yield bucket
    finally:
        storage.set_client(None)


@pytest.fixture
def gcs_strict(gcs, monkeypatch: pytest.MonkeyPatch):
    from tests.doubles.gcs.proxy import FaultProxy, behind

    with behind(gcs, FaultProxy(gcs.endpoint), monkeypatch) as strict:
        yield strict


@pytest.fixture
def gcs_faults(gcs, monkeypatch: pytest.MonkeyPatch):
    from tests.doubles.gcs.proxy import FaultProxy, behind

    proxy = FaultProxy(gcs.endpoint)
    with behind(gcs, proxy, monkeypatch) as faulty:
        yield faulty, proxy


@pytest.fixture
def googleapis(gcs, tmp_path: Path):
    from tests.doubles.gcs import googleapis

    with googleapis.serving(gcs.endpoint, tmp_path / "googleapis") as front:
        yield front


# ---- a tiny dataset and model, made once per session ------------------------------------------


@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny import make_examples_dir

    return make_examples_dir(tmp_path_factory.mktemp("examples"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, examples: Path) -> Path:
    from tests.tiny import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("tiny-model"), examples)


@pytest.fixture(scope="session")
def unlinked_op_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny import make_unlinked_op_model

    return make_unlinked_op_model(tmp_path_factory.mktemp("unlinked-op-model"))
