"""trainer.data: the in-order reader, the manifest's shards, and the training order (TrainOrder),
whose place after any number of steps is found without reading what came before."""

import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from contracts.errors import UserError
from contracts.examples import SplitStats, manifest_json
from tests.tiny import examples_manifest
from trainer import data, shard_check
from trainer.config import resolve_config


def _write_windows(path, windows, compression="GZIP"):
    """`windows` as tf.train.Examples of `input_ids`, one TFRecord each, as tokenize writes."""
    with tf.io.TFRecordWriter(str(path), options=compression) as w:
        for window in windows:
            feature = tf.train.Feature(int64_list=tf.train.Int64List(value=window))
            ex = tf.train.Example(features=tf.train.Features(feature={"input_ids": feature}))
            w.write(ex.SerializeToString())


def test_make_dataset_shapes_and_shift(tmp_path):
    seq_len = 8
    windows = [list(range(i, i + seq_len + 1)) for i in range(10)]
    _write_windows(tmp_path / "a.gz", windows[:5])
    _write_windows(tmp_path / "b.gz", windows[5:])
    ds = data.make_dataset(str(tmp_path / "*.gz"), seq_len, batch_size=3)
    batches = list(ds)
    assert len(batches) == 3  # 10 windows, drop_remainder
    x, y = batches[0]
    assert x.shape == (3, seq_len) and y.shape == (3, seq_len) and x.dtype == tf.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("n_files", [1, 4])
def test_make_dataset_shards_per_worker(tmp_path, n_files):
    seq_len = 4
    windows = [[i] * (seq_len + 1) for i in range(8)]
    files = [str(tmp_path / f"{i}.gz") for i in range(n_files)]
    for i, f in enumerate(files):
        _write_windows(f, windows[i::n_files])
    seen = []
    for worker in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker)
        ds = data.make_dataset(files, seq_len, 1, input_context=ctx)
        seen.append({int(x[0, 0]) for x, _ in ds})
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(range(8))


def test_a_restart_reads_only_the_shards_that_changed_since_they_were_checked(
    tmp_path, monkeypatch
):
    files = [str(tmp_path / f"{i}.gz") for i in range(3)]
    for i, f in enumerate(files):
        _write_windows(f, [[i] * 5] * 50)
    record = str(tmp_path / "work" / "checked-shards" / "train-0-of-1.json")
    read = []
    whole = shard_check._shard_problem
    monkeypatch.setattr(shard_check, "_shard_problem", lambda p, n: read.append(p) or whole(p, n))
    shard_check.verify_shards(str(tmp_path), files, record)
    assert sorted(read) == files
    read.clear()
    shard_check.verify_shards(str(tmp_path), files, record)  # the restart: nothing changed
    assert read == []
    damaged = Path(files[1]).read_bytes()[:-9]  # cut inside its GZIP trailer
    Path(files[1]).write_bytes(damaged)
    with pytest.raises(shard_check.CorruptShardError, match=f"corrupt TFRecord shard {files[1]}"):
        shard_check.verify_shards(str(tmp_path), files, record)
    assert read == [files[1]]
    read.clear()
    with pytest.raises(
        shard_check.CorruptShardError
    ):  # still refused: only whole shards are recorded
        shard_check.verify_shards(str(tmp_path), files, record)
    assert read == [files[1]]
    read.clear()
    Path(record).write_text("{not json")  # an unreadable record: every shard is read again
    with pytest.raises(shard_check.CorruptShardError):
        shard_check.verify_shards(str(tmp_path), files, record)
    assert files[0] in read and files[1] in read
    read.clear()
    with pytest.raises(
        shard_check.CorruptShardError
    ):  # without a record, every start reads them all
        shard_check.verify_shards(str(tmp_path), files)
    assert files[0] in read


def test_a_record_that_cannot_be_written_costs_only_the_next_start_a_full_read(tmp_path, caplog):
    _write_windows(tmp_path / "a.gz", [[1] * 5] * 10)
    (tmp_path / "work").write_text("a file where the work folder should be")
    record = str(tmp_path / "work" / "checked-shards" / "train-0-of-1.json")
    shard_check.verify_shards(
        str(tmp_path), [str(tmp_path / "a.gz")], record
    )  # checked; not raised
    assert "shards checked, but not recorded" in caplog.text


def _raw_records(path, windows):
    """The TFRecord bytes of `windows`, uncompressed."""
    _write_windows(path, windows, compression="")
    return Path(path).read_bytes()


