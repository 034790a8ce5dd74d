"""The records that cross a step boundary (contracts/): each round-trips JSON strictly, and
each reads what today's writers write, literally."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from components import serving
from components.evaluate import executor as evaluate
from components.evaluate.results import EvalResult
from components.jobs.launcher import LaunchResult
from components.push import executor as push
from components.tokenize import dataset
from components.tokenize.corpus import list_sources
from components.train.executor import TrainResult
from contracts import records
from contracts.blessing import ModelBlessing, Scores, Seen, read_blessing, write_blessing
from contracts.errors import UserError
from contracts.examples import (
    FORMAT_VERSION,
    ExamplesReference,
    GcsSource,
    LocalSource,
    manifest_json,
    parse_manifest,
    parse_sources,
)
from contracts.training import metrics_json, parse_metrics

SHAKESPEARE = Path(__file__).resolve().parents[2] / "data" / "tinyshakespeare.txt"
# The corpus behind TODAY_MANIFEST: its dataset version depends only on these bytes, the file's
# name and the parameters, so the test can compute it again wherever it writes the file.
CORPUS_NAME = "shakespeare.txt"
CORPUS_SHA256 = "00eb54584be5f4d895fe098e102ad0222b7c47d676d413e2085b711c33840c06"

# A manifest.json as tokenize writes it (format 3; 5976 bytes of data/tinyshakespeare.txt,
# vocab_size 320, seq_len 16, shard_windows 64), its source's folder renamed. Examples on disk
# and in the content-addressed store look like this.
TODAY_MANIFEST = """{
  "dataset_version": "cdbce8fce5d9b74afc8a9e29780938bb3cd12f5631f9463f41ae1e400149d828",
  "seq_len": 16,
  "vocab_size": 320,
  "eval_fraction": 0.1,
  "splits": {
    "train": {
      "shards": [
        "Split-train/data_tfrecord-00000-of-00005.gz",
        "Split-train/data_tfrecord-00001-of-00005.gz",
        "Split-train/data_tfrecord-00002-of-00005.gz",
        "Split-train/data_tfrecord-00003-of-00005.gz",
        "Split-train/data_tfrecord-00004-of-00005.gz"
      ],
      "windows": 291,
      "tokens": 4666,
      "chars": 5399,
      "shard_windows": [
        64,
        64,
        64,
        64,
        35
      ],
      "shard_bytes": [
        1569,
        1575,
        1617,
        1636,
        975
      ],
      "shard_crc32c": []
    },
    "eval": {
      "shards": [
        "Split-eval/data_tfrecord-00000-of-00001.gz"
      ],
      "windows": 31,
      "tokens": 501,
      "chars": 577,
      "shard_windows": [
        31
      ],
      "shard_bytes": [
        888
      ],
      "shard_crc32c": []
    }
  },
  "tokenizer": {
    "file": "tokenizer.model",
    "sha256": "24284745d0a552f6adbf0eaf258c6891d49d8ae5a61c595c3ced90258027d4e3",
    "vocab_size": 320,
    "trained": true
  },
  "sources": [
    {
      "uri": "/data/corpus/shakespeare.txt",
      "size": 5976,
      "sha256": "00eb54584be5f4d895fe098e102ad0222b7c47d676d413e2085b711c33840c06"
    }
  ],
  "parameters": {
    "format_version": 4,
    "split_method": "file-tail-bytes-v3",
    "vocab_size": 320,
    "seq_len": 16,
    "eval_fraction": 0.1,
    "eval_max_bytes": 100000000,
    "text_field": "text",
    "unit_bytes": 67108864,
    "shard_windows": 64,
    "chunk_bytes": 1048576,
    "tokenizer_sample_bytes": 16777216,
    "sentencepiece_version": "0.2.3",
    "tokenizer_options": {
      "model_type": "bpe",
      "byte_fallback": true,
      "normalization_rule_name": "identity",
      "remove_extra_whitespaces": false,
      "add_dummy_prefix": false,
      "user_defined_symbols": [
        "\\n"
      ],
      "allow_whitespace_only_pieces": true,
      "split_digits": false,
      "character_coverage": 0.9995,
      "max_sentence_length": 65536,
      "input_sentence_size": 0,
      "shuffle_input_sentence": false,
      "num_threads": 1,
      "unk_id": 0,
      "bos_id": 1,
      "eos_id": 2,
      "pad_id": -1
    },
    "given_tokenizer_sha256": null
  },
  "documents": {
    "train": 1,
    "eval": 1
  },
  "empty_documents": 0,
  "formats": {
    "txt": 1
  }
}
"""

GCS_SOURCE = {
    "uri": "gs://bucket/corpus/a.txt",
    "size": 10,
    "crc32c": "AAAAAA==",
    "md5": "",  # a composite object has none
    "generation": 1700000000000000,
}


def _today() -> dict:
    return json.loads(TODAY_MANIFEST)


# ---- the Examples manifest -------------------------------------------------------------------


def test_todays_manifest_reads_as_a_record_and_is_written_back_byte_for_byte():
    manifest = parse_manifest(TODAY_MANIFEST, "examples/manifest.json")
    assert manifest.splits["train"].shards[4] == "Split-train/data_tfrecord-00004-of-00005.gz"
    assert (manifest.total("windows"), manifest.total("tokens")) == (322, 5167)
    assert manifest.tokenizer.file == "tokenizer.model" and manifest.tokenizer.trained
    assert manifest.sources == (LocalSource("/data/corpus/shakespeare.txt", 5976, CORPUS_SHA256),)
    assert manifest.parameters.format_version == FORMAT_VERSION
    assert manifest_json(manifest) == TODAY_MANIFEST


def test_the_dataset_version_is_the_one_todays_manifest_names(tmp_path):
    """The version hashes the parameters as the record writes them: the same version as
    before, so no dataset in the content-addressed store is tokenized again."""
    text = SHAKESPEARE.read_text(encoding="utf-8")[:6000]
    (tmp_path / CORPUS_NAME).write_text(text[: text.rindex("\n") + 1], encoding="utf-8")
    corpus = str(tmp_path / CORPUS_NAME)
    sources = list_sources(corpus)
    assert sources[0].sha256 == CORPUS_SHA256
    manifest = parse_manifest(TODAY_MANIFEST, "manifest.json")
    assert dataset.dataset_version(corpus, sources, manifest.parameters) == (
        manifest.dataset_version
    )


def test_a_manifest_round_trips_with_gcs_and_local_sources_and_a_reference_holds_one():
    data = _today()
    data["sources"].append(GCS_SOURCE)
    manifest = parse_manifest(json.dumps(data), "manifest.json")
    assert manifest.sources[1] == GcsSource(**GCS_SOURCE)
    assert parse_manifest(manifest_json(manifest), "manifest.json") == manifest
    reference = ExamplesReference("gs://root/datasets/v", manifest.dataset_version, manifest)
    text = manifest_json(reference)
    assert list(json.loads(text)) == ["uri", "dataset_version", "manifest"]
    assert records.from_json(ExamplesReference, text, "reference") == reference
    assert parse_sources(json.loads(json.dumps(data["sources"])), "sources") == manifest.sources


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (("seq_len", "16"), r"manifest\.seq_len=\"16\": takes a whole number"),
        (("splits", "train", "windows", 2.5), r"manifest\.splits\.train\.windows=2\.5: takes"),
        (("tokenizer", "trained", "yes"), r"manifest\.tokenizer\.trained=\"yes\": takes true"),
        (("parameters", "shard_windows", None), r"manifest\.parameters\.shard_windows=null"),
        (("splits", "eval", "rows", 3), r"manifest\.splits\.eval has no field 'rows'"),
        (("tokenizer", "file", None), r"manifest\.tokenizer\.file=null: takes a string"),
    ],
)
def test_a_wrong_type_or_key_is_one_line_naming_the_field_and_the_file(edit, said):
    data = _today()
    *path, key, value = edit
    target = data
    for part in path:
        target = target[part]
    target[key] = value
    with pytest.raises(UserError, match=said) as refused:
        parse_manifest(json.dumps(data), "/x/manifest.json")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("examples: /x/manifest.json: ")
    assert message.endswith("tokenize the corpus again to write Examples this gptpipe reads")


@pytest.mark.parametrize(
    ("drop", "said"),
    [
        (("splits",), "manifest: missing splits"),
        (("tokenizer", "file"), "manifest.tokenizer: missing file"),
        (("parameters", "chunk_bytes"), "manifest.parameters: missing chunk_bytes"),
    ],
)
def test_a_manifest_missing_what_todays_writer_always_writes_is_refused(drop, said):
    data = _today()
    *path, key = drop
    target = data
    for part in path:
        target = target[part]
    del target[key]
    with pytest.raises(UserError, match=f"^examples: /x/manifest.json: {said}; tokenize"):
        parse_manifest(json.dumps(data), "/x/manifest.json")


@pytest.mark.parametrize(
    ("version", "said"),
    [
        (3, "is of format_version 3, this gptpipe reads 4; tokenize the corpus again"),
        (None, "is of format_version null, this gptpipe reads 4; tokenize the corpus again"),
        (5, "is of format_version 5, this gptpipe reads 4; read it with the gptpipe that"),
    ],
)
def test_a_manifest_of_another_format_is_refused_naming_the_file(version, said):
    data = _today()
    if version is None:
        del data["parameters"]["format_version"]
    else:
        data["parameters"]["format_version"] = version
    with pytest.raises(UserError, match=f"^examples: /x/manifest.json {said}"):
        parse_manifest(json.dumps(data), "/x/manifest.json")
    with pytest.raises(UserError, match="^examples: /x/manifest.json is not valid JSON"):
        parse_manifest("{", "/x/manifest.json")


def test_a_recorded_source_of_the_wrong_shape_names_its_place():
    with pytest.raises(UserError, match=r"^sources\[0\]=.*: takes LocalSource or GcsSource$"):
        parse_sources([{"uri": "a", "size": "big", "sha256": "x"}], "sources")


# ---- the training result ---------------------------------------------------------------------

# train_metrics.json as the chief wrote it before it was a record: a diverged run's.
TODAY_TRAIN_METRICS = """{
  "diverged": true,
  "diverged_at_step": 7,
  "final_loss": NaN,
  "global_batch_size": 16,
  "precision_policy": "float32",
  "replicas": 2,
  "steps": 7,
  "tokens_per_second": 1234.5,
  "workers": 2
}"""


def test_todays_train_metrics_read_as_a_record_and_are_written_back_as_they_were():
    metrics = parse_metrics(TODAY_TRAIN_METRICS, "model/train_metrics.json")
    assert metrics.diverged and metrics.diverged_at_step == 7 and math.isnan(metrics.final_loss)
    assert metrics_json(metrics) == TODAY_TRAIN_METRICS
    again = parse_metrics(metrics_json(replace(metrics, final_loss=2.5)), "m")
    assert again == replace(metrics, final_loss=2.5)


def test_train_metrics_of_a_wrong_type_or_missing_a_field_are_one_line_naming_it():
    data = json.loads(TODAY_TRAIN_METRICS)
    with pytest.raises(UserError, match=r"^m/t.json: train_metrics.steps=\"7\": takes a whole"):
        parse_metrics(json.dumps({**data, "steps": "7"}), "m/t.json")
    del data["workers"]
    with pytest.raises(UserError, match=r"^m/t.json: train_metrics: missing workers$"):
        parse_metrics(json.dumps(data), "m/t.json")


def test_the_train_result_records_the_same_properties_lineage_always_has():
    metrics = parse_metrics(TODAY_TRAIN_METRICS, "m")
    launched = LaunchResult("local", "gptpipe-train-x", 2, 1, 0, 12.3456, 0.0, {"w-0": "sha"})
    result = TrainResult("c" * 64, metrics, launched)
    assert result.model_properties == {
        "config_hash": "c" * 64,
        "steps": 7,
        "final_loss": None,  # NaN: lineage and KFP's metadata cannot hold it
        "diverged": 1,
        "global_batch_size": 16,
        "tokens_per_second": 1234.5,
        "precision_policy": "float32",
        "gpu_hours": 0.0,
    }
    assert result.execution_properties == {
        "job_name": "gptpipe-train-x",
        "attempts": 1,
        "restarts": 0,
        "wall_seconds": 12.346,
        "gpu_hours": 0.0,
        "worker_image_digests": {"w-0": "sha"},
    }
    infinite = TrainResult("c", replace(metrics, final_loss=math.inf), launched)
    assert infinite.model_properties["final_loss"] == math.inf  # lineage keeps it as "inf"


# ---- the blessing ----------------------------------------------------------------------------

# blessing.json as evaluate wrote it before it was a record: a diverged candidate against a
# model in service that had trained on some of the eval text.
TODAY_BLESSING = """{
  "blessed": 0,
  "reason": "training diverged: the loss became nan at step 7",
  "current_model": "/runs/pipeline_root/run-2/train/model",
  "baseline_model": "/runs/serving/gpt/1",
  "candidate": {
    "nats_per_token": NaN,
    "nats_per_char": NaN,
    "perplexity": Infinity,
    "tokens": 500,
    "chars": 577
  },
  "baseline": {
    "nats_per_token": 2.5,
    "nats_per_char": 1.9,
    "perplexity": 12.182493960703473,
    "tokens": 500,
    "chars": 577
  },
  "eval_text_seen": {
    "candidate": null,
    "baseline": {
      "share": 0.25,
      "sampled": 12,
      "exact": true
    }
  }
}
"""


def _blessing_folder(tmp_path, marker: str, text: str | None):
    folder = tmp_path / "blessing"
    folder.mkdir(parents=True)
    (folder / marker).write_text("")
    if text is not None:
        (folder / "blessing.json").write_text(text)
    return folder


def test_todays_blessing_reads_as_a_record_and_is_written_back_byte_for_byte(tmp_path):
    blessing = read_blessing(_blessing_folder(tmp_path, "NOT_BLESSED", TODAY_BLESSING))
    assert (blessing.blessed, blessing.baseline_model) == (0, "/runs/serving/gpt/1")
    assert math.isnan(blessing.candidate.nats_per_char) and blessing.baseline.tokens == 500
    assert blessing.eval_text_seen.baseline == Seen(0.25, 12, exact=True)
    assert blessing.properties() == {
        "blessed": 0,
        "reason": "training diverged: the loss became nan at step 7",
        "current_model": "/runs/pipeline_root/run-2/train/model",
        "baseline_model": "/runs/serving/gpt/1",
    }
    out = tmp_path / "out"
    out.mkdir()
    write_blessing(out, blessing)
    assert (out / "blessing.json").read_text() == TODAY_BLESSING
    assert sorted(p.name for p in out.iterdir()) == ["NOT_BLESSED", "blessing.json"]


def test_an_older_blessing_reads_with_defaults_and_its_marker_decides(tmp_path):
    """Written before evaluate recorded the baseline: push then takes any served version."""
    older = read_blessing(_blessing_folder(tmp_path, "BLESSED", '{"reason": "ok"}'))
    assert older == ModelBlessing(blessed=1, reason="ok")
    assert older.baseline_model is None and older.candidate is None
    assert push._baseline(older) == serving.ANY_VERSION
    assert push._baseline(replace(older, baseline_model="")) is None
    assert push._baseline(replace(older, baseline_model="/serving/gpt/3")) == 3
    bare = read_blessing(_blessing_folder(tmp_path / "bare", "BLESSED", None))
    assert bare == ModelBlessing(blessed=1)


def test_a_blessing_of_a_wrong_type_is_one_line_naming_the_field_and_the_file(tmp_path):
    data = json.loads(TODAY_BLESSING)
    data["baseline"]["tokens"] = "500"
    folder = _blessing_folder(tmp_path, "NOT_BLESSED", json.dumps(data))
    with pytest.raises(UserError, match=r"blessing.json: blessing\.baseline\.tokens=\"500\""):
        read_blessing(folder)
    with pytest.raises(UserError, match="^not a ModelBlessing folder"):
        read_blessing(tmp_path)
    with pytest.raises(UserError, match=r"^blessing.blessed=2: takes 1 or 0$"):
        ModelBlessing(blessed=2)


def test_evaluate_writes_the_blessing_its_metadata_tells(tmp_path):
    scores = Scores(2.0, 1.5, 7.38905609893065, 10, 12)
    result = EvalResult(scores, None, "", True, "meets the threshold", {}, Seen(0.0, 3, True))
    blessing = evaluate.model_blessing(result, "gs://root/run/model")
    assert blessing.properties() == {
        "blessed": 1,
        "reason": "meets the threshold",
        "current_model": "gs://root/run/model",
        "baseline_model": "",
    }
    folder = tmp_path / "b"
    folder.mkdir()
    write_blessing(folder, blessing)
    assert read_blessing(folder) == blessing
    assert records.from_json(ModelBlessing, records.to_json(blessing), "b") == blessing
