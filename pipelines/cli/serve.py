"""`gptpipe serve`: a served model's TF Serving REST API on this machine (the `server` package).

TF Serving has no package for this platform, so this is its embedded stand-in, as kfp.local
is KFP's: it serves the newest complete version of a TF Serving destination (the folder push
publishes into) with TF Serving's paths, JSON and status codes, and follows pushes and
rollbacks as TF Serving does. `gptpipe generate --endpoint` and `score --endpoint` are its
clients, and work against TF Serving on a cluster too.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from contracts.artifacts import SAVED_MODEL_FILE
from contracts.errors import UserError
from pipelines.cli.model import DEFAULT_MODEL

_NAME = re.compile(r"[^/:]+")  # what TF Serving's paths take as a model name


def add_parser(subparsers: Any) -> None:
    """Add `serve` to the `gptpipe` command's subparsers."""
    from server import app, guards, httpd

    p = subparsers.add_parser(
        "serve", help="serve a model over TF Serving's REST API on this machine"
    )
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"the serving folder, local or gs:// (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--name",
        default=None,
        help="the model's name in the URL paths (default: the folder's last part, gpt)",
    )
    p.add_argument("--port", type=int, default=app.DEFAULT_PORT, help="default %(default)s")
    p.add_argument(
        "--host", default=app.DEFAULT_HOST, help="the address to listen on (default %(default)s)"
    )
    p.add_argument(
        "--poll-seconds",
        type=float,
        default=app.DEFAULT_POLL_SECONDS,
        help="how often to look for a new version (default %(default)s)",
    )
    p.add_argument(
        "--max-new-tokens-cap",
        type=int,
        default=guards.DEFAULT_MAX_NEW_TOKENS_CAP,
        help="the most tokens one generate request may ask for (default %(default)s)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=httpd.DEFAULT_MAX_BODY_BYTES,
        help="the largest request body read; larger is refused (default %(default)s)",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C (or SIGTERM); print one line once requests are answered."""
    from server import app

    settings = settings_from(args)
    _log_to_stderr()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with app.running(settings) as running:
            version = running.versions.served_version
            served = f"version {version}" if version is not None else "no version yet"
            print(
                f"gptpipe serve: serving {settings.name} ({served}) at {running.url} "
                "(TF Serving's REST API; Ctrl-C stops)",
                flush=True,
            )
            stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("gptpipe serve: stopped", file=sys.stderr)
    return 0


def settings_from(args: argparse.Namespace) -> Any:
    """The server's Settings from the command line, each checked (a UserError names the fix)."""
    from components import serving
    from server import app, guards

    source = serving.normalize(args.model)
    name = args.name if args.name is not None else source.rstrip("/").rsplit("/", 1)[-1]
    if not _NAME.fullmatch(name):
        raise UserError(f"--name {name!r}: pass a name without '/' or ':' (such as gpt)")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: pass 0 to 65535 (0: any free port)")
    if not args.poll_seconds > 0:
        raise UserError(f"--poll-seconds {args.poll_seconds}: pass a number above 0")
    if args.max_new_tokens_cap < 0:
        raise UserError(f"--max-new-tokens-cap {args.max_new_tokens_cap}: pass 0 or more")
    if args.max_body_bytes < 1:
        raise UserError(f"--max-body-bytes {args.max_body_bytes}: pass 1 or more")
    _check_source(source)
    return app.Settings(
        source=source,
        name=name,
        host=args.host,
        port=args.port,
        poll_seconds=args.poll_seconds,
        limits=guards.Limits(max_new_tokens=args.max_new_tokens_cap),
        max_body_bytes=args.max_body_bytes,
    )


def _check_source(source: str) -> None:
    """A serving folder that is there (one without a complete version yet is served once a
    push lands); a SavedModel folder or a typo is a UserError."""
    from components import storage

    if storage.has_content(storage.join(source, SAVED_MODEL_FILE)):
        raise UserError(
            f"{source} is a SavedModel folder; serve takes the serving folder above it, which "
            "holds one folder per version (<N>/saved_model.pb), as TF Serving does"
        )
    exists = storage.has_content(source) if storage.is_gcs(source) else Path(source).is_dir()
    if not exists:
        raise UserError(
            f"no serving folder at {source}: pass --model, the folder push publishes to (such "
            "as runs/serving/gpt after `gptpipe run --local`, or gs://BUCKET/serving/gpt)"
        )


def _log_to_stderr() -> None:
    """The server's log lines (versions loaded, switched, failed; internal errors) on stderr."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gptpipe serve: %(message)s"))
    logger = logging.getLogger("server")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