def test_a_shard_holding_other_than_the_manifests_windows_is_refused(tmp_path):
    _write_windows(tmp_path / "a.gz", [[1, 2, 3]] * 3)
    record = str(tmp_path / "checked.json")
    shard_check.verify_shards(str(tmp_path), [str(tmp_path / "a.gz")], record, windows=[3])
    with pytest.raises(shard_check.CorruptShardError, match="holds 3 windows .* give it 4"):
        shard_check.verify_shards(str(tmp_path), [str(tmp_path / "a.gz")], windows=[4])
    # The record keeps the count a shard was checked for: another count is checked again.
    with pytest.raises(shard_check.CorruptShardError, match="holds 3 windows .* give it 4"):
        shard_check.verify_shards(str(tmp_path), [str(tmp_path / "a.gz")], record, windows=[4])


def test_whole_gzip_data_that_ends_inside_a_tfrecord_is_refused(tmp_path):
    raw = _raw_records(tmp_path / "raw", [[1, 2, 3]] * 2)
    one = len(raw) // 2
    for cut, inside in ((len(raw) - 7, 2), (one + 5, 2), (one - 3, 1)):  # data, header, data
        (tmp_path / "cut.gz").write_bytes(gzip.compress(raw[:cut]))  # a GZIP stream, whole
        with pytest.raises(shard_check.CorruptShardError, match=f"inside TFRecord {inside};"):
            shard_check.verify_shards(str(tmp_path), [str(tmp_path / "cut.gz")])


def test_records_are_counted_whatever_pieces_the_stream_comes_in(tmp_path):
    raw = _raw_records(tmp_path / "raw", [[k] * (k + 1) for k in range(5)])
    for size in (1, 5, 12, 13, len(raw)):
        counter = shard_check._RecordCounter()
        for at in range(0, len(raw), size):
            counter.feed(raw[at : at + size])
        assert (counter.count, counter.whole()) == (5, True), size
    counter.feed(raw[:13])
    assert not counter.whole()


def _manifest(tmp_path, shards, windows, shard_windows=1):
    splits = {
        "train": SplitStats(tuple(shards), windows, windows * 2 + 1, 0),
        "eval": SplitStats(("Split-eval/data_tfrecord-00000-of-00001.gz",), 1, 3, 0),
    }
    manifest = examples_manifest(splits, seq_len=2, vocab_size=8, shard_windows=shard_windows)
    (tmp_path / "manifest.json").write_text(manifest_json(manifest))
    return data.read_manifest(str(tmp_path))


def test_manifest_and_split_files(tmp_path):
    with pytest.raises(UserError, match="manifest.json not found"):
        data.read_manifest(str(tmp_path))
    (tmp_path / "Split-train").mkdir()
    _write_windows(tmp_path / "Split-train" / "data_tfrecord-00000-of-00001.gz", [[1, 2, 3]])
    manifest = _manifest(tmp_path, ["Split-train/data_tfrecord-00000-of-00001.gz"], 1)
    files = data.split_files(str(tmp_path), manifest, "train")
    assert files == [str(tmp_path / "Split-train" / "data_tfrecord-00000-of-00001.gz")]
    with pytest.raises(UserError, match="is missing"):
        data.split_files(str(tmp_path), manifest, "eval")  # its folder is missing too
    two = [
        "Split-train/data_tfrecord-00000-of-00002.gz",
        "Split-train/data_tfrecord-00001-of-00002.gz",
    ]
    _write_windows(tmp_path / two[0], [[1, 2, 3]])
    with pytest.raises(UserError, match=f"shard {tmp_path / two[1]} is missing"):
        data.split_files(str(tmp_path), _manifest(tmp_path, two, 2), "train")


def test_split_shards_counts_each_file_as_tokenize_fills_them(tmp_path):
    names = [f"Split-train/data_tfrecord-{i:05d}-of-00003.gz" for i in range(3)]
    (tmp_path / "Split-train").mkdir()
    for name in names:
        _write_windows(tmp_path / name, [[1, 2, 3]])
    shards = data.split_shards(str(tmp_path), _manifest(tmp_path, names, 9, 4), "train")
    assert shards.windows == [4, 4, 1]
    assert shards.files == [str(tmp_path / n) for n in names]
    # Counts the shards cannot hold, or no shard size: the manifest is not tokenize's.
    for windows, per_shard in ((13, 4), (8, 4), (9, 0)):
        manifest = _manifest(tmp_path, names, windows, per_shard)
        with pytest.raises(UserError, match="re-run the tokenize step"):
            data.split_shards(str(tmp_path), manifest, "train")


