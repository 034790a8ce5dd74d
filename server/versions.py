"""Which version of the model is served: polling its folder, loading, switching, unloading.

TF Serving's defaults, followed here:
- the file system source polls the model's base path every `file_system_poll_wait_seconds`
  (1 s; tensorflow_serving/model_servers/main.cc) and aspires the latest version only
  (tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc). Here a version
  is one `components.serving.serving_versions` lists: a folder whose saved_model.pb, copied
  last by every publish, is there; a half-copied push is not one yet.
- the availability-preserving policy (tensorflow_serving/core/availability_preserving_policy.h,
  the model server's) loads the newly aspired version first, then unloads the old one, and
  unloads the old only once the new one serves: a new version is served once loaded; a
  version removed from the folder gives way to the next highest once that one is loaded (a
  rollback that deletes the newest). An empty folder unloads the served version, as TF
  Serving does unless `servable_versions_always_present` is set (file_system_storage_path_
  source.cc aspires no version; availability_preserving_policy.cc then unloads).
- a version that fails to load is not served and is logged; the version before it stays,
  and the load is tried again at the next polls, LOAD_ATTEMPTS in all (basic_manager.cc
  retries a failed load `max_num_load_retries` times, 5 by default, main.cc): a gs:// version
  whose download failed once loads at the next poll; a broken model is given up on.
- the status endpoint reports every version the server has seen with its state (LOADING,
  AVAILABLE, END) and, for a failed load, its error (servable_state_monitor.h keeps them all,
  newest first; get_model_status_impl.cc prints them).

The served version is one reference, swapped whole: a request takes it once (`get`) and runs
on that version to its end, whatever the poller loads or drops meanwhile; Python frees a
dropped version when its last request ends (TF Serving's ServableHandle does the same).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from components import serving, storage
from server.servable import Servable, tf_message
from server.status import Code, not_found

log = logging.getLogger(__name__)

Load = Callable[[str, int, str], Servable]  # (model name, version, URI) -> the loaded version
LOAD_ATTEMPTS = 6  # one load and TF Serving's default 5 retries (--max_num_load_retries)


@dataclass(frozen=True)
class VersionState:
    """ModelVersionStatus: one version's state and, once its load failed, why."""

    state: str  # "LOADING", "AVAILABLE", "END" (ModelVersionStatus.State's names)
    error_code: Code = Code.OK
    error_message: str = ""


class Versions:
    """The versions of one model under a TF Serving destination (local or gs://)."""

    def __init__(self, name: str, source: str, load: Load) -> None:
        self.name = name
        self.source = source
        self._load = load
        self._served: Servable | None = None
        self._states: dict[int, VersionState] = {}
        self._failures: dict[int, int] = {}  # version -> loads failed; LOAD_ATTEMPTS: given up
        self._lock = threading.Lock()  # guards _served and _states together
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- what requests see ------------------------------------------------------------------

    def get(self, name: str, version: int | None) -> Servable:
        """The servable a request names (ServerCore::GetServableHandle): the latest, or a
        specific version, which must be the one loaded; else NOT_FOUND, as TF Serving's
        basic_manager.cc words it."""
        served = self._served
        if name == self.name and served and version in (None, served.version):
            return served
        wanted = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise not_found(f"Servable not found for request: {wanted}")

    def states(self) -> dict[int, VersionState]:
        """Every version seen, newest first (ServableStateMonitor's VersionMap order)."""
        with self._lock:
            return dict(sorted(self._states.items(), reverse=True))

    @property
    def served_version(self) -> int | None:
        served = self._served
        return served.version if served else None

    # ---- polling ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Look at the folder once; load, switch to and unload as the policy says. A listing
        that fails is logged and changes nothing: the next poll tries again."""
        try:
            versions = serving.serving_versions(self.source)
        except Exception as err:  # a storage error (gs:// unreachable): keep serving
            log.warning("cannot list the versions of %s: %s", self.source, tf_message(err))
            return
        if not versions:
            self._unload()
            return
        candidates = [v for v in versions if self._failures.get(v, 0) < LOAD_ATTEMPTS]
        if not candidates:
            return  # nothing loadable besides: the loaded version stays
        wanted = candidates[-1]
        if wanted != self.served_version:
            self._switch_to(wanted)

    def _switch_to(self, version: int) -> None:
        """Load `version`, serve it, then drop the one served before; a failed load keeps it."""
        self._set_state(version, VersionState("LOADING"))
        uri = storage.join(self.source, str(version))
        try:
            loaded = self._load(self.name, version, uri)
        except Exception as err:  # whatever the SavedModel or the storage raised
            code = Code(err.error_code) if hasattr(err, "error_code") else Code.UNKNOWN
            message = tf_message(err)
            failures = self._failures[version] = self._failures.get(version, 0) + 1
            self._set_state(version, VersionState("END", code, message))
            served = self.served_version
            still = f"still serving version {served}" if served else "no version is served"
            again = "given up" if failures >= LOAD_ATTEMPTS else "tried again at the next poll"
            log.warning(
                "version %d of %s failed to load (%s; attempt %d of %d, %s); %s",
                version,
                self.name,
                message,
                failures,
                LOAD_ATTEMPTS,
                again,
                still,
            )
            return
        with self._lock:
            before, self._served = self._served, loaded
            self._states[version] = VersionState("AVAILABLE")
            if before is not None:
                self._states[before.version] = VersionState("END")
        log.info(
            "serving version %d of %s%s",
            version,
            self.name,
            f" (was version {before.version})" if before else "",
        )

    def _unload(self) -> None:
        """No version is aspired any more (an emptied folder): stop serving the loaded one."""
        with self._lock:
            before, self._served = self._served, None
            if before is not None:
                self._states[before.version] = VersionState("END")
        if before is not None:
            log.warning(
                "no version of %s is left in %s: version %d is no longer served",
                self.name,
                self.source,
                before.version,
            )

    def _set_state(self, version: int, state: VersionState) -> None:
        with self._lock:
            self._states[version] = state

    def start(self, poll_seconds: float) -> None:
        """Poll once now (the first load, before any request is answered), then every
        `poll_seconds` in a background thread until `stop`."""
        self.poll()
        self._thread = threading.Thread(
            target=self._run, args=(poll_seconds,), name=f"versions-{self.name}", daemon=True
        )
        self._thread.start()

    def _run(self, poll_seconds: float) -> None:
        while not self._stop.wait(poll_seconds):
            try:
                self.poll()
            except Exception:  # a bug must not end polling silently: say it, poll again
                log.exception("polling %s failed", self.source)

    def stop(self) -> None:
        """End polling (a load under way finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
