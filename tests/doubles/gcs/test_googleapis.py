"""googleapis.py: TensorFlow's own gs:// file system reaches the emulator through GCS's hosts,
and the emulator's gaps the relay covers are still there (an emulator that closes one fails
here, and the relay's workaround can go)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
from urllib.parse import urlparse

import pytest

from tests.doubles.gcs.googleapis import HOSTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
# Folders, a write, a read, a listing and a folder rename, with TensorFlow's gs:// in a process
# of its own; prints what it read back.
TF_SCRIPT = """
import json, sys
import tensorflow as tf
root = sys.argv[1]
tf.io.gfile.makedirs(root + "/a/b")
with tf.io.gfile.GFile(root + "/a/b/x.txt", "w") as f:
    f.write("hello")
read = tf.io.gfile.GFile(root + "/a/b/x.txt").read()
listed = tf.io.gfile.listdir(root + "/a")
tf.io.gfile.rename(root + "/a", root + "/c")
print(json.dumps({"read": read, "listed": listed, "isdir": tf.io.gfile.isdir(root + "/c/b")}))
"""


@pytest.mark.slow
def test_tensorflow_reads_and_writes_the_emulator_through_gcs_own_hosts(gcs, googleapis):
    env = {**os.environ, **googleapis.env, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", TF_SCRIPT, gcs.uri()],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said == {"read": "hello", "listed": ["b/"], "isdir": True}
    # makedirs left an empty marker per folder it created; the rename moved them with the file.
    assert gcs.names() == ["c/", "c/b/", "c/b/x.txt"]
    assert gcs.get("c/b/x.txt") == b"hello"  # the chunked upload, decoded
    # Listed objects download from their own links (as KFP's launcher double fetches them).
    listed = gcs.client.list_blobs(gcs.bucket.name, prefix="c/b/x")
    assert [blob.download_as_bytes() for blob in listed] == [b"hello"]
    assert gcs.bucket.get_blob("c/b/").size == 0
    # A folder rename is a copy and a delete per object (gcs_file_system.cc, RenameFile).
    moves = [path for method, path in googleapis.log if "/rewriteTo/" in path]
    deletes = [path for method, path in googleapis.log if method == "DELETE"]
    assert len(moves) == len(deletes) == 3


def test_only_gcs_hosts_are_tunnelled(googleapis):
    url = urlparse(googleapis.proxy_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
        conn.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        assert conn.recv(64).startswith(b"HTTP/1.0 403")
    assert "www.googleapis.com" in HOSTS and "storage.googleapis.com" in HOSTS


def _emulator(gcs) -> http.client.HTTPConnection:
    url = urlparse(gcs.endpoint)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=30)


def test_the_emulator_still_fails_an_empty_media_upload(gcs):
    """What TensorFlow's CreateDir sends; the relay sends it as a multipart upload instead."""
    conn = _emulator(gcs)
    path = f"/upload/storage/v1/b/{gcs.bucket.name}/o?uploadType=media&name=d%2F"
    conn.request("POST", path, headers={"Content-Length": "0"})
    with pytest.raises(http.client.RemoteDisconnected):
        conn.getresponse()
    assert gcs.names() == []


def test_the_emulator_still_reads_a_chunked_body_by_its_content_length(gcs):
    """TensorFlow's uploads carry both headers; the relay decodes the chunks first."""
    conn = _emulator(gcs)
    headers = {"Content-Length": "5", "Transfer-Encoding": "chunked"}
    conn.request("PUT", f"/{gcs.bucket.name}/x", body=b"5\r\nhello\r\n0\r\n\r\n", headers=headers)
    conn.getresponse().read()
    assert gcs.get("x") == b"5\r\nhe"