# Seven shards of different sizes: two blocks of BLOCK_FILES per epoch, the second short.
SIZES = (5, 3, 6, 4, 2, 5, 1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards whose windows carry their own number: window k is [k, k, k]."""
    folder = tmp_path_factory.mktemp("shards")
    files, start = [], 0
    for i, size in enumerate(SIZES):
        files.append(str(folder / f"{i}.gz"))
        _write_windows(files[-1], [[k] * 3 for k in range(start, start + size)])
        start += size
    return data.Shards(files, list(SIZES))


def _numbers(records, n):
    parsed = records.take(n).map(lambda r: data._parse_batch(r[None], 2)[0][0, 0])
    return [int(x) for x in parsed]


@pytest.mark.slow
def test_every_epoch_trains_on_each_window_once_in_its_own_order(shards):
    order = data.TrainOrder(shards, seed=7, shuffle_buffer=4, keep=(1, 0))
    assert order.per_epoch == sum(SIZES) == 26
    stream = _numbers(order.records(), 3 * 26)
    epochs = [stream[i : i + 26] for i in range(0, 3 * 26, 26)]
    assert all(sorted(epoch) == list(range(26)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3
    assert stream == _numbers(data.TrainOrder(shards, 7, 4, (1, 0)).records(), 3 * 26)
    assert stream != _numbers(data.TrainOrder(shards, 8, 4, (1, 0)).records(), 3 * 26)


def test_the_order_is_the_seeds_alone_whatever_tensorflows_global_seed(shards):
    """tf.data's shuffle would mix TensorFlow's global seed (the trainer sets it to train.seed)
    into the order, and fails to build under a global seed of 0."""
    orders = []
    try:
        for global_seed in (0, 1, 2):
            tf.random.set_seed(global_seed)
            orders.append(_numbers(data.TrainOrder(shards, 0, 4, (1, 0)).records(), 2 * 26))
    finally:
        tf.random.set_seed(None)
    assert orders[0] == orders[1] == orders[2]


def test_windows_are_shuffled_within_each_block_not_only_the_shards(shards):
    """A chunk of one window is left as it is: the order then follows the interleave of the
    epoch's shards. Chunks of shuffle_buffer windows are permuted."""
    chunked = _numbers(data.TrainOrder(shards, 7, 8, (1, 0)).records(), 26)
    interleaved = _numbers(data.TrainOrder(shards, 7, 1, (1, 0)).records(), 26)
    assert sorted(chunked) == sorted(interleaved) and chunked != interleaved
    first_chunk = interleaved[:8]  # permuted among themselves, nothing else mixed in
    assert sorted(chunked[:8]) == sorted(first_chunk) and chunked[:8] != first_chunk


def test_workers_sharing_the_shards_draw_their_own_orders(shards):
    """Keeping every n-th window of each shard, the n pipelines' orders are not the same
    permutation of neighbouring windows (consecutive text in one step)."""
    orders = [data.TrainOrder(shards, 7, 4, keep=(2, i)).permutation(0).numpy() for i in (0, 1)]
    assert list(orders[0]) != list(orders[1])


def test_pipelines_that_share_the_shards_split_each_one_between_them(shards):
    """Fewer shards than pipelines: each keeps every n-th window of every shard."""
    parts = [data.TrainOrder(shards, 7, 4, keep=(2, i)) for i in range(2)]
    assert [p.per_epoch for p in parts] == [15, 11]  # 3+2+3+2+1+3+1, 2+1+3+2+1+2+0
    seen = [set(_numbers(p.records(), p.per_epoch)) for p in parts]
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(range(26))


@pytest.mark.parametrize("keep", [(1, 0), (2, 1)])
@pytest.mark.slow
def test_a_resumed_stream_is_the_uninterrupted_one_from_its_place(shards, keep):
    """records(skip=S) continues the stream at window S, in three data epochs (each with its own
    block sizes): at each block's first window, the windows either side of it, and inside the
    short last block."""
    order = data.TrainOrder(shards, 7, 4, keep)
    whole = _numbers(order.records(), 4 * order.per_epoch)
    places = set()
    for epoch in range(3):
        first_block = order.windows[order.permutation(epoch).numpy()[: data.BLOCK_FILES]]
        for start in (epoch * order.per_epoch, epoch * order.per_epoch + int(first_block.sum())):
            places |= {start - 1, start, start + 1}
        places.add((epoch + 1) * order.per_epoch - 2)
    assert len({order.locate(p)[:2] for p in places if p >= 0}) == 6  # every block of 3 epochs
    for skip in sorted(p for p in places if p >= 0):
        assert _numbers(order.records(skip), 6) == whole[skip : skip + 6], skip


def test_a_place_a_billion_epochs_in_is_found_without_reading_them(shards):
    """The resumed stream starts at its place by arithmetic: reading 26 billion windows first
    would not end. There, it is that epoch's own order from its window 11 on."""
    order = data.TrainOrder(shards, 7, 4, (1, 0))
    far = 10**9 * order.per_epoch
    epoch = _numbers(order.records(far), order.per_epoch)
    assert sorted(epoch) == list(range(26))
    assert _numbers(order.records(far + 11), 5) == epoch[11:16]
    assert order.locate(far + 11)[0] == 10**9


@pytest.mark.slow
def test_workers_train_on_their_own_shards_or_their_own_windows_of_each(shards):
    cfg = resolve_config("tiny", ("model.seq_len=2", "train.batch_size=1"))
    two = data.Shards(shards.files[:2], shards.windows[:2])  # windows 0-4 and 5-7
    even = data.Shards(shards.files[:6], shards.windows[:6])  # in two: 5+6+2, 3+4+5 windows
    # All seven in two: 14 and 12 windows, under BALANCE: every worker keeps every 2nd window.
    cases = ((even, 2, "shards"), (two, 3, "windows"), (shards, 2, "windows"))
    for split, n, kept in cases:
        seen = []
        for i in range(n):
            ctx = tf.distribute.InputContext(num_input_pipelines=n, input_pipeline_id=i)
            mine, keep = data.pipeline_shards(split, ctx)
            assert (mine.files == split.files[i::n]) == (kept == "shards")
            windows = int(sum(data.TrainOrder(mine, 1, 4, keep).windows))
            batches = itertools.islice(iter(data.train_dataset(split, cfg, ctx)), windows)
            seen.append([int(x[0, 0]) for x, _ in batches])
        everything = sorted(itertools.chain(*seen))
        assert everything == list(range(sum(split.windows))), (kept, seen)


def test_uneven_shards_are_split_by_window_so_no_worker_trains_on_a_remainder():
    # A split of 4500 windows: one full shard and the remainder. By shard, worker 1 would
    # cycle through 404 windows while worker 0 reads 4096: each batch half from the 404.
    uneven = data.Shards(["full.gz", "rest.gz"], [4096, 404])
    for i in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i)
        mine, keep = data.pipeline_shards(uneven, ctx)
        assert (mine, keep) == (uneven, (2, i))
        assert sum(data._kept(mine.windows, *keep)) == 2250
    many = data.Shards([f"{i}.gz" for i in range(9)], [4096] * 8 + [404])  # 5 and 4 shards
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    assert data.pipeline_shards(many, ctx) == (data.Shards(many.files[1::2], [4096] * 4), (1, 0))


