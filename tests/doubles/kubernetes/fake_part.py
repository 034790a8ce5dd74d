"""A stand-in for one part of an indexed job (`python -m components.tokenize.parts ...`) in
fast tests of the Job controller double and the indexed launchers: starts in milliseconds,
records its start, and behaves as its mode says.

    python fake_part.py MODE RECORDS_DIR

It reads its index from JOB_COMPLETION_INDEX, appends a JSON line to
RECORDS_DIR/starts-<index>.jsonl (pid, hostname, its env's GPTPIPE_EXTRA, how many parts were
running as it started) and prints "part <index> started". Modes:
- ok: exit 0 (after 0.1 s, so that parts overlap).
- flaky-<i>: index <i> is SIGKILLed (exit 137) in its first run, and exits 0 in the next.
- fail-<i>: index <i> exits 1 every time; the others exit 0.
- bad-<i>: once FAKE_PARTS parts (its env; 1 if unset) have started, index <i> writes an
  input-error record (BAD_INPUT) to its termination-message file and exits 2; the others hang
  until stopped.
- hang: sleep until SIGTERM, then exit 143.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, for contracts/
from contracts import termination  # noqa: E402 -- the parts' own wire format

BAD_INPUT = "corpus shard 3 is not UTF-8 text: fix or remove gs://b/corpus/3.jsonl"


def main() -> int:
    mode, records = sys.argv[1], Path(sys.argv[2])
    index = int(os.environ["JOB_COMPLETION_INDEX"])
    running = records / "running"
    running.mkdir(exist_ok=True)
    mine = running / f"{index}-{os.getpid()}"
    mine.touch()
    path = records / f"starts-{index}.jsonl"
    runs = len(path.read_text().splitlines()) if path.exists() else 0
    record = {
        "pid": os.getpid(),
        "hostname": os.environ.get("HOSTNAME"),
        "extra": os.environ.get("GPTPIPE_EXTRA"),
        "running": len(list(running.iterdir())),
    }
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"part {index} started", flush=True)

    def stop(*_: object) -> None:
        mine.unlink(missing_ok=True)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    kind, _, which = mode.partition("-")
    mine_to_act = which != "" and int(which) == index
    try:
        if kind == "flaky" and mine_to_act and runs == 0:
            mine.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "fail" and mine_to_act:
            print("error: part failed", flush=True)
            return 1
        if kind == "bad" and mine_to_act:
            while len(list(records.glob("starts-*.jsonl"))) < int(os.environ.get("FAKE_PARTS", 1)):
                time.sleep(0.02)
            print(f"error: {BAD_INPUT}", flush=True)
            message = termination.TerminationMessage(termination.INPUT_ERROR, BAD_INPUT)
            termination.write(os.environ[termination.WORKER_MESSAGE_ENV], message)
            return termination.INPUT_ERROR_EXIT
        if kind in ("hang", "bad"):
            while True:
                time.sleep(0.1)
        time.sleep(0.1)
        return 0
    finally:
        mine.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
