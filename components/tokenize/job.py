"""Tokenize's parts through the indexed launchers (components/jobs/indexed/): each phase as
processes on this machine (`LocalParts`), or on a cluster as a Kubernetes `batch/v1` Indexed
Job (`JobParts`), with the same semantics: `JOB_COMPLETION_INDEX` names the part, a part that
stops on bad input fails the phase at once with its own message, another failure runs that
part again (it resumes from its units done).

The Job runs the step's own image (the code that plans is the code that runs the parts) with
`python -m components.tokenize.parts <phase> <work>`, one pod per part, each reading its
`JOB_COMPLETION_INDEX`. It is placed as the train step places its TFJob: in the step pod's
namespace, owned by the step pod (so deleting the run deletes it), as the step's service
account with its image pull secrets (components/jobs/placement.py); the same RBAC file grants
it (deploy/rbac.yaml). A part that stops on bad input fails the Job at once (its pod failure
policy does not retry exit INPUT_ERROR_EXIT) and the step fails with the part's own message.
SIGTERM to the step deletes the Job (components/jobs/indexed/cleanup.py), and the exit
handler deletes the run's Jobs by label.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from components import provenance
from components.jobs.naming import job_name, run_label
from contracts.params import TokenizeParams

if TYPE_CHECKING:
    from components.step import Step

CONTAINER_PYTHON = "python"  # the image's interpreter (images/Dockerfile)
DEADLINE_SECONDS = 24 * 3600  # a phase that runs longer than this fails, and its pods go


PROGRAM = ("-m", "components.tokenize.parts")  # the part's program, after the interpreter
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the `components` package


class LocalParts:
    """A `phases.PartRunner` that runs a phase as processes here (the local indexed launcher)."""

    def __call__(self, phase: str, work: str, parts: int) -> None:
        from components.jobs.indexed.make import make_indexed_launcher
        from components.jobs.indexed.spec import IndexedJobSpec

        path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
        spec = IndexedJobSpec(
            name=f"tokenize-{phase}",
            command=(sys.executable, *PROGRAM, phase, work),
            completions=parts,
            parallelism=parts,
            env={"PYTHONPATH": path},
            allow_unpinned=True,
        )
        make_indexed_launcher("local").run(spec)


class JobParts:
    """A `phases.PartRunner` that runs a phase as an Indexed Job of `parts` pods."""

    def __init__(self, params: TokenizeParams, step: Step) -> None:
        self.params = params
        self.step = step

    def __call__(self, phase: str, work: str, parts: int) -> None:
        from components.jobs.indexed.make import make_indexed_launcher, place
        from components.jobs.indexed.spec import IndexedJobSpec

        step = self.step
        spec = IndexedJobSpec(
            # one Job per phase per run: a retried step finds and re-attaches to its Job
            name=job_name(step.edge.run_id, f"tokenize-{phase}", prefix="tokenize"),
            command=(CONTAINER_PYTHON, *PROGRAM, phase, work),
            completions=parts,
            parallelism=parts,
            image=step.image,
            run_id=run_label(step.edge.run_id),
            cpu=self.params.cpu,
            memory=self.params.memory,
            active_deadline_seconds=DEADLINE_SECONDS,
            allow_unpinned=not provenance.is_pinned(step.image),
        )
        make_indexed_launcher("job").run(place(spec, step.edge.pod))