def test_a_pipeline_left_without_windows_is_refused_on_every_worker(tmp_path):
    _write_windows(tmp_path / "one.gz", [[1, 2, 3]])
    one = data.Shards([str(tmp_path / "one.gz")], [1])
    for i in range(2):  # pipeline 0 has the window, and refuses too: all workers stop alike
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i)
        with pytest.raises(UserError, match="1 windows leave input pipeline 1 of 2 none"):
            data.pipeline_shards(one, ctx)


@pytest.mark.slow
def test_train_dataset_batches_the_order_endlessly_and_skips_whole_steps(shards):
    cfg = resolve_config("tiny", ("model.seq_len=2", "train.batch_size=3", "train.seed=5"))
    order = data.TrainOrder(shards, 5, cfg.train.shuffle_buffer, (1, 0))
    windows = _numbers(order.records(), 30)
    dataset = data.train_dataset(shards, cfg)
    # Known endless: MultiWorkerMirrored then skips its per-step "did a worker run out" check.
    assert dataset.cardinality() == tf.data.INFINITE_CARDINALITY
    batches = [x.numpy() for x, _ in itertools.islice(iter(dataset), 10)]
    assert [list(b[:, 0]) for b in batches] == [windows[i : i + 3] for i in range(0, 30, 3)]
    resumed = data.train_dataset(shards, cfg, skip_steps=4)
    np.testing.assert_array_equal(next(iter(resumed))[0], batches[4])
