"""Which namespace's objects a KFP 2.5 API request sees: single-user mode ignores the
namespace asked for, multi-user mode scopes to it exactly, and runs and recurring runs are
scoped by experiment first (resource_manager.go, run_server.go, job_server.go)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tests.doubles.kfp.wire import ApiError


class NamespaceScope:
    """The API double's scoping, for a server in `multi_user` mode or not, whose experiments
    are `experiments` (by id)."""

    multi_user: bool
    experiments: dict[str, Any]

    def namespace(self, given: str | None) -> str:
        """resource_manager.go ReplaceNamespace: the namespace asked for in multi-user mode;
        in single-user mode always "", whatever was asked."""
        return (given or "") if self.multi_user else ""

    def _exactly_in(self, items: Iterable[Any], query: dict[str, str]) -> list[Any]:
        namespace = self.namespace(query.get("namespace"))
        return [i for i in items if (i.namespace or "") == namespace]

    def _scoped(
        self,
        items: Iterable[Any],
        query: dict[str, str],
        namespace_of: Callable[[Any], str],
        empty: str,
        failed: str,
    ) -> list[Any]:
        """Runs or recurring runs as run_server.go listRuns and job_server.go listJobs scope
        them: an experiment's (`experiment_id`), else exactly the namespace's (run_store.go,
        job_store.go FilterOnNamespace), else, in single-user mode, all of them
        (FilterOnResourceReference with an empty namespace); multi-user mode refuses ""
        (canAccessRun, canAccessJob)."""
        experiment = query.get("experiment_id", "")
        if experiment:
            if experiment not in self.experiments:
                raise ApiError(404, 5, f"{failed}: Experiment {experiment} not found")
            return [i for i in items if i.experiment_id == experiment]
        namespace = self.namespace(query.get("namespace"))
        if self.multi_user and not namespace:
            raise ApiError(400, 3, f"{failed}: Invalid input error: {empty}")
        if not namespace and not self.multi_user:
            return list(items)
        return [i for i in items if namespace_of(i) == namespace]
