"""Whether a stored dataset may be reused, and how a damaged one gives way to a new tokenize.

A dataset is content-addressed: every run on the same data names the same folder, and finds it
complete by its manifest. A shard deleted or cut afterwards (a cleaner, a full disk while it
was copied, a hand) would then be reused by every later run, and the trainer, which reads every
shard in full before its first step, would refuse it every time. So before a reuse, each file
the manifest names is looked up in one listing of the folder: every shard must be there, of
the size the manifest records, and on gs:// of the crc32c it records (GCS lists both, with no
download). On local disk only sizes are compared: a checksum would read every byte of every
shard at every reuse; the trainer's own check covers the rest. A manifest written before sizes
were recorded is checked for the files' presence.

A damaged dataset is discarded, its manifest first, so that no reader takes it as complete
meanwhile, and the caller tokenizes it again as a first time, under the version's lease.
"""

from __future__ import annotations

from components import storage
from contracts.artifacts import EVAL_TEXT
from contracts.errors import UserError
from contracts.examples import ExamplesManifest, parse_manifest


def damage(uri: str, manifest_uri: str) -> str | None:
    """What is wrong with the dataset at `uri` whose manifest is `manifest_uri`, in a few words
    naming the file; None if it is whole as far as the store tells without reading it."""
    try:
        manifest = parse_manifest(storage.read_bytes(manifest_uri), manifest_uri)
    except UserError as err:
        return f"its manifest cannot be read ({err})"
    return _files_damage(uri, manifest)


def _files_damage(uri: str, manifest: ExamplesManifest) -> str | None:
    files = storage.list_tree(uri)
    for name in (manifest.tokenizer.file, EVAL_TEXT):
        if name not in files:
            return f"{name} is missing"
    for stats in manifest.splits.values():
        for index, name in enumerate(stats.shards):
            found = files.get(name)
            if found is None:
                return f"shard {name} is missing"
            if stats.shard_bytes and found.size != stats.shard_bytes[index]:
                return (
                    f"shard {name} is {found.size} bytes, not the {stats.shard_bytes[index]} "
                    "its manifest records"
                )
            if stats.shard_crc32c and found.crc32c and found.crc32c != stats.shard_crc32c[index]:
                return (
                    f"shard {name} has crc32c {found.crc32c}, not the "
                    f"{stats.shard_crc32c[index]} its manifest records"
                )
    return None


def discard(uri: str, manifest_uri: str) -> None:
    """Remove the damaged dataset at `uri`: its manifest first, so that it is never seen
    complete again, then the rest."""
    storage.delete_file(manifest_uri)
    storage.delete_tree(uri)
