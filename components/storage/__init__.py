"""The storage layer: the only code that moves bytes for the pipeline steps.

Every public function takes a local path or a `gs://bucket/key` URI. Steps use this package's
names (`from components import storage; storage.join(...)`), never its submodules:

- `uris`: addresses and fingerprints: `is_gcs` (which refuses other schemes, such as KFP's
  default `minio://`), `check_shared_root`, `join`, `split_gcs`, `has_wildcard`, `FileInfo`,
  `sha256_file`, `crc32c_file`;
- `files`: what works on either kind of address: listing (`list_files`, `list_tree`,
  `has_content`, `check_folder`, `folders_holding`, `tree_crc32c`, `same_files`), reading
  (`open_read`, `read_bytes`, both checked against a listing), writing, copying and deleting
  (`write_bytes`, `write_text_atomic`, `copy`, `upload_dir`, `download_dir`, `delete_file`,
  `delete_tree`, `local_copy`), and writes that race safely (`create_exclusive`,
  `update_bytes`);
- `local`: how those work on local disk (writes through a temporary sibling and a rename),
  and `glob_root`, a local glob's fixed folder;
- `gcs`: how they work on GCS: the client (`client`, `set_client`), retries, resumable
  uploads, errors a user causes as `UserError` (a missing object as its `ObjectNotFound`),
  the crc32c-checked streamed reader, single-object `upload_file` and `download_file`,
  generation preconditions;
- `lease`: `hold_or_wait`, so one of several concurrent callers does a piece of work (a dataset
  version's tokenize) while the others wait for it, with a heartbeat to notice a dead holder;
  `this_process` and `holder_gone`, which tell a dead holder on this machine at once (serving's
  version claims use them too), and `process_gone`, the same for any process so recorded (a
  local run's steps watch the run with it);
- `publish`: folders that appear whole: `atomic_dir`, `publish_dir`, and on gs:// the staging
  protocol with `staging_uri`, `names_taken` and `finish_publishes`.

Settings (`gcs.retry()`, `gcs.WORKERS`, the chunk sizes, `publish.STAGING_PREFIX`) are not
re-exported: a test that replaces one, or a helper such as `gcs.copy_object`, patches it in the
submodule that reads it.

The trainer, inside TFJob workers, reads and writes `gs://` through TensorFlow's own file
system (`tf.io.gfile`, `tf.data`), never through this package. TF Serving's version folders
are `components.serving`, built on this package.
"""

from components.storage.files import (
    check_folder,
    copy,
    create_exclusive,
    delete_file,
    delete_folder_markers,
    delete_tree,
    download_dir,
    folders_holding,
    has_content,
    list_files,
    list_tree,
    local_copy,
    open_read,
    read_bytes,
    same_files,
    tree_crc32c,
    update_bytes,
    upload_dir,
    write_bytes,
    write_text_atomic,
)
from components.storage.gcs import (
    ObjectNotFound,
    client,
    download_file,
    set_client,
    upload_file,
)
from components.storage.lease import hold_or_wait, holder_gone, process_gone, this_process
from components.storage.local import glob_root
from components.storage.publish import (
    atomic_dir,
    finish_publishes,
    names_taken,
    publish_dir,
    staging_uri,
)
from components.storage.uris import (
    FileInfo,
    ObjectChangedError,
    check_shared_root,
    crc32c_file,
    has_wildcard,
    is_gcs,
    join,
    sha256_file,
    split_gcs,
)

__all__ = [
    "FileInfo",
    "ObjectChangedError",
    "ObjectNotFound",
    "atomic_dir",
    "check_folder",
    "check_shared_root",
    "client",
    "copy",
    "crc32c_file",
    "create_exclusive",
    "delete_file",
    "delete_folder_markers",
    "delete_tree",
    "download_dir",
    "download_file",
    "finish_publishes",
    "folders_holding",
    "glob_root",
    "has_content",
    "has_wildcard",
    "hold_or_wait",
    "holder_gone",
    "is_gcs",
    "join",
    "list_files",
    "list_tree",
    "local_copy",
    "names_taken",
    "open_read",
    "process_gone",
    "publish_dir",
    "read_bytes",
    "same_files",
    "set_client",
    "sha256_file",
    "split_gcs",
    "staging_uri",
    "this_process",
    "tree_crc32c",
    "update_bytes",
    "upload_dir",
    "upload_file",
    "write_bytes",
    "write_text_atomic",
]
