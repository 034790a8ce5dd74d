"""Fault rows for a TF Serving destination: racing pushes and rollbacks, and publishers that die.

Every race runs real processes released at one moment (`processes.run_together`). On gs:// they
go through `gcs_strict`, the emulator behind a proxy that enforces GCS's preconditions, since
the create-only claims and copies are what keeps two publishers apart.
"""

import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from components import serving, storage
from components.push import executor as push
from contracts.artifacts import MODEL_COMPLETE, RETIRED_FILE
from tests.processes import REPO, run_together
from tests.tiny import saved_model_graph

WHERE = ["local", "gcs"]


class PodKilled(BaseException):
    """A killed process: like SIGKILL, it skips every `except Exception` clean-up on its way."""


def model(tmp_path: Path, name: str, size: int = 1 << 20) -> str:
    """A SavedModel-shaped folder whose every file says which model it is."""
    saved = tmp_path / name / "Format-Serving"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(saved_model_graph(f"graph of {name}"))
    (saved / "variables" / "variables.index").write_bytes(f"index of {name}".encode())
    (saved / "variables" / "variables.data-00000-of-00001").write_bytes(name.encode() * size)
    (tmp_path / name / MODEL_COMPLETE).write_text("")  # the export's last write
    return str(tmp_path / name)


def blessing(tmp_path: Path, name: str, baseline: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "BLESSED").write_text("")
    (folder / "blessing.json").write_text(json.dumps({"reason": "ok", "baseline_model": baseline}))
    return str(folder)


