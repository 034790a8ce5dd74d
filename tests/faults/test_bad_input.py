"""The bad-input matrix (docs/reliability.md): every row feeds one bad input.

Each must be refused with one line that names the input and the fix (a `UserError`; through the
CLI, exit status 2 and one line on stderr, no traceback), and must leave nothing half-written:
no dataset folder, no temporary sibling, no run root. The rows call the code a user reaches
(the tokenize executor, the config resolver, `gptpipe ...` in-process) and train nothing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import kfp.client.client
import pytest

from components.storage import gcs
from components.tokenize import bpe, executor
from components.tokenize.corpus import split_corpus
from contracts.errors import UserError
from pipelines import compiler
from pipelines.cli import main as cli
from pipelines.pipeline import Target
from pipelines.runners.kfp import auth as kfp_auth
from pipelines.runners.kfp import client as kfp_client
from tests.doubles.kfp.api_server import KfpApiDouble
from trainer.config import config_to_dict, resolve_config

REPO = Path(__file__).resolve().parents[2]
SHAKESPEARE = REPO / "data" / "tinyshakespeare.txt"
VOCAB = 340  # 256 byte pieces + 4 special + the slice's ~55 characters + a few merges
SEQ_LEN = 32
NEEDED = ["--param", "corpus=gs://bucket/corpus/", "--param", "serving_dir=gs://bucket/serving"]


def _slice(chars: int) -> str:
    text = SHAKESPEARE.read_text(encoding="utf-8")[:chars]
    return text[: text.rindex("\n") + 1]


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def _one_line(message: str) -> str:
    assert message and "\n" not in message and "Traceback" not in message, message
    return message


def _nothing_under(folder: Path) -> None:
    """No entry at all, hidden temporaries included."""
    assert not folder.exists() or list(folder.iterdir()) == [], list(folder.rglob("*"))


def _tokenize_refuses(corpus: Path | str, tmp_path: Path, **options) -> str:
    """Tokenize into a content-addressed store; return the one-line refusal; nothing written."""
    store = tmp_path / "pipeline_root" / "datasets"
    args = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "progress": False, **options}
    with pytest.raises(UserError) as refused:
        executor.run_content_addressed(str(corpus), str(store), **args)
    _nothing_under(store)
    return _one_line(str(refused.value))


def _cli_refuses(capsys, *argv: str) -> str:
    """`gptpipe ARGV` exits 2 with exactly one line on stderr; return that line."""
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("gptpipe: error: "), err
    return _one_line(err.strip())


# ---- corpus ---------------------------------------------------------------------------------


@pytest.mark.bad_input("a corpus path that does not exist")
def test_missing_corpus(tmp_path):
    message = _tokenize_refuses(tmp_path / "nope.txt", tmp_path)
    assert "nope.txt" in message and "not found" in message and "give" in message


@pytest.mark.bad_input("an empty corpus file")
def test_empty_corpus(tmp_path):
    corpus = _write(tmp_path / "in" / "empty.txt", b"")
    message = _tokenize_refuses(corpus, tmp_path)
    assert "empty.txt" in message and "empty (0 bytes)" in message


@pytest.mark.bad_input("a corpus too small for one training window")
def test_corpus_smaller_than_one_window(tmp_path):
    corpus = _write(tmp_path / "in" / "small.txt", _slice(4_000))
    message = _tokenize_refuses(corpus, tmp_path, seq_len=1000)
    assert "small.txt" in message and "fewer than one window of seq_len + 1 = 1001" in message
    assert "use seq_len <= " in message and "more data" in message


def _named_vocab_is_the_limit(message: str, text: str) -> int:
    """The limit in "use vocab_size <= N" (or >= N) trains a tokenizer on the train split, and
    one past it does not: the message names the exact fix."""
    sign = "<=" if "use vocab_size <= " in message else ">="
    limit = int(message.split(f"use vocab_size {sign} ")[1].split()[0])
    train = split_corpus([text], 0.1, "corpus")["train"]
    assert bpe.train(train, limit, "corpus", lambda line: None)
    past = limit + 1 if sign == "<=" else limit - 1
    with pytest.raises(UserError, match=f"vocab_size {past} "):
        bpe.train(train, past, "corpus", lambda line: None)
    return limit


@pytest.mark.bad_input("a corpus too small for the vocabulary")
def test_corpus_too_small_for_the_vocabulary(tmp_path):
    text = "hello world\n" * 3
    corpus = _write(tmp_path / "in" / "tiny.txt", text)
    message = _tokenize_refuses(corpus, tmp_path, vocab_size=512, seq_len=4)
    assert "tiny.txt" in message and "vocab_size 512" in message
    assert _named_vocab_is_the_limit(message, text) < 512


@pytest.mark.bad_input("a vocab_size larger than the corpus supports")
def test_vocabulary_larger_than_the_corpus_supports(tmp_path):
    text = _slice(12_000)
    corpus = _write(tmp_path / "in" / "text.txt", text)
    message = _tokenize_refuses(corpus, tmp_path, vocab_size=5000)
    assert "text.txt" in message and "vocab_size 5000" in message
    assert VOCAB <= _named_vocab_is_the_limit(message, text) < 5000


@pytest.mark.bad_input("a vocab_size too small for the corpus's characters")
def test_vocabulary_smaller_than_the_corpus_needs(tmp_path):
    text = _slice(12_000)
    corpus = _write(tmp_path / "in" / "text.txt", text)
    message = _tokenize_refuses(corpus, tmp_path, vocab_size=100)
    assert "text.txt" in message and "vocab_size 100" in message
    assert 260 < _named_vocab_is_the_limit(message, text) <= VOCAB


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
ELF = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 8 + b"\x02\x00\x3e\x00" + bytes(range(256)) * 4


@pytest.mark.parametrize(
    "name, data, expected",
    [
        pytest.param(
            "logo.txt",
            PNG,
            "is a PNG image, not UTF-8 text; remove it from the corpus",
            marks=pytest.mark.bad_input("a PNG image among the corpus files"),
            id="png",
        ),
        pytest.param(
            "tool.txt",
            ELF,
            "is an ELF executable, not UTF-8 text; remove it from the corpus",
            marks=pytest.mark.bad_input("an ELF binary among the corpus files"),
            id="elf",
        ),
        pytest.param(
            "notes.txt",
            b"plain start\n" + b"\x00\x01\x02\x03" * 64,
            "holds a NUL byte at offset 12, so it is binary",
            marks=pytest.mark.bad_input("a binary file with no known header"),
            id="nul-bytes",
        ),
        pytest.param(
            "corpus.txt",
            b"\x1f\x8b\x08\x00" + bytes(range(256)),
            "is gzip-compressed, not UTF-8 text; name it `corpus.txt.gz` so tokenize decompresses",
            marks=pytest.mark.bad_input("a gzip-compressed corpus"),
            id="gzip",
        ),
        pytest.param(
            "utf16.txt",
            "First Citizen:\n".encode("utf-16"),
            "is UTF-16 text, not UTF-8 text; convert it to UTF-8",
            marks=pytest.mark.bad_input("a UTF-16 corpus"),
            id="utf16",
        ),
    ],
)
def test_binary_corpus_file(tmp_path, name, data, expected):
    folder = tmp_path / "in"
    _write(folder / "a.txt", _slice(12_000))
    _write(folder / name, data)
    message = _tokenize_refuses(folder, tmp_path)
    assert f"corpus file {str((folder / name).resolve())!r} {expected}" in message


@pytest.mark.bad_input("a latin-1 (not UTF-8) corpus")
def test_latin1_corpus(tmp_path):
    corpus = _write(tmp_path / "in" / "latin1.txt", b"good line\ncaf\xe9 au lait\n" * 50)
    message = _tokenize_refuses(corpus, tmp_path)
    assert "latin1.txt" in message and "not UTF-8: byte 0xe9 at offset 13 (line 2)" in message
    assert "iconv -f latin1 -t utf-8" in message


@pytest.mark.parametrize(
    "links",
    [
        pytest.param(
            {"a": "."},
            marks=pytest.mark.bad_input("a corpus folder holding a link to itself (a -> .)"),
            id="link-to-folder",
        ),
        pytest.param(
            {"sub/up": ".."},
            marks=pytest.mark.bad_input("a corpus folder holding a link to its parent"),
            id="link-to-parent",
        ),
        pytest.param(
            {"x": "y", "y": "x"},
            marks=pytest.mark.bad_input("a corpus folder holding two links to each other"),
            id="two-links",
        ),
    ],
)
def test_symlink_loop_in_corpus_folder(tmp_path, links):
    folder = tmp_path / "in"
    _write(folder / "text.txt", _slice(12_000))
    _write(folder / "sub" / "more.txt", _slice(3_000))
    for name, target in links.items():
        (folder / name).symlink_to(target)
    message = _tokenize_refuses(folder, tmp_path)
    assert f"corpus folder {str(folder)!r} holds a symbolic link that loops" in message
    assert any(f"{folder / name} -> {target}" in message for name, target in links.items())
    assert "remove the link" in message


@pytest.mark.bad_input("a corpus path that is a link to itself")
def test_corpus_path_is_a_symlink_loop(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.symlink_to("corpus.txt")
    message = _tokenize_refuses(corpus, tmp_path)
    assert f"corpus {str(corpus)!r} is a symbolic link that loops" in message
    assert "point it at a text file or folder" in message


# Run in a child process, so its peak resident memory is its own (RUSAGE_SELF), not the test
# session's; the baseline is taken after the imports, just before tokenize starts.
_PEAK_RSS = """
import json, resource, sys
from components.tokenize import executor
from contracts.errors import UserError
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
try:
    executor.run_content_addressed(
        sys.argv[1], sys.argv[2], vocab_size=512, seq_len=64, progress=False
    )
    message = ""
