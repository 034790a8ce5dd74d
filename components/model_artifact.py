"""The Model artifact as its readers take it: complete only with its MODEL_COMPLETE marker.

The trainer's export (trainer/export.py) writes the marker last, after the rest of the Model is
in place, because on GCS the Model's folder is moved into place one object at a time: without
the marker, a Model whose export died midway looks like a Model. Train (after its job), evaluate
and push all check here before they read anything else of it. Nobody waits for the marker: each
of them starts after the worker that wrote the Model exited, and GCS shows an object to every
read and listing once its upload has finished, so a marker that is not there now never will be.
"""

from __future__ import annotations

from components import storage
from contracts.artifacts import MODEL_COMPLETE
from contracts.errors import UserError


def require_complete(model_dir: str) -> None:
    """Raise a one-line UserError unless the Model at `model_dir` (local or gs://) is complete."""
    if storage.has_content(storage.join(model_dir, MODEL_COMPLETE)):
        return
    if not storage.has_content(model_dir):
        raise UserError(f"no Model at {model_dir}: re-run the train step")
    raise UserError(
        f"the Model at {model_dir} is incomplete: it has no {MODEL_COMPLETE} file, which its "
        "export writes last (the export was interrupted, or the folder was copied in part); "
        "re-run the train step"
    )
