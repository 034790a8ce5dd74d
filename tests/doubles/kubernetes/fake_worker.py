"""A stand-in for `python -m trainer.task` in fast tests of the operator double: starts in
milliseconds, records what it was started with, and behaves as its mode says.

    python fake_worker.py MODE RECORDS_DIR

Every start appends a JSON line to RECORDS_DIR/starts-<index>.jsonl (pid, cwd, its files,
TF_CONFIG, HOSTNAME, GPTPIPE_EXTRA) and prints "worker <index> started". Modes:
- ok: exit 0; worker 0 only once every other worker has started and exited (its process gone),
  so that the others are Succeeded before the job is.
- hang: sleep until killed (SIGTERM exits 143, as the trainer does after its backup).
- stubborn: sleep and ignore SIGTERM (only SIGKILL stops it).
- exit-<code>: worker 1 prints an error and exits <code>; the others hang.
- flaky: worker 1 exits 137 in its first two incarnations (each once the wall clock's second
  has turned since it started, so the operator's Restarting conditions get distinct
  timestamps) and 0 at once in the third; worker 0 exits 0 once that third has exited and
  RECORDS_DIR/hold does not exist.
- lose-peer: like MultiWorkerMirrored losing a worker. Worker 1 SIGKILLs itself in its first
  incarnation, once every worker has started and RECORDS_DIR/hold does not exist (a test
  holds it until the launcher has seen the pods); a worker whose peer died (the peer started
  again) exits 143; a group whose members all started equally often runs to exit 0.
- fail-until-<file>: every worker exits 2 while RECORDS_DIR/<file> does not exist (as the
  trainer does without its examples, naming them in its termination message); then ok.
- serve: listen on the worker's own address in TF_CONFIG and answer each connection with
  "worker <index>"; ignore SIGTERM (only SIGKILL stops it), so that a pod being deleted still
  answers.
- eat-<MiB>: every worker holds <MiB> MiB of memory it has written, then hangs (SIGTERM exits
  143).
- wrote-<what>: worker 1 writes its termination-message file (the path in
  GPTPIPE_TERMINATION_MESSAGE, as the trainer does) and exits 2; the others hang. <what> is
  `record` (the trainer's input-error record), `long` (its record of a 10 000-character
  message, which `encode` shortens to fit what the kubelet keeps), `overlong` (the record after
  5000 bytes of text: the kubelet keeps only the file's end), `text` (a line of text, no
  record) or `nothing`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, for contracts/
from contracts import termination  # noqa: E402 -- the trainer's own wire format

BAD_SHARD = "shard train-00001 is not a GZIP TFRecord file: delete the folder and run again"


def tell_launcher(what: str) -> None:
    """Write the termination-message file as `what` says (module docstring)."""

    def record(message: str) -> bytes:
        return termination.encode(termination.TerminationMessage(termination.INPUT_ERROR, message))

    data = {
        "record": record(BAD_SHARD),
        "long": record(BAD_SHARD + " " + "y" * 10_000),
        "overlong": b"x" * 5000 + record(BAD_SHARD),
        "text": b"out of cheese\n",
    }
    if what in data:
        Path(os.environ[termination.WORKER_MESSAGE_ENV]).write_bytes(data[what])


def serve(address: str, answer: bytes) -> None:
    """Answer every connection to `address` ("host:port") with `answer`, forever."""
    host, port = address.rsplit(":", 1)
    with socket.create_server((host, int(port))) as server:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(answer)


def starts(records: Path, index: int) -> int:
    path = records / f"starts-{index}.jsonl"
    return path.read_text().count("\n") if path.exists() else 0  # whole lines only


def gone(records: Path, index: int, incarnation: int) -> bool:
    """Whether worker `index` has started `incarnation` times and that process has exited
    (reaped by the kubelet, or a zombie: /proc's state Z)."""
    path = records / f"starts-{index}.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []  # whole lines only
    if len(lines) < incarnation:
        return False
    pid = json.loads(lines[incarnation - 1])["pid"]
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def next_second() -> None:
    """Return once the wall clock's whole second has turned (RFC 3339 stamps differ)."""
    second = int(time.time())
    while int(time.time()) == second:
        time.sleep(0.02)


def main() -> int:
    mode, records = sys.argv[1], Path(sys.argv[2])
    tf_config = os.environ.get("TF_CONFIG")
    spec = json.loads(tf_config) if tf_config else {}
    index = spec.get("task", {}).get("index", 0)
    workers = len(spec.get("cluster", {}).get("worker", [])) or 1
    record = {
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "files": sorted(os.listdir(".")),
        "tf_config": tf_config,
        "hostname": os.environ.get("HOSTNAME"),
        "extra": os.environ.get("GPTPIPE_EXTRA"),
    }
    with open(records / f"starts-{index}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    incarnation = starts(records, index)
    print(f"worker {index} started", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if mode == "ok":
        while index == 0 and not all(gone(records, i, 1) for i in range(1, workers)):
            time.sleep(0.05)  # the chief finishes only after every worker, as under MWMS
        return 0
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "serve":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        serve(spec["cluster"]["worker"][index], f"worker {index}\n".encode())
    if mode.startswith("eat-"):
        held = b"x" * (int(mode.removeprefix("eat-")) << 20)  # written, so resident
        print(f"holding {len(held) >> 20} MiB", flush=True)
    if mode.startswith("exit-") and index == 1:
        print("ValueError: bad shard", flush=True)
        return int(mode.removeprefix("exit-"))
    if mode == "flaky":
        if index == 1:
            if incarnation < 3:
                next_second()
            return 137 if incarnation < 3 else 0
        # Worker 1 has Succeeded, and the operator must leave it be while this one runs on
        # (as long as RECORDS_DIR/hold exists: a test holds it for the operator's passes).
        while not gone(records, 1, 3) or (records / "hold").exists():
            time.sleep(0.05)
        return 0
    if mode == "lose-peer":
        if index == 1 and incarnation == 1:
            # A peer lost in the group's run, not before it began.
            held = records / "hold"
            while not all(starts(records, i) for i in range(workers)) or held.exists():
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in range(400):
            counts = [starts(records, i) for i in range(workers)]
            if any(c > incarnation for c in counts):
                print("lost a peer worker; exiting 143", flush=True)
                return 143
            if all(c == incarnation for c in counts) and incarnation > 1:
                return 0
            time.sleep(0.05)
        return 3
    if mode.startswith("fail-until-"):
        if not (records / mode.removeprefix("fail-until-")).exists():
            print("error: examples not found", flush=True)
            record = termination.TerminationMessage(termination.INPUT_ERROR, "examples not found")
            termination.write(os.environ[termination.WORKER_MESSAGE_ENV], record)
            return 2
        return 0
    if mode.startswith("wrote-") and index == 1:
        print(f"error: {BAD_SHARD}", flush=True)  # a line that no longer means anything
        tell_launcher(mode.removeprefix("wrote-"))
        return 2
    while True:  # hang, stubborn, and the other workers of exit-<code>
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