def destination(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if where == "local":
        return str(tmp_path / "serving")
    return request.getfixturevalue("gcs_strict").uri("serving")


def child_env() -> dict[str, str]:
    """The children reach the same GCS endpoint (STORAGE_EMULATOR_HOST) as this process."""
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore::FutureWarning"}


def assert_every_version_whole(dest: str, sources: list[str]) -> None:
    """Each complete version holds exactly the files of one of `sources`: none is mixed."""
    for version in serving.serving_versions(dest):
        files = storage.tree_crc32c(storage.join(dest, str(version)))
        assert any(files == storage.tree_crc32c(s) for s in sources), f"version {version} mixed"


PUBLISH = """
from components import serving
WAIT()
print(serving.publish_next({source!r}, {dest!r}))
"""


@pytest.mark.fault("four pushes publish to one destination at the same moment")
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.slow
def test_racing_publishes_take_distinct_whole_versions(where, tmp_path, request, ledger):
    dest = destination(where, tmp_path, request)
    sources = [f"{model(tmp_path, f'm{i}')}/Format-Serving" for i in range(4)]

    results = run_together([PUBLISH.format(source=s, dest=dest) for s in sources], child_env())

    assert [r.returncode for r in results] == [0] * 4, [r.stderr[-2000:] for r in results]
    versions = [int(r.stdout.split()[-1]) for r in results]
    assert sorted(versions) == [1, 2, 3, 4]
    for source, version in zip(sources, versions, strict=True):
        assert storage.same_files(source, storage.join(dest, str(version)))
    ledger("served versions", 4, len(serving.serving_versions(dest)))
    assert not [n for n in storage.names_taken(dest) if n.startswith(".staging-")]


ROLLBACK = """
from components import serving
WAIT()
print(serving.rollback({dest!r}, 1))
"""


@pytest.mark.slow
@pytest.mark.fault("two rollbacks of one destination at the same moment")
@pytest.mark.parametrize("where", WHERE)
def test_racing_rollbacks_both_restore_and_retire(where, tmp_path, request, ledger):
    dest = destination(where, tmp_path, request)
    sources = [f"{model(tmp_path, f'm{i}', 1024)}/Format-Serving" for i in (1, 2, 3)]
    for source in sources:
        serving.publish_next(source, dest)

    results = run_together([ROLLBACK.format(dest=dest)] * 2, child_env())

    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    assert sorted(int(r.stdout.split()[-1]) for r in results) == [4, 5]
    assert serving.serving_versions(dest) == [1, 2, 3, 4, 5]
    assert storage.same_files(storage.join(dest, "5"), sources[0])  # the good model is served
    assert_every_version_whole(dest, sources)
    retired = json.loads(storage.read_bytes(storage.join(dest, RETIRED_FILE)))
    ledger("retired versions", 2, len(retired))
    assert sorted(retired) == ["2", "3"]


UPDATE = """
import json
from components import storage
WAIT()
for i in range(15):
    def change(old, i=i):
        entries = json.loads(old) if old else {{}}
        entries["{name}-" + str(i)] = i
        return json.dumps(entries).encode()
    storage.update_bytes({uri!r}, change)
"""


@pytest.mark.fault("four processes update one .retired.json at the same moment")
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.slow
def test_concurrent_updates_of_one_file_lose_nothing(where, tmp_path, request, ledger):
    uri = storage.join(destination(where, tmp_path, request), RETIRED_FILE)
    names = ["a", "b", "c", "d"]

    results = run_together([UPDATE.format(name=n, uri=uri) for n in names], child_env())

    assert [r.returncode for r in results] == [0] * 4, [r.stderr[-2000:] for r in results]
    entries = json.loads(storage.read_bytes(uri))
    ledger("updates", 4 * 15, len(entries))
    assert sorted(entries) == sorted(f"{n}-{i}" for n in names for i in range(15))


PUSH = """
from components.push import executor
WAIT()
result = executor.run({model!r}, {blessing!r}, {dest!r}, {pushed!r})
print(result.pushed, result.pushed_version, result.reason)
"""


@pytest.mark.fault("a push races a rollback of the model it was compared with")
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.slow
def test_a_push_racing_a_rollback_never_outlives_the_rollback(where, tmp_path, request):
    dest = destination(where, tmp_path, request)
    good, bad = model(tmp_path, "good", 1024), model(tmp_path, "bad", 1024)
    candidate = model(tmp_path, "candidate", 1024)
    for m in (good, bad):
        serving.publish_next(f"{m}/Format-Serving", dest)
    compared_with = blessing(tmp_path, "blessing", storage.join(dest, "2"))

    push_script = PUSH.format(
        model=candidate, blessing=compared_with, dest=dest, pushed=str(tmp_path / "pushed")
    )
    results = run_together([push_script, ROLLBACK.format(dest=dest)], child_env())

    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    latest = serving.latest_version_uri(dest)
    assert latest and storage.same_files(latest, f"{good}/Format-Serving")
    assert_every_version_whole(dest, [f"{m}/Format-Serving" for m in (good, bad, candidate)])
    pushed, *_ = results[0].stdout.split()
    if pushed == "0":
        assert "served model changed since evaluation" in results[0].stdout


def test_a_push_compared_with_an_older_model_is_not_published(tmp_path):
    dest = str(tmp_path / "serving")
    for name in ("v1", "v2"):
        serving.publish_next(f"{model(tmp_path, name, 16)}/Format-Serving", dest)
    stale = blessing(tmp_path, "blessing", f"{dest}/1")

    result = push.run(model(tmp_path, "new", 16), stale, dest, str(tmp_path / "pushed"))

    assert (result.pushed, result.pushed_version) == (0, "")
    assert "compared with version 1, and version 2 is served now" in result.reason
    assert serving.serving_versions(dest) == [1, 2]
    claims = sorted(p.name for p in Path(dest, serving.CLAIMS_DIR).iterdir())
    assert claims == ["1", "2"]  # the refused push released the number it had claimed


def _claim(dest: str, version: int, age_s: float = 0.0, process: dict | None = None) -> str:
    """Another push's claim of `version`, as publish_next writes it, made `age_s` ago by
    `process` (storage.this_process() of its publisher; None where /proc did not tell)."""
    record = {
        "writer": "another",
        "claimed_at": time.time() - age_s,
        "source": "elsewhere",
        "process": process,
    }
    uri = storage.join(dest, serving.CLAIMS_DIR, str(version))
    assert storage.create_exclusive(uri, json.dumps(record).encode())
    return uri


def _publish_in_background(source: str, dest: str, expect_latest: int) -> dict:
    """publish_next in a thread; its outcome lands in the dict returned."""
    outcome: dict = {}

    def publish() -> None:
        try:
            outcome["version"] = serving.publish_next(source, dest, expect_latest)
        except serving.ServedModelChanged as err:
            outcome["refused"] = str(err)

    outcome["thread"] = threading.Thread(target=publish, daemon=True)
    outcome["thread"].start()
    return outcome


@pytest.mark.fault("two pushes compared with the same model publish one after the other")
@pytest.mark.parametrize("how_the_first_ends", ["published", "failed", "never"])
def test_a_push_waits_for_one_claimed_below_it_compared_with_the_same_model(
    tmp_path, monkeypatch, how_the_first_ends
):
    """The second is never published on top of the first unseen.

    Both were blessed against version 1; the first claimed version 2 and is still copying when
    the second claims 3. Published, the first is what is served when the second checks:
    refused. Failed (its claim freed), the second goes on top of version 1. Never ending, the
    second is refused once it has waited IN_FLIGHT_WAIT_S."""
    monkeypatch.setattr(serving, "IN_FLIGHT_POLL_S", 0.05)
    monkeypatch.setattr(serving, "IN_FLIGHT_WAIT_S", 1.0 if how_the_first_ends == "never" else 60)
    dest = str(tmp_path / "serving")
    serving.publish_next(f"{model(tmp_path, 'v1', 16)}/Format-Serving", dest)
    first, second = (f"{model(tmp_path, n, 16)}/Format-Serving" for n in ("first", "second"))
    claim = _claim(dest, 2)

    looks: list[list[int]] = []  # what the second saw in flight, each time it looked
    in_flight = serving._in_flight

    def look(*args: Any) -> list[int]:
        looks.append(in_flight(*args))
        return looks[-1]

    monkeypatch.setattr(serving, "_in_flight", look)

    outcome = _publish_in_background(second, dest, expect_latest=1)
    until = time.monotonic() + 120  # only a push that never looks again reaches it
    while len(looks) < 2:  # the second has claimed, seen the first in flight, and looked again
        assert outcome["thread"].is_alive(), outcome
        assert time.monotonic() < until, f"the second push looked {len(looks)} time(s)"
        time.sleep(0.01)
    assert looks[:2] == [[2], [2]] and serving.serving_versions(dest) == [1]
    assert outcome["thread"].is_alive() or how_the_first_ends == "never"  # (1 s to wait there)
    if how_the_first_ends == "published":
        storage.publish_dir(first, storage.join(dest, "2"), ready=serving.READY)
    elif how_the_first_ends == "failed":
        storage.delete_file(claim)
    outcome["thread"].join(timeout=30)

    if how_the_first_ends == "failed":
        assert outcome.get("version") == 3 and serving.serving_versions(dest) == [1, 3]
        return
    assert "refused" in outcome and not Path(dest, serving.CLAIMS_DIR, "3").exists()
    if how_the_first_ends == "published":
        assert "compared with version 1, and version 2 is served now" in outcome["refused"]
        assert serving.serving_versions(dest) == [1, 2]
    else:
        assert "another push is still publishing version 2" in outcome["refused"]
        assert serving.serving_versions(dest) == [1]


def test_a_dead_publishers_old_claim_below_does_not_hold_a_push_back(tmp_path, monkeypatch):
    monkeypatch.setattr(serving, "IN_FLIGHT_WAIT_S", 600)  # were it waited for, this would hang
    dest = str(tmp_path / "serving")
    serving.publish_next(f"{model(tmp_path, 'v1', 16)}/Format-Serving", dest)
    _claim(dest, 2, age_s=serving.STALE_CLAIM_S + 60)  # killed an hour ago: its number skipped
    pushed = serving.publish_next(f"{model(tmp_path, 'v3', 16)}/Format-Serving", dest, 1)
    assert pushed == 3 and serving.serving_versions(dest) == [1, 3]


@pytest.mark.fault("a local push killed mid-copy, its claim left behind")
def test_a_claim_whose_publisher_on_this_machine_has_ended_does_not_hold_a_push_back(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(serving, "IN_FLIGHT_WAIT_S", 600)  # were it waited for, this would hang
    dest = str(tmp_path / "serving")
    serving.publish_next(f"{model(tmp_path, 'v1', 16)}/Format-Serving", dest)
    ended = subprocess.run(  # a publisher's process record, as a killed push leaves it
        [
            sys.executable,
            "-c",
            "import json; from components import storage; "
            "print(json.dumps(storage.this_process()))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=REPO,
    )
    process = json.loads(ended.stdout)
    if process is None:
        pytest.skip("/proc does not identify processes here")
    _claim(dest, 2, process=process)  # a minute-old claim: only its ended process frees it
    pushed = serving.publish_next(f"{model(tmp_path, 'v3', 16)}/Format-Serving", dest, 1)
    assert pushed == 3 and serving.serving_versions(dest) == [1, 3]
    # the same claim by a process still running (this one) holds the next push back
    _claim(dest, 4, process=storage.this_process())
    monkeypatch.setattr(serving, "IN_FLIGHT_WAIT_S", 0.2)
    with pytest.raises(serving.ServedModelChanged, match="still publishing version 4"):
        serving.publish_next(f"{model(tmp_path, 'v5', 16)}/Format-Serving", dest, 3)


@pytest.mark.fault("Ctrl-C to a push waiting for one claimed below it")
def test_a_push_interrupted_while_it_waits_frees_its_claim(tmp_path, monkeypatch):
    dest = str(tmp_path / "serving")
    serving.publish_next(f"{model(tmp_path, 'v1', 16)}/Format-Serving", dest)
    _claim(dest, 2)  # in flight: the push below waits for it
    source = f"{model(tmp_path, 'v3', 16)}/Format-Serving"

    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    clock = types.SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=ctrl_c)
    monkeypatch.setattr(serving, "time", clock)  # serving's clock only
    with pytest.raises(KeyboardInterrupt):
        serving.publish_next(source, dest, 1)
    assert sorted(p.name for p in Path(dest, serving.CLAIMS_DIR).iterdir()) == ["1", "2"]


def test_a_push_to_an_empty_destination_needs_one_compared_with_nothing(tmp_path):
    dest = str(tmp_path / "serving")
    serving.publish_next(f"{model(tmp_path, 'v1', 16)}/Format-Serving", dest)
    first_push = blessing(tmp_path, "blessing", "")  # evaluate found nothing in service

    result = push.run(model(tmp_path, "new", 16), first_push, dest, str(tmp_path / "pushed"))

    assert result.pushed == 0 and "compared with no model, and version 1" in result.reason


@pytest.mark.fault("a rollback killed after retiring, before publishing")
@pytest.mark.parametrize("where", WHERE)
def test_a_rollback_killed_between_its_steps_is_safe_and_completes_on_rerun(
    where, tmp_path, request, monkeypatch
):
    dest = destination(where, tmp_path, request)
    good, bad = model(tmp_path, "good", 1024), model(tmp_path, "bad", 1024)
    for m in (good, bad):
        serving.publish_next(f"{m}/Format-Serving", dest)

    def killed(*args, **kwargs):
        raise PodKilled("rollback killed")

    with monkeypatch.context() as m:
        m.setattr(serving, "publish_next", killed)
        with pytest.raises(PodKilled):
            serving.rollback(dest, 1)
    # The bad model is retired already: a cached re-run of its push is refused ...
    again = push.run(
        bad, blessing(tmp_path, "b", storage.join(dest, "1")), dest, str(tmp_path / "p")
    )
    assert again.pushed == 0 and "a rollback retired this model" in again.reason
    # ... and running the rollback again completes it.
    assert serving.rollback(dest, 1) == 3
    assert storage.same_files(storage.join(dest, "3"), f"{good}/Format-Serving")


DISK_LIMITED_PUSH = """
import resource, signal
from components.push import executor
from contracts.errors import one_line_errors
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))
WAIT()
with one_line_errors("push"):
    executor.run({model!r}, {blessing!r}, {dest!r}, {pushed!r})
"""


@pytest.mark.fault("the disk fills while a push copies the model")
def test_a_full_disk_during_a_push_leaves_no_version(tmp_path):
    dest = tmp_path / "serving"
    big = model(tmp_path, "big", 1 << 20)  # 3 MB of variables over a 256 KB file-size limit
    script = DISK_LIMITED_PUSH.format(
        model=big, blessing=blessing(tmp_path, "b", ""), dest=str(dest), pushed=str(tmp_path / "p")
    )

    (result,) = run_together([script], child_env())

    assert result.returncode == 2
    # One line, after the log lines TensorFlow prints as it starts (push reads the graph with it).
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"push: error: disk full while writing {dest}/1: File too large; free space there (or "
        "raise the quota) and run the step again: nothing half-written was left"
    )
    assert [p.name for p in dest.iterdir()] == [serving.CLAIMS_DIR]  # no version, no temporary
    assert list((dest / serving.CLAIMS_DIR).iterdir()) == []  # and the number is free again
    assert not (tmp_path / "p").exists()
