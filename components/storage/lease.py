"""A lease: one writer at a time does a piece of work that every concurrent caller wants done.

Two runs started on the same data both need its dataset version tokenized; without a lease both
would tokenize it and one would throw its work away. `hold_or_wait` makes the first caller the
holder (a create-only lease file) while the others wait for `done()`. The holder rewrites the
lease every `heartbeat_s`, so a holder that died (SIGKILL, a lost node) is noticed once its
lease has not changed for `stale_after_s`, and a waiter takes over.

"Has not changed" is measured on the waiter's own monotonic clock, from when it first saw the
lease as it is (the object's generation on GCS, its bytes on disk), never from the time written
in it, as Kubernetes' leader election does (client-go tools/leaderelection/leaderelection.go:
`observedTime`, "tolerant to arbitrary clock skew, but not ... to arbitrary clock skew rate").
Runs on different nodes do not share a clock: a holder whose clock is behind would otherwise
lose a live lease, and one whose clock is ahead would, dead, keep it for as long. The cost: a
waiter that arrives at a lease left by a holder long dead waits `stale_after_s` before taking
over. The written `heartbeat` time stays, for people reading the lease.

That wait is cut short where a waiter can see for itself that the holder is gone: a holder
that ran on the waiter's own machine (the same host name and kernel boot) and in its PID and
time namespaces, whose process no longer exists, or is a zombie, or is another process under
the same PID (its start time differs). That is the common case of one machine: `gptpipe run
--local` again after a killed one (its steps are subprocesses of one host). A holder elsewhere
(another pod has its own host name and PID namespace), or one that cannot be looked up (no
/proc), is judged by its heartbeat alone. The record names the process as git's `gc.pid`
does, by host and PID, with the boot, namespaces and start time added so that neither another
machine nor a reused PID can pass for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from components.storage import gcs, local
from components.storage.files import create_exclusive, update_bytes
from components.storage.uris import is_gcs
from contracts.process import stat_fields

HEARTBEAT_S = 10.0  # how often a holder says it is alive
STALE_AFTER_S = 60.0  # a lease a waiter has seen unchanged this long belongs to a dead holder
POLL_S = 0.5  # how often a waiter looks again


@contextlib.contextmanager
def hold_or_wait(
    uri: str,
    done: Callable[[], bool],
    *,
    heartbeat_s: float | None = None,
    stale_after_s: float | None = None,
    poll_s: float | None = None,
) -> Iterator[bool]:
    """Yield True holding the lease at `uri` (do the work), or False once `done()` is true.

    The lease is released when the block ends, whether the work succeeded or not; a waiter
    whose holder failed then takes the lease and tries the work itself. The timings default
    to this module's HEARTBEAT_S, STALE_AFTER_S and POLL_S.
    """
    heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    stale_after_s = STALE_AFTER_S if stale_after_s is None else stale_after_s
    poll_s = POLL_S if poll_s is None else poll_s
    holder = _Holder(secrets.token_hex(8), this_process())
    seen = _Seen()
    while True:
        if done():
            yield False
            return
        if create_exclusive(uri, holder.record(0)):
            break
        _take_over_if_stale(uri, stale_after_s, seen, holder.process)
        time.sleep(poll_s)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(uri, holder, heartbeat_s, stop), daemon=True)
    beat.start()
    try:
        yield True
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(Exception):
            _release(uri, holder.token)


class _Holder:
    """Who holds a lease: a random token, and this process as a waiter here can look it up."""

    def __init__(self, token: str, process: dict[str, object] | None) -> None:
        self.token = token
        self.process = process

    def record(self, beat: int) -> bytes:
        """The lease's bytes; `beat` counts the holder's heartbeats, so that every one changes
        them whatever its wall clock does."""
        record = {"holder": self.token, "beat": beat, "heartbeat": time.time()}
        return json.dumps({**record, "process": self.process}).encode()


# What a lease's process must share with a waiter for the waiter's lookup of its PID to be a
# lookup of it: the host's name and the kernel's boot (not another machine, nor this one before
# a reboot), the PID namespace (not another container's PIDs), and the time namespace (start
# times in /proc are shifted by the reader's). A kernel without time namespaces has None in both.
SAME = ("host", "boot", "pidns", "timens")


def this_process() -> dict[str, object] | None:
    """This process as another process on this machine can look it up (`SAME`, its PID and
    start time); None where /proc does not tell (not Linux, or another namespace's /proc)."""
    pid = os.getpid()
    try:
        if os.readlink("/proc/self") != str(pid):
            return None
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        timens = (
            os.readlink("/proc/self/ns/time") if os.path.lexists("/proc/self/ns/time") else None
        )
        return {
            "host": socket.gethostname(),
            "boot": boot,
            "timens": timens,
            "pidns": os.readlink("/proc/self/ns/pid"),
            "pid": pid,
            "start": _start_ticks(pid),
        }
    except Exception:  # noqa: BLE001 (anything odd about /proc: waiters fall back on heartbeats)
        return None


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat's 22nd field); None
    for a zombie (exited, not yet reaped); FileNotFoundError once it is reaped."""
    fields = stat_fields(pid)
    # A main thread that exited while other threads run shows "Z" too: the process lives.
    if fields[0] in ("Z", "X") and len(os.listdir(f"/proc/{pid}/task")) <= 1:
        return None
    return int(fields[19])


def holder_gone(data: bytes, here: dict[str, object] | None) -> bool:
    """True only if the lease in `data` names a process that is gone (`process_gone`) from the
    machine of `here` (this process). Anything it cannot tell is False: the waiter then goes by
    the heartbeat."""
    try:
        there = json.loads(data)["process"]
    except (ValueError, TypeError, KeyError, RecursionError):  # not a lease of ours
        return False
    return process_gone(there, here)


def process_gone(there: Any, here: dict[str, object] | None) -> bool:
    """True only if `there`, a `this_process()` record, names a process that shares `SAME` with
    `here` (this process) and is no longer running: exited, a zombie, or its PID reused.
    Anything it cannot tell (another machine, a record that is not one) is False."""
    try:
        pid, start = int(there["pid"]), there["start"]
        same = here is not None and pid > 0 and all(there[k] == here[k] for k in SAME)
    except (ValueError, TypeError, KeyError, OverflowError):  # not a record of ours
        return False
    if not same:
        return False
    try:
        os.kill(pid, 0)  # no signal sent: only whether the PID exists
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's process: it exists; its /proc entry may be hidden (hidepid)
    except (OSError, OverflowError):
        return False
    try:
        return _start_ticks(pid) != start
    except (OSError, ValueError, IndexError):
        return False  # exists but cannot be read: it may be the holder


class _Seen:
    """What one waiter last saw of a lease (its generation or bytes), and since when (its own
    monotonic clock)."""

    def __init__(self) -> None:
        self.marker: object = None
        self.since = 0.0

    def unchanged_for(self, marker: object) -> float:
        """Seconds the lease has looked like `marker`: 0 when it just changed."""
        now = time.monotonic()
        if marker != self.marker:
            self.marker, self.since = marker, now
        return now - self.since


class _Lost(Exception):
    """The lease was taken over: its holder missed heartbeats for `stale_after_s`."""


def _heartbeat(uri: str, holder: _Holder, every_s: float, stop: threading.Event) -> None:
    def beat(old: bytes | None) -> bytes:
        record = json.loads(old) if old is not None else {}
        if record.get("holder") != holder.token:
            raise _Lost(uri)
        return holder.record(int(record.get("beat", 0)) + 1)

    while not stop.wait(every_s):
        try:
            update_bytes(uri, beat)  # under the same lock or precondition as a takeover
        except _Lost:
            return
        except Exception:  # noqa: S112 (a missed beat only risks a takeover later)
            continue


def _release(uri: str, token: str) -> None:
    """Delete the lease if it is still this holder's: one taken over (its beats failed for
    `stale_after_s`, say through a storage outage) is its successor's now."""

    def ours(data: bytes | None) -> bool:
        with contextlib.suppress(ValueError, AttributeError):
            return data is not None and json.loads(data).get("holder") == token
        return False

    if is_gcs(uri):
        data, generation = gcs.read_generation(uri)
        if ours(data):
            gcs.delete_if_generation(uri, generation)
        return
    path = Path(uri)
    # A takeover happens under the flock's file, so without that file (no waiter has looked
    # at this lease, nor has a heartbeat run) there is no successor: no lock, and none left.
    locked = local.lock_path(path).exists()
    guard = local.exclusive_lock(path) if locked else contextlib.nullcontext()
    with guard, contextlib.suppress(FileNotFoundError):
        if ours(path.read_bytes()):
            path.unlink()


def _take_over_if_stale(
    uri: str, stale_after_s: float, seen: _Seen, here: dict[str, object] | None
) -> None:
    """Delete the lease if it has not changed for `stale_after_s` of this waiter's watching, or
    its holder is seen gone from this machine (`holder_gone`), unless it changed since we read
    it."""
    if is_gcs(uri):
        data, generation = gcs.read_generation(uri)
        if data is not None and (
            seen.unchanged_for(generation) > stale_after_s or holder_gone(data, here)
        ):
            gcs.delete_if_generation(uri, generation)
        return
    with local.exclusive_lock(Path(uri)):  # the heartbeat's rename cannot slip in between
        path = Path(uri)
        with contextlib.suppress(FileNotFoundError):
            data = path.read_bytes()
            if seen.unchanged_for(data) > stale_after_s or holder_gone(data, here):
                path.unlink()