except UserError as err:
    message = str(err)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"base": base, "peak": peak, "message": message}))
"""


@pytest.mark.bad_input("a 200 MB line with no newline")
def test_one_huge_line_is_refused_with_bounded_memory(tmp_path):
    size = 200 << 20
    corpus = tmp_path / "in" / "oneline.txt"
    corpus.parent.mkdir()
    with corpus.open("wb") as f:
        f.write(b"A first line.\nA second one.\n")
        block = b"no newline here " * (1 << 16)  # 1 MiB
        for _ in range(size // len(block)):
            f.write(block)
    store = tmp_path / "pipeline_root" / "datasets"
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(corpus), str(store)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    message = _one_line(found["message"])
    assert f"corpus file {str(corpus)!r}: line 3 (from byte 28)" in message
    assert "longer than 1 MiB with no newline; split it into lines" in message
    # The file is never held whole, let alone decoded and copied: the read stops at the limit.
    grown = found["peak"] - found["base"]
    assert grown < 64 << 20, f"tokenize grew by {grown >> 20} MiB on a {size >> 20} MiB line"
    _nothing_under(store)


@pytest.mark.bad_input("a corpus file edited while tokenize reads it")
def test_corpus_edited_while_it_is_read(tmp_path, monkeypatch):
    corpus = _write(tmp_path / "in" / "text.txt", _slice(12_000))
    listings = []
    listed = executor.list_sources

    def list_then_edit(where: str):
        found = listed(where)
        listings.append(found)
        if len(listings) == 2:  # run's own listing, after dataset_version_of's: both agree
            # Same size, other bytes: only what is read, hashed, can tell.
            corpus.write_bytes(corpus.read_bytes().replace(b"First", b"Fir5t", 1))
        return found

    monkeypatch.setattr(executor, "list_sources", list_then_edit)
    message = _tokenize_refuses(corpus, tmp_path)
    assert len(listings) == 2
    assert message == (
        f"corpus file {str(corpus)!r} changed while it was read; run again when it is stable"
    )


# ---- config ---------------------------------------------------------------------------------


@pytest.fixture
def run_local(tmp_path: Path, capsys) -> Callable[..., str]:
    """`gptpipe run --local ... EXTRA` on a real corpus, refused: its one line. The run root
    never appears, so no step started."""
    root = tmp_path / "runs"
    corpus = _write(tmp_path / "in" / "text.txt", _slice(12_000))

    def refused(*extra: str) -> str:
        message = _cli_refuses(
            capsys, "run", "--local", "--root", str(root), "--corpus", str(corpus), *extra
        )
        assert not root.exists()
        return message

    return refused


@pytest.mark.parametrize(
    "override, expected",
    [
        pytest.param(
            "model.n_heads=2",
            "unknown key 'model.n_heads' (did you mean 'model.n_head'?); valid keys: ",
            marks=pytest.mark.bad_input("--set with an unknown key"),
            id="unknown-key",
        ),
        pytest.param(
            "model.n_layer=two",
            "model.n_layer='two' is not a valid int; give an integer",
            marks=pytest.mark.bad_input("--set with a value of the wrong type"),
            id="wrong-type",
        ),
        pytest.param(
            "train.learning_rate=nan",
            "train.learning_rate must be a finite number, got nan",
            marks=pytest.mark.bad_input("--set train.learning_rate=nan"),
            id="nan",
        ),
        pytest.param(
            "train.learning_rate=inf",
            "train.learning_rate must be a finite number, got inf",
            marks=pytest.mark.bad_input("--set train.learning_rate=inf"),
            id="inf",
        ),
        pytest.param(
            "train.train_steps=0",
            "the run has no length: set train.train_steps, train.train_tokens or train.max_minutes",
            marks=pytest.mark.bad_input("--set train.train_steps=0"),
            id="zero-steps",
        ),
        pytest.param(
            "train.batch_size=-4",
            "train.batch_size must be positive, got -4",
            marks=pytest.mark.bad_input("--set train.batch_size=-4"),
            id="negative-batch",
        ),
        pytest.param(
            "model.n_head=3",
            "model.n_head=3 must divide model.d_model=128; change either",
            marks=pytest.mark.bad_input("heads that do not divide d_model"),
            id="heads-do-not-divide",
        ),
        pytest.param(
            "model.dropout=1.5",
            "model.dropout must be in [0, 1), got 1.5",
            marks=pytest.mark.bad_input("--set with a value out of range"),
            id="out-of-range",
        ),
        pytest.param(
            "train.train_steps",
            "override 'train.train_steps' must look like KEY=VALUE, e.g. train.train_steps=1000",
            marks=pytest.mark.bad_input("--set with no '='"),
            id="no-equals",
        ),
        pytest.param(
            "optimizer.lr=0.1",
            "unknown section 'optimizer' in key 'optimizer.lr'; keys are model.FIELD or "
            "train.FIELD",
            marks=pytest.mark.bad_input("--set with an unknown section"),
            id="unknown-section",
        ),
        pytest.param(
            "model.dropout=",
            "model.dropout='' is not a valid float; give a number",
            marks=pytest.mark.bad_input("--set with an empty value"),
            id="empty-value",
        ),
    ],
)
def test_bad_set_fails_before_any_step(run_local, override, expected):
    assert expected in run_local("--set", override)


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        pytest.param(
            "model:\n  n_heads: 2\n",
            "{config}: unknown key 'model.n_heads' (did you mean 'model.n_head'?)",
            marks=pytest.mark.bad_input("a YAML config with an unknown key"),
            id="unknown-key",
        ),
        pytest.param(
            "train:\n  batch_size: '32'\n",
            "{config}: train.batch_size must be int, got str '32'",
            marks=pytest.mark.bad_input("a YAML config with a value of the wrong type"),
            id="wrong-type",
        ),
        pytest.param(
            "train:\n  learning_rate: .nan\n",
            "{config}: train.learning_rate must be a finite number, got nan",
            marks=pytest.mark.bad_input("a YAML config with learning_rate .nan"),
            id="nan",
        ),
        pytest.param(
            "train:\n  weight_decay: .inf\n",
            "{config}: train.weight_decay must be a finite number, got inf",
            marks=pytest.mark.bad_input("a YAML config with weight_decay .inf"),
            id="inf",
        ),
        pytest.param(
            "train:\n  train_steps: -1\n  warmup_steps: 0\n",
            "train.train_steps must be >= 0, got -1",
            marks=pytest.mark.bad_input("a YAML config with negative steps"),
            id="negative-steps",
        ),
        pytest.param(
            "model:\n  n_layer: 2\n  bad: [\n",
            "'{config}' is not valid YAML: ",
            marks=pytest.mark.bad_input("a YAML config that does not parse"),
            id="not-yaml",
        ),
        pytest.param(
            "model: 5\n",
            "{config}: section 'model' must be a mapping of field: value, got int 5",
            marks=pytest.mark.bad_input("a YAML config whose section is not a mapping"),
            id="section-not-mapping",
        ),
    ],
)
def test_bad_yaml_config_fails_before_any_step(tmp_path, run_local, yaml_text, expected):
    config = _write(tmp_path / "run.yaml", yaml_text)
    assert expected.format(config=config) in run_local("--config", str(config))


@pytest.mark.bad_input("a config name that is neither a preset nor a YAML file")
def test_unknown_preset(run_local):
    message = run_local("--config", "gpt2-huge")
    presets = "('tiny', 'quality', 'gpt2-small', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')"
    assert f"unknown preset 'gpt2-huge'; use one of {presets} or a .yaml" in message


@pytest.mark.bad_input("Examples cut with a longer seq_len than the model's position table")
def test_windows_longer_than_the_position_table(tmp_path):
    # The model takes at most model.seq_len tokens (trainer/model.py: the position table's rows,
    # or ContextLimit), so no config can ask for more; windows cut for a longer seq_len are what
    # could, and train refuses them.
    from tests.tiny import examples_manifest
    from trainer import data

    manifest = examples_manifest({}, seq_len=128, vocab_size=512)
    with pytest.raises(UserError) as refused:
        data.check_manifest(manifest, resolve_config("tiny"))
    message = _one_line(str(refused.value))
    assert "manifest seq_len=128 but model.seq_len=64" in message
    assert "re-run tokenize with the same config or set model.seq_len=128" in message


# ---- operations: KFP, GCS -------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = Target(compiler.load_images(REPO / "tests" / "data" / "digests.json"), "gs://b/p")
    out = tmp_path_factory.mktemp("kfp") / "gptpipe.yaml"
    return compiler.compile_pipeline(out, target, resolve_config("tiny"))


@pytest.fixture
def kfp_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No kfp context file, no KFP variables, and retries that do not wait."""
    monkeypatch.setattr(kfp.client.client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "ctx"))
    for name in (kfp_client.HOST_ENV, kfp_auth.TOKEN_PATH_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kfp_client, "FIRST_BACKOFF_S", 0.01)


