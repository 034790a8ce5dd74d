"""The Examples artifact's manifest (`manifest.json`) as one typed record, TensorFlow-free.

Tokenize writes it last into every Examples folder; the train step, the trainer and the tools
read it with `parse_manifest`, once, and use its attributes. It round-trips JSON strictly
(contracts/records.py): a wrong type or an unknown key is one line naming the field. A manifest
of another `FORMAT_VERSION`, or one that lacks what today's writer always writes, is refused in
one line naming the file: its shards follow other rules, and tokenizing again is the fix.
docs/design.md shows the document whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from contracts import records
from contracts.errors import UserError

# Bump when the artifact layout or any encoding rule changes. 2: streamed (chunks of whole
# lines in bytes, the tokenizer trained on a bounded sample, the split counted in bytes).
# 3: documents (JSONL, Parquet, compressed files), EOS after each, split by document hash,
# parts that pack their own units, the eval text as documents (raw/eval.jsonl).
# 4: a document that starts with "\n" after one that ended gets its newline after that one's
# EOS (3 put it before).
FORMAT_VERSION = 4


@dataclass(frozen=True)
class LocalSource:
    """A corpus file on local disk, as tokenize read it."""

    uri: str  # its absolute path
    size: int  # bytes
    sha256: str  # hex digest of its bytes


@dataclass(frozen=True)
class GcsSource:
    """A corpus object on GCS, with the fingerprints its listing gave (nothing downloaded)."""

    uri: str  # gs://bucket/key
    size: int  # bytes
    crc32c: str  # base64 big-endian CRC32C, as GCS reports it
    md5: str  # base64 MD5; "" for a composite object
    generation: int | None  # the object's generation when it was read


Source = LocalSource | GcsSource


@dataclass(frozen=True)
class SplitStats:
    """One split's shards and counts."""

    shards: tuple[str, ...]  # shard paths relative to the Examples folder, in order
    windows: int  # windows written (seq_len + 1 tokens each); each unit's last tail is dropped
    tokens: int  # tokens of the whole split, EOS ids included
    chars: int  # characters of the whole split
    # Windows in each shard, in order (each unit's last shard of a split is partly filled);
    # () in a hand-made manifest: every shard full but the last.
    shard_windows: tuple[int, ...] = ()
    # Bytes of each shard, in order, which a reuse of the dataset checks; () in manifests
    # written before they were recorded (and in a part's own record)
    shard_bytes: tuple[int, ...] = ()
    # CRC32C of each shard as GCS reports it (base64), in order, when the shards were written
    # to gs://, whose listing gives it free; () on local disk, where it would cost a read
    shard_crc32c: tuple[str, ...] = ()


@dataclass(frozen=True)
class TokenizerRecord:
    """The SentencePiece model the shards were encoded with."""

    file: str  # its path relative to the Examples folder (contracts.artifacts.TOKENIZER_FILE)
    sha256: str  # of the model file's bytes
    vocab_size: int  # pieces in its vocabulary
    trained: bool  # True: trained on this corpus's train split; False: given


@dataclass(frozen=True)
class DatasetParameters:
    """Every value that changes the output bytes; the dataset version hashes them.

    `chunk_bytes` places the chunks the tokenizer's sample is taken from (the ids do not depend
    on it); neither it nor the sample's size matters with a given tokenizer, but both are kept
    so that the parameters always have the same keys.
    """

    format_version: int  # FORMAT_VERSION of the writer
    split_method: str  # the train/eval split rule (components/tokenize/plan.py)
    vocab_size: int  # tokenizer pieces
    seq_len: int  # tokens a window predicts (each holds seq_len + 1)
    eval_fraction: float  # the share of documents (or of a single file's tail) that is eval
    eval_max_bytes: int  # the eval split's cap in bytes of text; 0: none
    text_field: str  # the JSONL field or Parquet column read as a document's text
    unit_bytes: int  # listed bytes per unit of sources (windows never cross a unit's end)
    shard_windows: int  # windows in every shard but a split's last
    chunk_bytes: int  # the size of the chunks of whole lines the corpus is read in
    tokenizer_sample_bytes: int  # at most this much train text trains the tokenizer
    sentencepiece_version: str  # the library that trained and encoded
    tokenizer_options: dict[str, Any] | None  # the trainer's options; None with a given model
    given_tokenizer_sha256: str | None  # the given model's sha256; None when one was trained


@dataclass(frozen=True)
class ExamplesManifest:
    """What an Examples folder holds: its version, its splits, tokenizer and sources."""

    dataset_version: str  # sha256 over the sources' fingerprints and `parameters`
    seq_len: int  # as in `parameters`, where readers look first
    vocab_size: int  # as in `parameters`
    eval_fraction: float  # as in `parameters`
    splits: dict[str, SplitStats]  # by split name (contracts.artifacts.SPLITS)
    tokenizer: TokenizerRecord
    sources: tuple[Source, ...]  # each file or object read, in the order it was read
    parameters: DatasetParameters
    documents: dict[str, int]  # documents by split (a single file's tail split: 1 in each)
    empty_documents: int  # documents with no text, skipped
    formats: dict[str, int]  # source files by format (components/tokenize/readers.py)

    def total(self, count: str) -> int:
        """`windows` or `tokens` summed over the splits."""
        return sum(getattr(stats, count) for stats in self.splits.values())


@dataclass(frozen=True)
class ExamplesReference:
    """The run's own Examples artifact (`contracts.artifacts.EXAMPLES_REF`): where the
    content-addressed Examples are, since KFP keeps a task's output inside the run's folder."""

    uri: str  # the Examples folder under `<artifact_root>/datasets/`
    dataset_version: str  # its version, as its manifest says
    manifest: ExamplesManifest  # its manifest, with `sources` as this run listed them


def parse_sources(data: object, what: str) -> tuple[Source, ...]:
    """A manifest's `sources` read back from elsewhere (the Examples artifact's `sources`
    property in lineage, parsed from its JSON); `what` names it in errors."""
    sources: tuple[Source, ...] = records.from_value(tuple[Source, ...], data, what)
    return sources


def manifest_json(manifest: ExamplesManifest | ExamplesReference) -> str:
    """The text of the file, as tokenize writes it: indented, keys in the class's order."""
    return json.dumps(records.to_dict(manifest), indent=2) + "\n"


def parse_manifest(text: str | bytes, where: str) -> ExamplesManifest:
    """Parse the manifest at `where` (a path, for messages); one UserError naming the file and
    saying to tokenize again for another format, a missing key or a value of the wrong type."""
    redo = "tokenize the corpus again to write Examples this gptpipe reads"
    try:
        data = json.loads(text)
    except ValueError as err:
        raise UserError(f"examples: {where} is not valid JSON ({err}); {redo}") from None
    parameters = data.get("parameters") if isinstance(data, dict) else None
    found = parameters.get("format_version") if isinstance(parameters, dict) else None
    if found != FORMAT_VERSION:
        if isinstance(found, int) and found > FORMAT_VERSION:
            redo = f"read it with the gptpipe that wrote it, or {redo}"
        raise UserError(
            f"examples: {where} is of format_version {json.dumps(found)}, this gptpipe reads "
            f"{FORMAT_VERSION}; {redo}"
        )
    try:
        return records.from_dict(ExamplesManifest, data, "manifest")
    except UserError as err:
        raise UserError(f"examples: {where}: {err}; {redo}") from None
