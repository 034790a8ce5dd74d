"""A stored dataset is reused only whole: one a shard went missing from, or was cut or changed
in, is said to be damaged and tokenized again, atomically (components/tokenize/reuse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.tokenize import executor as tokenize
from contracts.artifacts import EXAMPLES_MANIFEST
from contracts.examples import parse_manifest
from tests.tiny import SEQ_LEN, VOCAB_SIZE, tiny_corpus
from trainer import data, shard_check

OPTIONS = {"vocab_size": VOCAB_SIZE, "seq_len": SEQ_LEN, "progress": False, "shard_windows": 256}


@pytest.fixture
def stored(tmp_path) -> tokenize.Dataset:
    """The tiny corpus tokenized into a content-addressed store: 4 train shards, 1 eval."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(tiny_corpus(), encoding="utf-8")
    found = tokenize.run_content_addressed(str(corpus), str(tmp_path / "datasets"), **OPTIONS)
    assert len(found.manifest.splits["train"].shards) == 4
    return found


def _again(tmp_path: Path) -> tokenize.Dataset:
    return tokenize.run_content_addressed(
        str(tmp_path / "corpus.txt"), str(tmp_path / "datasets"), **OPTIONS
    )


def _trainable(dataset: tokenize.Dataset) -> None:
    """What the trainer checks before its first step: every shard whole, as many windows."""
    for split in ("train", "eval"):
        shards = data.split_shards(dataset.uri, dataset.manifest, split)
        shard_check.verify_shards(dataset.uri, shards.files, windows=shards.windows)


def test_the_manifest_records_each_shards_size_and_locally_no_checksum(stored):
    for stats in stored.manifest.splits.values():
        sizes = [(Path(stored.uri) / name).stat().st_size for name in stats.shards]
        assert list(stats.shard_bytes) == sizes and stats.shard_crc32c == ()


def test_a_whole_dataset_is_reused_without_a_word(stored, tmp_path, capsys):
    again = _again(tmp_path)
    assert (again.reused, again.damage) == (True, "")
    assert "damaged" not in capsys.readouterr().err


def _delete(shard: Path) -> None:
    shard.unlink()


def _cut(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _grow(shard: Path) -> None:
    with shard.open("ab") as f:
        f.write(b"\0" * 16)


@pytest.mark.fault("a shard of a stored dataset deleted, cut or grown before a rerun")
@pytest.mark.parametrize(
    ("damage", "said"),
    [(_delete, "is missing"), (_cut, "bytes, not the"), (_grow, "bytes, not the")],
    ids=["deleted", "cut", "grown"],
)
def test_a_damaged_dataset_is_said_and_tokenized_again_whole(
    stored, tmp_path, capsys, damage, said
):
    """It is said to be damaged, tokenized again to the same manifest, and trains."""
    shard = stored.manifest.splits["train"].shards[2]
    damage(Path(stored.uri) / shard)
    capsys.readouterr()
    again = _again(tmp_path)
    assert (again.uri, again.reused) == (stored.uri, False)
    assert again.damage.startswith(f"shard {shard} is ") and said in again.damage, again.damage
    version = stored.manifest.dataset_version
    assert capsys.readouterr().err == (
        f"tokenize: dataset {version[:12]} is damaged ({again.damage}): tokenizing it again\n"
    )
    _trainable(again)
    written = parse_manifest((Path(again.uri) / EXAMPLES_MANIFEST).read_text(), "manifest")
    assert written.splits == stored.manifest.splits  # the same bytes as the first time
    assert _again(tmp_path).reused  # and the next run reuses it


def test_a_manifest_from_before_the_sizes_still_finds_a_missing_shard(stored, tmp_path):
    manifest = Path(stored.uri) / EXAMPLES_MANIFEST
    data_ = json.loads(manifest.read_text())
    for stats in data_["splits"].values():
        del stats["shard_bytes"], stats["shard_crc32c"]
    manifest.write_text(json.dumps(data_))
    shard = stored.manifest.splits["eval"].shards[0]
    (Path(stored.uri) / shard).unlink()
    again = _again(tmp_path)
    assert not again.reused and again.damage == f"shard {shard} is missing"
    _trainable(again)


def test_an_unreadable_manifest_is_damage_too(stored, tmp_path):
    (Path(stored.uri) / EXAMPLES_MANIFEST).write_text('{"dataset_version": ')  # cut
    again = _again(tmp_path)
    assert not again.reused and again.damage.startswith("its manifest cannot be read")
    _trainable(again)


@pytest.mark.fault("a shard of a stored gs:// dataset rewritten with other bytes of its size")
def test_a_gcs_shard_of_another_crc32c_is_tokenized_again(gcs, tmp_path, capsys):
    """Its crc32c, listed by GCS, tells it apart: it is tokenized again, then reused."""
    gcs.put("corpus/tiny.txt", tiny_corpus().encode("utf-8"))
    corpus, root = gcs.uri("corpus/tiny.txt"), gcs.uri("datasets")
    first = tokenize.run_content_addressed(corpus, root, **OPTIONS)
    stats = first.manifest.splits["train"]
    assert len(stats.shard_crc32c) == len(stats.shards) == len(stats.shard_bytes)
    key = f"datasets/{first.manifest.dataset_version}/{stats.shards[1]}"
    original = gcs.get(key)
    flipped = bytes(b ^ 0xFF for b in original[:64]) + original[64:]  # same size
    gcs.put(key, flipped)
    again = tokenize.run_content_addressed(corpus, root, **OPTIONS)
    assert not again.reused
    assert again.damage.startswith(f"shard {stats.shards[1]} has crc32c "), again.damage
    assert "tokenizing it again" in capsys.readouterr().err
    assert gcs.get(key) == original
    assert tokenize.run_content_addressed(corpus, root, **OPTIONS).reused