@pytest.fixture
def double(kfp_env) -> Iterator[KfpApiDouble]:
    with KfpApiDouble(token="secret-token") as served:
        yield served


@pytest.fixture
def token(tmp_path: Path) -> Path:
    return _write(tmp_path / "token", "secret-token\n")


def _closed_port() -> str:
    """A localhost URL nothing listens on: connections to it are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    "cron, expected",
    [
        pytest.param(
            "0 2 * * *",
            "has five fields, but KFP's cron has six with seconds first",
            marks=pytest.mark.bad_input("a five-field (classic) cron for kfp schedule"),
            id="five-fields",
        ),
        pytest.param(
            "0 0 2 * * * 2030",
            "has 7 fields: KFP's cron has six",
            marks=pytest.mark.bad_input("a seven-field cron for kfp schedule"),
            id="seven-fields",
        ),
        pytest.param(
            "0 0 24 * * *",
            "the hour field '24' is out of range: 0-23",
            marks=pytest.mark.bad_input("a cron hour out of range"),
            id="out-of-range",
        ),
        pytest.param(
            "0 0 2 * * sunday",
            "the day of week field 'sunday' has 'sunday', not a number or a name",
            marks=pytest.mark.bad_input("a cron with an unknown day name"),
            id="bad-name",
        ),
        pytest.param(
            "0 */0 * * * *",
            "the minute field '*/0' has step '0': a step is a positive number",
            marks=pytest.mark.bad_input("a cron with a zero step"),
            id="zero-step",
        ),
    ],
)
def test_malformed_cron_is_refused_before_any_call(kfp_env, capsys, cron, expected):
    # Nothing listens at the host: had schedule called KFP first, the error would say so.
    message = _cli_refuses(
        capsys, "kfp", "schedule", "--host", _closed_port(), "--name", "n", "--cron", cron
    )
    assert f"--cron {cron!r}" in message and expected in message
    assert "cannot reach" not in message


@pytest.mark.bad_input("a KFP host that refuses the connection")
def test_kfp_host_refusing_the_connection(kfp_env, capsys):
    host = _closed_port()
    message = _cli_refuses(capsys, "kfp", "runs", "--host", host, "--retries", "1")
    assert f"cannot reach KFP at {host} to read its health check" in message
    assert "connection refused, 2 attempts" in message
    assert "check --host and that the API server is up" in message


@pytest.mark.bad_input("a KFP host that answers 401 to the token given")
def test_kfp_host_answering_401(double, tmp_path, capsys):
    wrong = _write(tmp_path / "stale-token", "stale\n")
    message = _cli_refuses(capsys, "kfp", "runs", "--host", double.host, "--token-file", str(wrong))
    assert (
        f"KFP at {double.host} refused the token from --token-file ({wrong}): HTTP 401" in message
    )
    assert "check the token's audience (pipelines.kubeflow.org) and its expiry" in message
    assert "stale" not in message.replace(str(wrong), "")  # never the token itself


@pytest.mark.bad_input("a KFP host that answers 401 to no token at all")
def test_kfp_host_answering_401_without_a_token(double, capsys):
    message = _cli_refuses(capsys, "kfp", "runs", "--host", double.host)
    assert f"KFP at {double.host} refused a request with no token" in message
    assert (
        "HTTP 401" in message and "pass --token-file, or set $KF_PIPELINES_SA_TOKEN_PATH" in message
    )


@pytest.mark.bad_input("a KFP host that answers 500")
def test_kfp_host_answering_500(double, token, capsys):
    double.fail_next(500, times=2, path="/apis/v2beta1/runs")
    message = _cli_refuses(
        capsys, "kfp", "runs", "--host", double.host, "--token-file", str(token), "--retries", "1"
    )
    assert f"KFP at {double.host} answered list runs with HTTP 500 (2 attempts): " in message
    assert "the API server failed: see its log" in message and "run the command again" in message
    assert double.statuses("GET", "/apis/v2beta1/runs") == [500, 500]


@pytest.mark.parametrize(
    "param, expected",
    [
        pytest.param(
            "eval_policy.max_nats_per_char=-1",
            "--param eval_policy.max_nats_per_char=-1.0: the blessing threshold is a positive, "
            "finite loss",
            marks=pytest.mark.bad_input("a negative blessing threshold"),
            id="threshold-negative",
        ),
        pytest.param(
            "eval_policy.max_nats_per_char=NaN",
            "--param eval_policy.max_nats_per_char=nan: takes a finite number",
            marks=pytest.mark.bad_input("a NaN blessing threshold"),
            id="threshold-nan",
        ),
        pytest.param(
            "eval_policy.max_nats_per_char=low",
            '--param eval_policy.max_nats_per_char="low": takes a number',
            marks=pytest.mark.bad_input("a blessing threshold that is not a number"),
            id="threshold-not-a-number",
        ),
        pytest.param(
            "eval_policy.tolerance=5",
            "--param eval_policy.tolerance=5.0: the regression allowed against the baseline is a "
            "fraction in "
            "[0, 1]; pass one such as 0.01 (1%)",
            marks=pytest.mark.bad_input("a blessing tolerance of 5 (500%)"),
            id="tolerance-too-big",
        ),
        pytest.param(
            "eval_policy.tolerance=-0.5",
            "--param eval_policy.tolerance=-0.5: the regression allowed against the baseline",
            marks=pytest.mark.bad_input("a negative blessing tolerance"),
            id="tolerance-negative",
        ),
    ],
)
def test_bad_blessing_parameter_starts_no_run(double, token, compiled, capsys, param, expected):
    message = _cli_refuses(
        capsys,
        "kfp",
        "run",
        "--host",
        double.host,
        "--token-file",
        str(token),
        "--file",
        str(compiled),
        *NEEDED,
        "--param",
        param,
    )
    assert expected in message
    assert double.runs == {} and double.experiments == {}


@pytest.mark.bad_input("a whole config parameter that is inconsistent")
def test_bad_config_parameter_starts_no_run(double, token, compiled, capsys):
    config = config_to_dict(resolve_config("tiny"))
    config["model"]["n_head"] = 3
    message = _cli_refuses(
        capsys,
        "kfp",
        "run",
        "--host",
        double.host,
        "--token-file",
        str(token),
        "--file",
        str(compiled),
        *NEEDED,
        "--param",
        f"config={json.dumps(config)}",
    )
    assert "--param config: model.n_head=3 must divide model.d_model=128" in message
    assert "pass --config and --set" in message
    assert double.runs == {} and double.experiments == {}


@pytest.fixture
def no_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """No Google credentials anywhere, no emulator, no metadata server; and no connection may
    leave this machine: each attempt is refused and returned in the list."""
    from google.auth.compute_engine import _metadata

    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.config/gcloud
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)  # the variable is read on import
    monkeypatch.setattr(gcs, "_CLIENT", {})  # no client made by an earlier test
    attempts: list[tuple] = []
    connect = socket.socket.connect

    def local_only(sock: socket.socket, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in (
            "127.0.0.1",
            "::1",
            "localhost",
        ):
            attempts.append(address)
            raise OSError(101, "the test allows no network")
        connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    return attempts


@pytest.mark.bad_input("a gs:// corpus on a local run with no Google Cloud credentials")
def test_gcs_corpus_without_credentials(tmp_path, capsys, no_cloud):
    root = tmp_path / "runs"
    message = _cli_refuses(
        capsys, "run", "--local", "--root", str(root), "--corpus", "gs://gptpipe-corpus/texts/"
    )
    assert "no Google Cloud credentials to reach gs://" in message
    assert "gcloud auth application-default login" in message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message
    assert not root.exists()
    assert no_cloud == []  # nothing tried to leave this machine


# ---- object names that are paths ------------------------------------------------------------


@pytest.mark.bad_input("a gs:// corpus URI with '..' in its key")
@pytest.mark.parametrize(
    "corpus", ["gs://bucket/corpus/../other/", "gs://bucket/./corpus", "gs://bucket//abs"]
)
def test_a_gs_uri_with_path_segments_is_refused_before_any_request(tmp_path, corpus):
    datasets = tmp_path / "datasets"
    with pytest.raises(UserError) as err:
        executor.run_content_addressed(corpus, str(datasets), vocab_size=300, seq_len=32)
    assert str(err.value).startswith(f"{corpus!r}: a gs:// key is a name, not a path")
    assert not datasets.exists()


@pytest.mark.bad_input("an object under a downloaded folder named with '..' or a leading '/'")
# Only the leading-'/' name goes through the emulator: gcp-storage-emulator drops the connection
# on an upload whose key has '..' segments (real GCS stores it); `unsafe_name`, which
# download_dir applies to every name, is checked on those below.
@pytest.mark.parametrize("evil", ["/abs.txt"])
def test_an_object_that_would_land_outside_its_folder_is_never_downloaded(request, tmp_path, evil):
    from components import storage

    bucket = request.getfixturevalue("gcs")
    bucket.put("model/1/saved_model.pb", b"graph")
    bucket.put("model/1/" + evil, b"x")
    target = tmp_path / "deep" / "copy"
    with pytest.raises(UserError, match=r"refusing to download .*would be written outside"):
        storage.download_dir(bucket.uri("model/1"), target)
    assert not (tmp_path / "escape.txt").exists() and not list(tmp_path.rglob("*.txt"))
    assert not target.exists()


def test_names_that_walk_out_of_a_folder_are_unsafe():
    from components.storage.uris import unsafe_name

    assert [unsafe_name(n) for n in ("../x", "a/../../x", "./x", "a/./x", "/x")] == [True] * 5
    assert [unsafe_name(n) for n in ("x", "a/b.txt", "a..b/c", ".hidden", "a//b")] == [False] * 5
