"""`gptpipe rollback`: serve an earlier model version again, as the newest, with its lineage."""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path
from typing import Any

from contracts.errors import UserError
from pipelines.config import DEFAULT_ROOT


def add_parser(sub: Any) -> None:
    """Add `rollback` to the `gptpipe` command's subparsers."""
    _add_rollback(sub)


def _add_rollback(sub: Any) -> None:
    roll = sub.add_parser("rollback", help="re-publish an earlier model version as the newest")
    roll.add_argument("--destination", required=True, help="serving folder (local or gs://)")
    roll.add_argument("--to", dest="to_version", type=int, required=True, help="version to restore")
    roll.add_argument(
        "--metadata",
        default=str(DEFAULT_ROOT / "metadata.sqlite"),
        help="ML Metadata store: SQLite path or host:port",
    )
    roll.set_defaults(func=_cmd_rollback)


def _cmd_rollback(args: argparse.Namespace) -> int:
    from components import lineage, provenance, serving, storage

    if not lineage.is_service(args.metadata) and not Path(args.metadata).is_file():
        raise UserError(
            f"no metadata store at {args.metadata}: pass --metadata, the runs' metadata.sqlite "
            "(or host:port), so the rollback is recorded beside the pushes it undoes"
        )
    destination = serving.normalize(args.destination)  # as the pushes recorded it
    params = {"destination": destination, "rollback_to": args.to_version}
    # Unique even for two rollbacks in one second: lineage keeps one run per id.
    run_id = f"rollback-{int(time.time())}-{uuid.uuid4().hex[:6]}"
    found = provenance.detect(provenance.LOCAL_IMAGE, os.environ).properties()
    with lineage.step(args.metadata, "push", "gptpipe", run_id, params, found) as rec:
        rec.input(
            "model", lineage.PUSHED_MODEL_TYPE, storage.join(destination, str(args.to_version))
        )
        version = serving.rollback(destination, args.to_version)
        rec.output(
            "pushed_model",
            lineage.PUSHED_MODEL_TYPE,
            storage.join(destination, str(version)),
            {
                "pushed": 1,
                "pushed_destination": destination,
                "pushed_version": str(version),
                "reason": f"rollback to version {args.to_version}",
            },
        )
    print(f"version {args.to_version} of {destination} is now served as version {version}")
    return 0
