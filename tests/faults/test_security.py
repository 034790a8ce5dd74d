"""The security rows of the reliability matrix.

1. No credential leaks. A unique fake token is planted where a user's credentials arrive (a KFP
   token file named by `--token-file` or `$KF_PIPELINES_SA_TOKEN_PATH`, a Google service-account
   key named by `$GOOGLE_APPLICATION_CREDENTIALS`, plain `KFP_TOKEN`/`AWS_SECRET_ACCESS_KEY`
   variables). Then every output is searched for it: the compiled pipeline and the TFJob
   manifest, what `gptpipe kfp` sends to the KFP API double and prints and logs (the token may
   travel only in the Authorization header), what the TFJob launcher sends to the Kubernetes
   double, and everything a whole local run leaves on disk (logs, artifacts, the ML Metadata
   SQLite file as bytes) and prints.
2. YAML is read only with safe loading, and 3. no shell runs on user input: AST scans of the
   product's code, each checker first shown to catch planted code; the Makefile's targets quote
   every variable a user sets, and `make upload/submit/schedule` pass hostile values through as
   single words.
4. The image and the TFJob worker pods run as a numeric non-root user
   (tests/doubles/kubernetes/pod_security.py holds the Pod Security "restricted" checks;
   tests/pipelines/test_step_pod_security.py covers the step pods KFP builds, so here only what
   the compiled YAML asks of them is checked).
5. deploy/rbac.yaml grants the launcher exactly the (apiGroup, resource, verb) triples it uses,
   recorded by the Kubernetes double over every launcher path: create, watch, logs, restarts,
   the deadline, cancel, re-attach, a transient outage, the release exit handler, and the step
   reading its own pod; for the TFJob launcher and the Indexed Job launcher alike.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import gzip
import importlib.util
import io
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kfp.client.client
import pytest
import yaml

from components import provenance
from components.jobs import kube as kube_api
from components.jobs.errors import LaunchCancelled, LaunchError, LaunchTimeout, WorkerInputError
from components.jobs.indexed import cleanup as indexed_cleanup
from components.jobs.indexed import manifest as indexed_manifest
from components.jobs.indexed.job import IndexedJobLauncher
from components.jobs.indexed.spec import IndexedJobSpec
from components.jobs.tfjob import cleanup
from components.jobs.tfjob import launcher as tfjob
from components.jobs.tfjob import manifest as tfjob_manifest
from components.train import executor
from pipelines import compiler
from pipelines.cli import main as cli
from pipelines.pipeline import Target
from pipelines.runners.kfp import auth as kfp_auth
from pipelines.runners.kfp import client as kfp_client
from tests.components.jobs.tfjob.specs import make_spec, worker_template
from tests.doubles.kfp import api_server as kfp_api_double
from tests.doubles.kfp.api_server import KfpApiDouble
from tests.doubles.kubernetes import batch_api
from tests.doubles.kubernetes.apiserver import FakeKube, scenarios
from tests.doubles.kubernetes.pod_security import restricted_violations
from tests.tiny import PIPELINE_SMALL
from trainer.config import resolve_config

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "tests" / "data" / "digests.json"
DOCKERFILE = REPO / "images" / "Dockerfile"
MAKEFILE = REPO / "Makefile"
RBAC = REPO / "deploy" / "rbac.yaml"
SCANNED = ("components", "contracts", "pipelines", "trainer", "images", "bench")
# images/build.py is a script, not a package: loaded for its Dockerfile parser.
_build_spec = importlib.util.spec_from_file_location("images_build", REPO / "images" / "build.py")
images_build = importlib.util.module_from_spec(_build_spec)
_build_spec.loader.exec_module(images_build)
TRAINER_IMAGE = "us-docker.pkg.dev/proj/gptpipe/trainer@sha256:" + "cd" * 32
NEEDED = ["--param", "corpus=gs://bucket/corpus/", "--param", "serving_dir=gs://bucket/serving"]
SMALL = PIPELINE_SMALL


# ---- 1. no credential leaks: planting and searching ------------------------------------------


@dataclass(frozen=True)
class Planted:
    """A fake credential, and the environment that hands it over the way a user's arrives."""

    secret: str  # unique per test; it authenticates nowhere
    token_file: Path  # holds it, as a KFP bearer token file does
    env: dict[str, str] = field(default_factory=dict)


def plant_credentials(folder: Path) -> Planted:
    """Write a token file and a service-account key holding a fresh secret; return the env."""
    secret = f"gptpipe-test-secret-{secrets.token_hex(12)}"
    folder.mkdir(parents=True, exist_ok=True)
    token_file = folder / "kfp-token"
    token_file.write_text(secret + "\n")
    key = folder / "service-account.json"
    key.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "gptpipe-test",
                "private_key_id": secret,
                "private_key": f"-----BEGIN PRIVATE KEY-----\n{secret}\n-----END PRIVATE KEY-----",
                "client_email": f"{secret}@gptpipe-test.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "http://127.0.0.1:9/token",  # never reached: the key cannot sign
            }
        )
    )
    env = {
        kfp_auth.TOKEN_PATH_ENV: str(token_file),
        "GOOGLE_APPLICATION_CREDENTIALS": str(key),
        "KFP_TOKEN": secret,
        "AWS_SECRET_ACCESS_KEY": secret,
    }
    return Planted(secret, token_file, env)


def secret_forms(secret: str) -> dict[str, bytes]:
    """The secret as bytes, and base64-encoded at each of the three alignments it can have
    inside a longer encoded value (only the characters that depend on it alone)."""
    raw = secret.encode()
    forms = {"as is": raw}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw)
        first, end = -(-8 * shift // 6), 8 * (shift + len(raw)) // 6
        forms[f"base64 (offset {shift})"] = encoded[first:end]
    return forms


def _files(places: Iterable[Path]) -> Iterator[Path]:
    for place in places:
        if place.is_file():
            yield place
        elif place.is_dir():
            yield from sorted(p for p in place.rglob("*") if p.is_file() and not p.is_symlink())


def find_secret(
    secret: str, files: Iterable[Path] = (), texts: Mapping[str, str | bytes] | None = None
) -> list[str]:
    """Every place `secret` appears: "<file or name>: <form> at byte N: ...context...".

    Folders in `files` are searched recursively, every file as bytes; a gzip file is searched
    decompressed as well. `texts` are named outputs (a captured stdout, a request body).
    """
    blobs: list[tuple[str, bytes]] = []
    for path in _files(files):
        data = path.read_bytes()
        blobs.append((str(path), data))
        if data[:2] == b"\x1f\x8b":
            with contextlib.suppress(OSError, EOFError):
                blobs.append((f"{path} (gunzipped)", gzip.decompress(data)))
    for name, text in (texts or {}).items():
        blobs.append((name, text.encode() if isinstance(text, str) else text))
    found = []
    for name, data in blobs:
        for form, needle in secret_forms(secret).items():
            at = data.find(needle)
            if at >= 0:
                context = data[max(0, at - 40) : at + len(needle) + 40]
                found.append(f"{name}: {form} at byte {at}: ...{context!r}...")
    return found


@pytest.mark.fault("a secret planted in a nested file, a gzip file and a base64 value")
def test_the_secret_search_names_every_file_that_holds_it(tmp_path):
    secret = f"gptpipe-test-secret-{secrets.token_hex(12)}"
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "plain.log").write_text(f"token={secret}\n")
    (tmp_path / "a" / "shard.gz").write_bytes(gzip.compress(f"x{secret}y".encode()))
    for shift in range(3):
        value = base64.b64encode(b"u" * shift + f"user:{secret}".encode())
        (tmp_path / f"basic-{shift}.json").write_bytes(b'{"auth": "' + value + b'"}')
    (tmp_path / "clean.txt").write_text("gptpipe-test-secret-" + "0" * 24)
    found = find_secret(secret, [tmp_path], {"stdout": f"Bearer {secret}"})
    where = {line.split(": ")[0] for line in found}
    assert where == {
        str(tmp_path / "a" / "b" / "plain.log"),
        f"{tmp_path / 'a' / 'shard.gz'} (gunzipped)",
        *(str(tmp_path / f"basic-{shift}.json") for shift in range(3)),
        "stdout",
    }
    assert find_secret(secret, [tmp_path / "clean.txt"], {"stderr": ""}) == []


def plant(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Planted:
    planted = plant_credentials(folder)
    for name, value in planted.env.items():
        monkeypatch.setenv(name, value)
    return planted


# ---- 1a. the compiled pipeline and the TFJob manifest ---------------------------------------


@pytest.mark.fault("credentials in the environment while compiling, with every compile option")
def test_the_compiled_pipeline_and_the_tfjob_manifest_hold_no_credential(
    tmp_path, monkeypatch, capsys
):
    planted = plant(monkeypatch, tmp_path / "creds")
    config = tmp_path / "train.yaml"
    config.write_text("base: tiny\ntrain:\n  train_steps: 120\n")
    out = tmp_path / "out" / "gptpipe.yaml"
    assert (
        cli.main(
            [
                "compile",
                "--output",
                str(out),
                "--lock",
                str(LOCK),
                "--pipeline-root",
                "gs://bucket/gptpipe",
                "--image-pull-secret",
                "regcred",
                "--image-pull-secret",
                "mirror",
                "--config",
                str(config),
                "--set",
                "train.batch_size=4",
            ]
        )
        == 0
    )
    compiled = capsys.readouterr()
    manifest_args = ["tfjob-manifest", "--image", TRAINER_IMAGE, "--workers", "2"]
    assert cli.main([*manifest_args, "--set", "train.train_steps=120", "--run-id", "run-1"]) == 0
    manifest = capsys.readouterr()
    assert "imagePullSecret" in out.read_text()  # the options did reach the YAML
    assert yaml.safe_load(manifest.out)["kind"] == "TFJob"
    outputs = {
        "compile stdout": compiled.out,
        "compile stderr": compiled.err,
        "tfjob-manifest stdout": manifest.out,
        "tfjob-manifest stderr": manifest.err,
    }
    assert find_secret(planted.secret, [out.parent], outputs) == []


# ---- 1b. what `gptpipe kfp` sends, prints and logs ------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One HTTP request the KFP API double received, as it came over the wire."""

    method: str
    target: str  # path and query
    headers: dict[str, str]  # names in lower case
    body: bytes


@pytest.fixture
def kfp_wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    """Every request to a KfpApiDouble, recorded before the double reads it."""
    sent: list[Sent] = []
    serve = kfp_api_double._Handler._serve

    def recording(handler: Any, method: str) -> None:
        connection = handler.rfile  # kept alive: the next request comes on it
        body = connection.read(int(handler.headers.get("Content-Length") or 0))
        headers = {name.lower(): value for name, value in handler.headers.items()}
        sent.append(Sent(method, handler.path, headers, body))
        handler.rfile = io.BytesIO(body)  # for the double, which reads the body itself
        try:
            serve(handler, method)
        finally:
            handler.rfile = connection

    monkeypatch.setattr(kfp_api_double._Handler, "_serve", recording)
    # kfp.Client reads ~/.config/kfp/context.json; KFP's variables would change the host.
    monkeypatch.setattr(kfp.client.client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "ctx.json"))
    monkeypatch.delenv(kfp_client.HOST_ENV, raising=False)
    monkeypatch.setattr(kfp_client, "FIRST_BACKOFF_S", 0.01)
    return sent


def wire_leaks(secret: str, sent: list[Sent]) -> list[str]:
    """Where the secret went on the wire other than `Authorization: Bearer <secret>`."""
    texts: dict[str, str | bytes] = {}
    for i, request in enumerate(sent):
        where = f"request {i} {request.method} {request.target}"
        texts[f"{where} target"] = request.target
        texts[f"{where} body"] = request.body
        for name, value in request.headers.items():
            if not (name == "authorization" and value == f"Bearer {secret}"):
                texts[f"{where} header {name}"] = value
    return find_secret(secret, (), texts)


def stored_state(double: KfpApiDouble) -> dict[str, str]:
    """What the double keeps: every version's YAML, runs and recurring runs as JSON."""
    state: dict[str, str] = {f"version yaml {k}": v for k, v in double.version_yaml.items()}
    for kind in ("pipelines", "versions", "experiments", "runs", "recurring_runs"):
        for key, model in getattr(double, kind).items():
            state[f"{kind} {key}"] = json.dumps(kfp_api_double.dump(model), default=str)
    return state


@pytest.mark.slow
@pytest.mark.fault("a KFP token in a token file, a service-account key and plain variables")
@pytest.mark.parametrize("given_by", ["--token-file", "$KF_PIPELINES_SA_TOKEN_PATH"])
def test_gptpipe_kfp_sends_the_token_only_as_its_bearer_header(
    given_by, tmp_path, monkeypatch, kfp_wire, capsys, caplog
):
    planted = plant(monkeypatch, tmp_path / "creds")
    if given_by == "--token-file":
        monkeypatch.delenv(kfp_auth.TOKEN_PATH_ENV)
    auth = ["--token-file", str(planted.token_file)] if given_by == "--token-file" else []
    caplog.set_level(logging.DEBUG)
    with KfpApiDouble(token=planted.secret) as double:
        conn = ["--host", double.host, *auth]
        commands = [
            ["upload", *conn, "--pipeline-root", "gs://bucket/gptpipe", "--lock", str(LOCK)]
            + ["--version", "v1", "--image-pull-secret", "regcred", "--config", "tiny"],
            [
                "run",
                *conn,
                "--version",
                "v1",
                *NEEDED,
                "--param",
                "train_job.service_account=trainer",
            ]
            + [
                "--param",
                "train_job.workers=1",
                "--config",
                "tiny",
                "--set",
                "train.train_steps=120",
            ]
            + ["--run-name", "smoke", "--wait", "--poll", "0"],
            ["schedule", *conn, "--name", "weekly", "--cron", "0 0 2 * * 0", *NEEDED],
            ["runs", *conn, "--json"],
            ["unschedule", *conn, "--name", "weekly"],
        ]
        for command in commands:
            assert cli.main(["kfp", *command]) == 0, command
        state = stored_state(double)
    printed = capsys.readouterr()
    authorized = [s for s in kfp_wire if not s.target.endswith("/healthz")]
    assert len(authorized) > len(commands)
    for request in authorized:
        assert request.headers.get("authorization") == f"Bearer {planted.secret}", request
    assert wire_leaks(planted.secret, kfp_wire) == []
    outputs = {"stdout": printed.out, "stderr": printed.err, "log records": caplog.text, **state}
    assert find_secret(planted.secret, [tmp_path / "ctx.json"], outputs) == []


@pytest.mark.fault("a KFP token the server refuses (401)")
def test_a_refused_token_is_named_by_its_file_never_by_its_value(
    tmp_path, monkeypatch, kfp_wire, capsys, caplog
):
    planted = plant(monkeypatch, tmp_path / "creds")
    caplog.set_level(logging.DEBUG)
    with KfpApiDouble(token="the-token-the-server-wants") as double:
        code = cli.main(
            ["kfp", "runs", "--host", double.host, "--token-file", str(planted.token_file)]
        )
    printed = capsys.readouterr()
    assert code == 2
    assert "HTTP 401" in printed.err and str(planted.token_file) in printed.err
    assert any(s.headers.get("authorization") == f"Bearer {planted.secret}" for s in kfp_wire)
    assert wire_leaks(planted.secret, kfp_wire) == []
    outputs = {"stdout": printed.out, "stderr": printed.err, "log records": caplog.text}
    assert find_secret(planted.secret, (), outputs) == []


# ---- 1c. a whole local run: its files, its ML Metadata store, its output --------------------


@dataclass(frozen=True)
class LocalRun:
    planted: Planted
    root: Path  # --root: serving/, pipeline_root/, metadata.sqlite
    folders: tuple[Path, ...]  # every folder the run could write: root, cwd, HOME, TMPDIR
    done: subprocess.CompletedProcess[bytes]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> LocalRun:
    """The local pipeline once (`local_runner.run_local`, what `gptpipe run --local` runs), in a
    process whose environment holds planted credentials; its HOME and TMPDIR are searched too."""
    base = tmp_path_factory.mktemp("local-run")
    planted = plant_credentials(base / "creds")
    root, cwd, home, tmp = (base / name for name in ("runs", "cwd", "home", "tmp"))
    for folder in (cwd, home, tmp):
        folder.mkdir()
    corpus = cwd / "corpus.txt"
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    corpus.write_text(text[:120_000], encoding="utf-8")
    env = {
        **os.environ,
        **planted.env,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(REPO),
        provenance.CODE_VERSION_ENV: "c0ffee",  # what an image bakes in; no git call
    }
    # As `gptpipe run --local --json` prints it, but with the e2e tests' blessing threshold
    # (the CLI has no option for it), so that the model is pushed and `gptpipe lineage` and
    # `reproduce` have a pushed model to start from.
    script = (
        "import json, sys\n"
        "from contracts.params import EvalPolicy\n"
        "from pipelines.runners.local import runner\n"
        "from trainer.config import resolve_config\n"
        "root, corpus, *overrides = sys.argv[1:]\n"
        "run = runner.LocalRun(root=root, corpus=corpus, eval_policy=EvalPolicy(5.0),\n"
        "                      config=resolve_config('tiny', overrides))\n"
        "print(json.dumps(runner.run_local(run), indent=2, default=str))\n"
    )
    command = [sys.executable, "-c", script, str(root), str(corpus), *SMALL]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, timeout=1200)
    return LocalRun(planted, root, (root, cwd, home, tmp), done)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.fault("credentials in the environment of a whole local run")
def test_a_local_run_leaves_no_credential_in_its_files_store_or_output(local_run):
    done = local_run.done
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    store = local_run.root / "metadata.sqlite"
    assert store.is_file() and b"tokenize" in store.read_bytes()  # the store was searched
    assert list(local_run.root.rglob("worker-0.log"))  # so were the trainer's logs
    outputs = {"stdout": done.stdout, "stderr": done.stderr}
    assert find_secret(local_run.planted.secret, local_run.folders, outputs) == []


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.fault("credentials in the environment, then lineage and reproduce over that run")
def test_lineage_and_reproduce_of_that_run_print_and_write_no_credential(
    local_run, tmp_path, capsys
):
    assert local_run.done.returncode == 0
    root = str(local_run.root)
    assert cli.main(["lineage", "--latest", "--root", root, "--json"]) == 0
    pushed = json.loads(capsys.readouterr().out)["pushed_model"]["uri"]
    out = tmp_path / "reproduce" / "again.yaml"
    args = ["reproduce", pushed, "--root", root, "--output", str(out), "--allow-unpinned"]
    assert cli.main(args) == 0
    printed = capsys.readouterr()
    assert out.is_file()
    outputs = {"stdout": printed.out, "stderr": printed.err}
    assert find_secret(local_run.planted.secret, [out.parent], outputs) == []


# ---- 2 and 3. safe YAML, no shell: AST scans -------------------------------------------------

UNSAFE_YAML_CALLS = {
    f"yaml.{kind}_load{all_}" for kind in ("unsafe", "full") for all_ in ("", "_all")
}
YAML_LOADING_CALLS = {"yaml.load", "yaml.load_all"}  # safe only with Loader=SafeLoader
SAFE_LOADERS = {"yaml.SafeLoader", "yaml.CSafeLoader"}
UNSAFE_LOADERS = {f"yaml.{p}{kind}Loader" for p in ("", "C") for kind in ("", "Full", "Unsafe")}
SHELL_CALLS = {
    "os.system",
    "os.popen",
    "asyncio.create_subprocess_shell",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
}


def _import_names(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from the module's absolute imports."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, names: Mapping[str, str]) -> str:
    """`yaml.load`, `subprocess.run`... for a Name or an Attribute chain, imports resolved."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(names.get(node.id, node.id))
    return ".".join(reversed(parts))


def unsafe_yaml(source: str, filename: str = "<snippet>") -> list[str]:
    """YAML read with anything but safe loading: "<file>:<line>: <what>"."""
    tree = ast.parse(source, filename)
    names = _import_names(tree)
    found = []
    for node in ast.walk(tree):
        name = _dotted(node, names) if isinstance(node, ast.Name | ast.Attribute) else ""
        if name in UNSAFE_LOADERS:
            found.append(f"{filename}:{node.lineno}: {name}")
        if not isinstance(node, ast.Call):
            continue
        called = _dotted(node.func, names)
        if called in UNSAFE_YAML_CALLS:
            found.append(f"{filename}:{node.lineno}: {called}()")
        elif called in YAML_LOADING_CALLS:
            loaders = [k.value for k in node.keywords if k.arg == "Loader"] + node.args[1:2]
            if not loaders or _dotted(loaders[0], names) not in SAFE_LOADERS:
                found.append(f"{filename}:{node.lineno}: {called}() without SafeLoader")
    return found


def shell_use(source: str, filename: str = "<snippet>") -> list[str]:
    """Commands run through a shell: "<file>:<line>: <what>". Any call passing `shell=`
    something other than False counts, whatever the callee."""
    tree = ast.parse(source, filename)
    names = _import_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = _dotted(node.func, names)
        if called in SHELL_CALLS:
            found.append(f"{filename}:{node.lineno}: {called}()")
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg == "shell" and not (
                isinstance(value, ast.Constant) and value.value is False
            ):
                found.append(f"{filename}:{node.lineno}: {called or 'a call'}(shell=...)")
    return found


def scan(
    folders: Iterable[Path], check: Callable[[str, str], list[str]], base: Path = REPO
) -> list[str]:
    """`check` over every .py file under `folders`, each named relative to `base`.

    Hidden folders (a benchmark's own virtualenv, `bench/.peer-venv`) hold other projects' code.
    """
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            inside = path.relative_to(folder).parts
            if "__pycache__" not in inside and not any(p.startswith(".") for p in inside):
                found += check(path.read_text(encoding="utf-8"), str(path.relative_to(base)))
    return found


def test_the_product_reads_yaml_only_with_safe_loading():
    folders = [REPO / name for name in SCANNED]
    assert all(folder.is_dir() for folder in folders)
    assert scan(folders, unsafe_yaml) == []


def test_the_product_runs_no_command_through_a_shell():
    assert scan([REPO / name for name in SCANNED], shell_use) == []


@pytest.mark.fault("unsafe YAML loading planted in source")
@pytest.mark.parametrize(
    "snippet",
    [
        "import yaml\nyaml.load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.Loader)",
        "import yaml\nyaml.load(text, yaml.FullLoader)",
        "import yaml\nyaml.load_all(text, Loader=yaml.UnsafeLoader)",
        "import yaml as y\ny.unsafe_load(text)",
        "import yaml\nyaml.full_load(text)",
        "from yaml import full_load_all\nfull_load_all(text)",
        "from yaml import load, CLoader\nload(text, Loader=CLoader)",
        "import yaml\nloader = yaml.Loader\nyaml.add_constructor('!x', f, Loader=loader)",
    ],
)
def test_the_yaml_check_catches_planted_unsafe_loading(snippet, tmp_path):
    assert unsafe_yaml(snippet)
    planted = tmp_path / "pkg" / "sub" / "reader.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(snippet)
    assert scan([tmp_path], unsafe_yaml, base=tmp_path)[0].startswith("pkg/sub/reader.py:")


@pytest.mark.parametrize(
    "snippet",
    [
        "import yaml\nyaml.safe_load(text)\nlist(yaml.safe_load_all(text))",
        "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)",
        "from yaml import load, CSafeLoader\nload(text, CSafeLoader)",
        "import json\njson.load(f)",
    ],
)
def test_the_yaml_check_lets_safe_loading_pass(snippet):
    assert unsafe_yaml(snippet) == []


@pytest.mark.fault("a command run through a shell planted in source")
@pytest.mark.parametrize(
    "snippet",
    [
        "import subprocess\nsubprocess.run(f'ls {path}', shell=True)",
        "import subprocess as sp\nsp.Popen(cmd, shell=1)",
        "from subprocess import check_output\ncheck_output(cmd, shell=use_shell)",
        "import os\nos.system('make ' + target)",
        "import os\nos.popen(cmd).read()",
        "import asyncio\nasyncio.create_subprocess_shell(cmd)",
        "from subprocess import getoutput\ngetoutput(cmd)",
        "import runner\nrunner.call(cmd, shell=True)",
    ],
)
def test_the_shell_check_catches_a_planted_shell(snippet, tmp_path):
    assert shell_use(snippet)
    planted = tmp_path / "pkg" / "tool.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(snippet)
    assert scan([tmp_path], shell_use, base=tmp_path)[0].startswith("pkg/tool.py:")


def test_the_shell_check_lets_an_argument_list_pass():
    snippet = (
        "import subprocess\nsubprocess.run(['git', 'rev-parse', 'HEAD'], check=True)\n"
        "subprocess.Popen(cmd, shell=False)\n"
    )
    assert shell_use(snippet) == []


# ---- 3. the Makefile quotes what users set ---------------------------------------------------

# Variables a user sets (`?=`) that are not single values: ARGS is extra `gptpipe` options, shell
# words by design (`make run ARGS="--set train.train_steps=100"`), and PYTHON is the command
# that runs Python; quoting either would stop it working and protect nothing from whoever typed it.
SHELL_WORDS_BY_DESIGN = {"ARGS", "PYTHON"}
_QUOTED = re.compile(r"\$\(call q,\$\((\w+)\)\)")  # $(call q,$(VAR)): one shell word
# $(if $(VAR),...): make tests VAR, the shell never sees it
_TESTED = re.compile(r"\$\(if \$\((\w+)\),")
_SPLIT = re.compile(r"\$\(foreach (\w+),\$\((\w+)\),")  # each word of VAR, quoted inside
_REFERENCE = re.compile(r"\$\((\w+)\)")


@dataclass(frozen=True)
class Makefile:
    """What the quoting check reads of a Makefile."""

    variables: dict[str, str]  # name -> definition
    user_set: frozenset[str]  # assigned with ?=: the environment or the command line sets them
    recipes: dict[str, list[str]]  # target -> recipe lines (continuations joined)
    prerequisites: dict[str, list[str]]  # target -> its prerequisites, order-only ones too


def parse_makefile(text: str) -> Makefile:
    """The variables, targets and recipes of a Makefile (the subset this Makefile uses)."""
    text = re.sub(r"\\\n\s*", " ", text)
    variables: dict[str, str] = {}
    user_set = set()
    recipes: dict[str, list[str]] = {}
    prerequisites: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("\t"):
            for target in current:
                recipes.setdefault(target, []).append(line.strip())
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assignment = re.match(r"^([A-Za-z_]\w*)\s*(\?=|:=|::=|\+=|=)\s*(.*)$", line)
        if assignment:
            name, op, value = assignment.groups()
            variables[name] = value
            if op == "?=":
                user_set.add(name)
            current = []
            continue
        rule = re.match(r"^([^:#=]+):(?!=)\s*([^;#]*)", line)
        if rule:
            current = rule[1].split()
            for target in current:
                prerequisites[target] = rule[2].replace("|", " ").split()
    return Makefile(variables, frozenset(user_set), recipes, prerequisites)


def unquoted(makefile: Makefile, target: str) -> list[str]:
    """User-set variables that reach the shell unquoted in `target`'s recipe or the recipes of
    its prerequisites (and in the variables those recipes use): "target: $(VAR) in <line>"."""
    found: list[str] = []
    targets, seen = [target], set()
    while targets:
        name = targets.pop()
        if name in seen:
            continue
        seen.add(name)
        targets += [p for p in makefile.prerequisites.get(name, []) if p in makefile.recipes]
        for line in makefile.recipes.get(name, []):
            found += [f"{name}: $({var}) in {line!r}" for var in _unquoted_in(makefile, line)]
    return found


def _unquoted_in(
    makefile: Makefile, text: str, expanded: frozenset[str] = frozenset()
) -> list[str]:
    text = _SPLIT.sub(r"$(foreach \1,,", _TESTED.sub("$(if ,", _QUOTED.sub("", text)))
    found = []
    for name in _REFERENCE.findall(text):
        if name in makefile.user_set and name not in SHELL_WORDS_BY_DESIGN:
            found.append(name)
        elif name in makefile.variables and name not in expanded:
            found += _unquoted_in(makefile, makefile.variables[name], expanded | {name})
    return found


@pytest.mark.parametrize(
    "target",
    [
        "upload",
        "submit",
        "schedule",
        "compile",
        "run",
        "test",
        "test-fast",
        "lint",
        "bench",
        "pin-base-images",
        "clean",
        "images",
        "help",
    ],
)
def test_every_variable_a_user_sets_reaches_the_shell_quoted(target):
    makefile = parse_makefile(MAKEFILE.read_text())
    assert target in makefile.recipes
    assert unquoted(makefile, target) == []


@pytest.mark.fault("an unquoted user variable planted in a Makefile")
def test_the_makefile_check_catches_an_unquoted_variable():
    planted = parse_makefile(
        "q = '$(subst ','\\'',$(1))'\n"
        "HOST ?=\nNAME ?=\nWORDS ?=\n"
        "CONN = $(if $(HOST),--host $(HOST))\n"
        "build:\n\ttool build --name $(call q,$(NAME))\n"
        "deploy: build\n\ttool deploy $(CONN) \\\n\t\t$(foreach w,$(WORDS),--w $(call q,$(w)))\n"
    )
    assert unquoted(planted, "build") == []
    assert [found.split(" in ")[0] for found in unquoted(planted, "deploy")] == ["deploy: $(HOST)"]


HOSTILE = {
    "KFP_HOST": "http://kfp:8888 && touch {pwned}/host",
    "TOKEN_FILE": "{tmp}/a token's file",
    "KFP_NAMESPACE": "team-a;touch {pwned}/namespace",
    "PIPELINE_ROOT": "gs://bucket/root'; touch {pwned}/root; echo '",
    "LOCK": "{tmp}/lock `touch {pwned}/lock`.json",
    "PIPELINE_YAML": '{tmp}/out put"s.yaml',
    "CONFIG": "tiny' | touch {pwned}/config #",
    "VERSION": "git-1'; touch {pwned}/version; echo '",
    "EXPERIMENT": "exp > {pwned}/experiment",
    "RUN_NAME": 'smoke "run" `touch {pwned}/run_name`',
    "POLL": "0;touch {pwned}/poll",
    "SCHEDULE_NAME": "weekly' && touch {pwned}/schedule '",
    "CRON": "0 0 2 * * 0",
}


@pytest.mark.fault("shell metacharacters in every variable the release targets read")
def test_make_upload_submit_and_schedule_pass_hostile_values_as_single_words(tmp_path):
    pwned = tmp_path / "pwned"
    pwned.mkdir()
    values = {k: v.format(pwned=pwned, tmp=tmp_path) for k, v in HOSTILE.items()}
    params = ["corpus=gs://b/c;touch", "serving_dir=gs://b/s|x"]
    bin_dir, record = tmp_path / "bin", tmp_path / "argv.jsonl"
    bin_dir.mkdir()
    stub = bin_dir / "gptpipe"  # stands for the installed CLI: records its arguments
    stub.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env |= values | {"PARAMS": " ".join(params), "REVISION": "unknown"}  # REVISION: no git
    for target in ("upload", "submit", "schedule"):
        done = subprocess.run(
            ["make", "--no-print-directory", "-f", str(MAKEFILE), "-o", ".venv/.installed"]
            + [target, f"BIN={bin_dir}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert [c[:2] for c in calls] == [
        ["compile", "--output"],
        ["kfp", "upload"],
        ["kfp", "run"],
        ["kfp", "schedule"],
    ]
    assert list(pwned.iterdir()) == []

    def after(call: list[str], option: str) -> list[str]:
        return [call[i + 1] for i, word in enumerate(call) if word == option]

    compile_, upload, submit, schedule = calls
    assert after(compile_, "--pipeline-root") == [values["PIPELINE_ROOT"]]
    assert after(compile_, "--lock") == [values["LOCK"]]
    assert after(compile_, "--config") == [values["CONFIG"]]
    assert after(upload, "--file") == [values["PIPELINE_YAML"]]
    for call in (upload, submit, schedule):
        assert after(call, "--host") == [values["KFP_HOST"]]
        assert after(call, "--token-file") == [values["TOKEN_FILE"]]
        assert after(call, "--namespace") == [values["KFP_NAMESPACE"]]
    assert after(upload, "--version") == after(submit, "--version") == [values["VERSION"]]
    assert after(submit, "--run-name") == [values["RUN_NAME"]]
    assert after(submit, "--poll") == [values["POLL"]]
    for call in (submit, schedule):
        assert after(call, "--param") == params
        assert after(call, "--experiment") == [values["EXPERIMENT"]]
    assert after(schedule, "--name") == [values["SCHEDULE_NAME"]]
    assert after(schedule, "--cron") == [values["CRON"]]


# ---- 4. non-root images and pods ------------------------------------------------------------


def dockerfile_user_problems(text: str) -> list[str]:
    """Why the final stage of a Dockerfile would not run as a numeric non-root user."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in images_build.instructions(text):
        if keyword == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append((keyword, rest))
    if not stages:
        return ["no FROM"]
    users = [rest.split()[0] for keyword, rest in stages[-1] if keyword == "USER"]
    if not users:
        return ["the final stage sets no USER: it runs as the base image's user (often root)"]
    uid, _, gid = users[-1].partition(":")
    problems = []
    if not uid.isdigit():
        problems.append(f"USER {users[-1]}: not numeric, so the kubelet cannot check runAsNonRoot")
    elif int(uid) == 0:
        problems.append(f"USER {users[-1]}: root")
    if gid and not gid.isdigit():
        problems.append(f"USER {users[-1]}: the group is not numeric")
    return problems


def test_the_image_runs_as_the_numeric_non_root_user_the_worker_pods_name():
    text = DOCKERFILE.read_text()
    assert dockerfile_user_problems(text) == []
    users = [rest for keyword, rest in images_build.instructions(text) if keyword == "USER"]
    # The TFJob workers' runAsUser is the image's user, so the files it owns stay its own.
    assert users[-1].split(":")[0] == str(tfjob_manifest.TRAINER_UID)


@pytest.mark.fault("a Dockerfile whose final stage runs as root")
@pytest.mark.parametrize(
    "dockerfile, problem",
    [
        ("FROM python:3.11-slim\nRUN pip install .\n", "sets no USER"),
        ("FROM python:3.11-slim\nUSER root\n", "not numeric"),
        ("FROM python:3.11-slim\nUSER gptpipe\n", "not numeric"),
        ("FROM python:3.11-slim\nUSER 0:0\n", "root"),
        ("FROM python:3.11-slim\nUSER 1000:1000\nRUN x\nUSER 0\n", "root"),
        ("FROM a AS build\nUSER 1000\nFROM b\nCOPY --from=build /x /x\n", "sets no USER"),
        ("FROM python:3.11-slim\nUSER 1000:staff\n", "group is not numeric"),
    ],
)
def test_the_dockerfile_check_catches_a_root_final_stage(dockerfile, problem):
    problems = dockerfile_user_problems(dockerfile)
    assert problems and problem in problems[0], problems


def test_the_dockerfile_check_reads_only_the_final_stage():
    assert dockerfile_user_problems("FROM a AS b\nUSER 0\nFROM c\nUSER 1000:1000\n") == []


def check_worker_pod(template: Mapping[str, Any]) -> list[str]:
    """A TFJob worker pod template against restricted Pod Security, with the fields named."""
    pod = template["spec"]
    found = restricted_violations(dict(pod), (template.get("metadata") or {}).get("annotations"))
    pod_sc = pod.get("securityContext") or {}
    if pod_sc.get("runAsNonRoot") is not True:
        found.append("pod: runAsNonRoot is not true")
    if not isinstance(pod_sc.get("runAsUser"), int) or pod_sc["runAsUser"] == 0:
        found.append(f"pod: runAsUser {pod_sc.get('runAsUser')!r} is not a non-zero uid")
    for container in pod["containers"]:
        sc = container.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{container['name']}: allowPrivilegeEscalation is not false")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            found.append(f"{container['name']}: capabilities are not dropped")
    return found


def test_the_tfjob_manifest_gptpipe_prints_has_restricted_worker_pods(capsys):
    assert cli.main(["tfjob-manifest", "--image", TRAINER_IMAGE, "--workers", "3"]) == 0
    template = worker_template(yaml.safe_load(capsys.readouterr().out))
    assert check_worker_pod(template) == []


@pytest.mark.fault("a worker pod template with root, escalation and kept capabilities")
def test_the_worker_pod_check_catches_a_root_pod():
    template = worker_template(tfjob_manifest.build_manifest(make_spec()))
    template["spec"]["securityContext"].update(runAsUser=0, runAsNonRoot=False)
    template["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": True}
    found = " ".join(check_worker_pod(template))
    for what in ("runAsNonRoot", "runAsUser 0", "allowPrivilegeEscalation", "capabilities"):
        assert what in found


def test_the_tfjob_workers_get_no_kubernetes_api_token():
    pod = worker_template(tfjob_manifest.build_manifest(make_spec()))["spec"]
    assert pod.get("automountServiceAccountToken") is False


# KFP 2.5 builds the step pods; the compiled YAML can only ask for more through the kubernetes
# platform spec. It asks for the run id and namespace (downward API) and pull secrets, nothing
# that loosens a pod (tests/pipelines/test_step_pod_security.py checks the pod KFP builds from it).
STEP_POD_FIELDS = {"fieldPathAsEnv", "imagePullSecret"}


def test_the_compiled_step_pods_ask_for_nothing_beyond_env_and_pull_secrets(tmp_path):
    target = Target(compiler.load_images(LOCK), "gs://b/root", image_pull_secrets=("regcred",))
    path = compiler.compile_pipeline(tmp_path / "p.yaml", target, resolve_config("tiny"))
    _, platform = yaml.safe_load_all(path.read_text())
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors
    for name, asked in executors.items():
        assert set(asked) <= STEP_POD_FIELDS, name
        assert [s["secretName"] for s in asked["imagePullSecret"]] == ["regcred"], name


# ---- 5. the launcher's Role: exactly what the launcher uses ---------------------------------

Triple = tuple[str, str, str]  # (apiGroup, resource, verb)
RUN = "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"  # make_spec()'s run id


def rbac_triple(method: str, path: str, query: Mapping[str, str]) -> Triple:
    """The (apiGroup, resource, verb) RBAC checks for one request (the apiserver's
    RequestInfoFactory: a GET of a collection is list, or watch with ?watch=true)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]
        group, rest = "", parts[2:]
    else:  # /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]
        group, rest = parts[1], parts[3:]
    assert rest[0] == "namespaces", f"a cluster-scoped request: {path}"
    resource, named = rest[2], len(rest) > 3
    if len(rest) > 4:
        resource = f"{resource}/{rest[4]}"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method in verbs:
        verb = verbs[method]
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    elif named:
        verb = "get"
    else:
        verb = "watch" if (query.get("watch") or "").lower() in ("true", "1") else "list"
    return group, resource, verb


@dataclass
class LauncherUse:
    """What the launcher's paths did to the Kubernetes double."""

    used: dict[Triple, set[str]] = field(default_factory=dict)  # triple -> paths that used it
    bodies: dict[str, bytes] = field(default_factory=dict)  # every request body, by request
    submitted: list[dict[str, Any]] = field(default_factory=list)  # the TFJobs POSTed
    planted: Planted | None = None

    def record(self, kube: FakeKube, path_name: str) -> None:
        for i, request in enumerate(kube.requests):
            triple = rbac_triple(request.method, request.path, request.query)
            self.used.setdefault(triple, set()).add(path_name)
            body = json.dumps(request.body).encode() if request.body is not None else b""
            where = f"{path_name} request {i} {request.method} {request.path}"
            self.bodies[where] = body + json.dumps(request.query).encode()
            if request.method == "POST":
                self.submitted.append(request.body)


def _launch(kube: FakeKube, expect: type[Exception] | None = None, **kwargs: Any) -> str:
    spec = kwargs.pop("spec", None) or make_spec()
    out = io.StringIO()
    launcher = tfjob.TFJobLauncher(kube.api_client(), out=out, poll_seconds=5)
    if expect is None:
        launcher.run(spec, **kwargs)
    else:
        with pytest.raises(expect):
            launcher.run(spec, **kwargs)
    return out.getvalue()


def _failed_earlier(kube: FakeKube) -> None:
    with kube.cluster.cond:
        job = kube.cluster.tfjobs[("ml", "train-run-1")]
        job["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "x"}]}


def _the_step_reads_its_own_pod(kube: FakeKube) -> None:
    kube.cluster.add_pod(
        "ml",
        "run-train-pod",
        {"main": (TRAINER_IMAGE, TRAINER_IMAGE)},
        service_account="pipeline-runner",
        image_pull_secrets=("regcred",),
    )
    identity = kube_api.PodIdentity("run-train-pod", "uid-1", "ml")
    assert executor.cluster_placement(identity, api_client=kube.api_client())["owner"]
    env = {
        kube_api.POD_NAME_ENV: "run-train-pod",
        kube_api.POD_NAMESPACE_ENV: "ml",
        provenance.CODE_VERSION_ENV: "c0ffee",
    }
    found = provenance.detect(TRAINER_IMAGE, env, api_client=kube.api_client())
    assert found.properties()["image_digest_observed"]


def _release_deletes_the_runs_jobs(kube: FakeKube) -> None:
    with kube.cluster.cond:
        kube.cluster.add_job(tfjob_manifest.build_manifest(make_spec(name="train-running")))
    assert cleanup.delete_run_jobs(kube.api_client(), "ml", RUN) == ["train-running"]


FAKE_PART = REPO / "tests" / "doubles" / "kubernetes" / "fake_part.py"


def _indexed_spec(root: Path, mode: str) -> IndexedJobSpec:
    """Two parts of `mode` (tests/doubles/kubernetes/fake_part.py), recording under `root`."""
    records = root / "records"
    records.mkdir(parents=True, exist_ok=True)
    return IndexedJobSpec(
        name="parts-run-1",
        command=[sys.executable, str(FAKE_PART), mode, str(records)],
        completions=2,
        parallelism=2,
        image=TRAINER_IMAGE,
        namespace="ml",
        run_id=RUN,
        env={"FAKE_PARTS": "2"},
    )


def _run_indexed(
    kube: FakeKube, root: Path, mode: str, expect: type[Exception] | None = None, **kwargs: Any
) -> None:
    launcher = IndexedJobLauncher(kube.api_client(), out=io.StringIO(), poll_seconds=5)
    if expect is None:
        launcher.run(_indexed_spec(root, mode), **kwargs)
    else:
        with pytest.raises(expect):
            launcher.run(_indexed_spec(root, mode), **kwargs)


def _release_deletes_the_runs_indexed_jobs(kube: FakeKube, root: Path) -> None:
    body = indexed_manifest.build_manifest(_indexed_spec(root, "ok"))
    with kube.cluster.cond:
        kube.cluster.add_job(body, resource="jobs", prepare=batch_api.prepare)
    assert indexed_cleanup.delete_run_jobs(kube.api_client(), "ml", RUN) == ["parts-run-1"]


def _each_indexed_path(root: Path) -> Iterator[tuple[str, FakeKube, Any]]:
    """The Indexed Job launcher's paths (components/jobs/indexed), on the Job controller."""

    def running(name: str) -> FakeKube:
        env = {"PATH": os.environ["PATH"]}
        return FakeKube.running(root / name, env, grace_seconds=2, pod_failure_backoff=0.05)

    yield (
        "an Indexed Job: create, watch, its pods' digests",
        running("ok"),
        lambda k: _run_indexed(k, root / "ok", "ok"),
    )
    yield (
        "a part's bad input: its pod's termination message and log",
        running("bad"),
        lambda k: _run_indexed(k, root / "bad", "bad-0", WorkerInputError),
    )
    yield (
        "the launcher's timeout deletes the Indexed Job",
        running("hang"),
        lambda k: _run_indexed(k, root / "hang", "hang", LaunchTimeout, timeout_seconds=1),
    )

    def reattach(kube: FakeKube) -> None:
        body = indexed_manifest.build_manifest(_indexed_spec(root / "again", "ok"))
        with kube.cluster.cond:
            kube.cluster.add_job(body, resource="jobs", prepare=batch_api.prepare)
        _run_indexed(kube, root / "again", "ok")

    yield (
        "a retried launcher re-attaches to its Indexed Job (409, then get)",
        running("again"),
        (reattach),
    )
    yield (
        "the release exit handler deletes the run's Indexed Jobs",
        FakeKube(),
        lambda k: _release_deletes_the_runs_indexed_jobs(k, root / "release"),
    )


def _each_launcher_path(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> Iterator[tuple[str, FakeKube, Any]]:
    """(what the launcher does, a double, doing it): every path of components/train and
    components/jobs/indexed that talks to the Kubernetes API."""
    existing = tfjob_manifest.build_manifest(make_spec())
    yield "create, watch, stream worker 0's log", FakeKube(scenarios.success()), _launch
    yield (
        "a failed job: the failing worker's last log lines",
        FakeKube(scenarios.failure()),
        lambda k: _launch(k, LaunchError),
    )
    yield "restarts recorded on the job", FakeKube(scenarios.restart_then_success()), _launch
    yield (
        "restarts past backoff_limit delete the job",
        FakeKube(scenarios.restart_then_success(times=3)),
        lambda k: _launch(k, LaunchError, spec=make_spec(backoff_limit=1)),
    )
    yield (
        "a permanent exit while Restarting: the worker's log tail, then delete",
        FakeKube(
            [
                *scenarios.hang(),
                lambda c: c.log(1, "ValueError: bad shard"),
                lambda c: c.exit(1, 2),
                lambda c: c.condition("Restarting"),
            ]
        ),
        lambda k: _launch(k, LaunchError),
    )
    yield (
        "the launcher's timeout deletes the job",
        FakeKube(scenarios.hang()),
        lambda k: _launch(k, LaunchTimeout, timeout_seconds=1),
    )
    yield (
        "SIGTERM (a cancelled run) deletes the job",
        FakeKube(scenarios.cancel()),
        lambda k: _launch(k, LaunchCancelled),
    )
    yield (
        "a retried launcher re-attaches (409, then get)",
        FakeKube(scenarios.success(), existing=existing),
        _launch,
    )
    yield (
        "a retried launcher deletes a Failed job, waits for it to go, creates it again",
        FakeKube(existing=existing),
        lambda k: (_failed_earlier(k), _launch(k, LaunchTimeout, timeout_seconds=1)),
    )

    def outage(kube: FakeKube) -> None:
        monkeypatch.setattr(tfjob.time, "sleep", lambda seconds: None)
        kube.unavailable = 3
        _launch(kube)

    yield "a transient apiserver outage: the job read again", FakeKube(scenarios.success()), outage
    yield (
        "the step reads its own pod (placement, provenance)",
        FakeKube(),
        _the_step_reads_its_own_pod,
    )
    yield (
        "the release exit handler deletes the run's jobs",
        FakeKube(),
        _release_deletes_the_runs_jobs,
    )
    yield from _each_indexed_path(root)


@pytest.fixture(scope="module")
def launcher_use(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LauncherUse]:
    """Every Kubernetes request of every launcher path, with credentials in the environment."""
    use = LauncherUse()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.MonkeyPatch.context() as monkeypatch:
        use.planted = plant(monkeypatch, tmp_path_factory.mktemp("creds"))
        root = tmp_path_factory.mktemp("launchers")
        for name, kube, act in _each_launcher_path(monkeypatch, root):
            with kube:
                act(kube)
            use.record(kube, name)
    assert signal.getsignal(signal.SIGTERM) is before
    yield use


def role_grants(role: Mapping[str, Any]) -> set[Triple]:
    """Every (apiGroup, resource, verb) a Role's rules grant; a wildcard is refused."""
    granted = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"a wildcard grants anything: {rule}"
                    granted.add((group, resource, verb))
    return granted


def role_gaps(granted: set[Triple], used: Mapping[Triple, set[str]]) -> dict[str, list[Any]]:
    """What the Role grants that nothing uses, and what is used but not granted."""
    return {
        "granted, never used": sorted(granted - set(used)),
        "used, not granted": sorted((t, sorted(used[t])) for t in set(used) - granted),
    }


def load_rbac() -> tuple[dict[str, Any], dict[str, Any]]:
    role, binding = list(yaml.safe_load_all(RBAC.read_text()))
    return role, binding


@pytest.mark.slow
def test_the_launchers_role_grants_exactly_what_the_launcher_uses(launcher_use):
    role, binding = load_rbac()
    # Namespaced: the launcher never needs a ClusterRole's reach into other namespaces.
    assert (role["kind"], binding["roleRef"]["kind"]) == ("Role", "Role")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    gaps = role_gaps(role_grants(role), launcher_use.used)
    assert gaps == {"granted, never used": [], "used, not granted": []}


@pytest.mark.fault("a Role with a rule the launcher never uses, and one missing a verb it uses")
@pytest.mark.slow
def test_the_role_check_catches_an_extra_and_a_missing_grant(launcher_use):
    role, _ = load_rbac()
    role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    for rule in role["rules"]:
        if rule["resources"] == ["tfjobs"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "patch"]
    gaps = role_gaps(role_grants(role), launcher_use.used)
    assert gaps["granted, never used"] == [("", "secrets", "get")]
    assert [t for t, _ in gaps["used, not granted"]] == [("kubeflow.org", "tfjobs", "patch")]
    with pytest.raises(AssertionError, match="wildcard"):
        role_grants({"rules": [{"apiGroups": ["*"], "resources": ["tfjobs"], "verbs": ["get"]}]})


def test_requests_map_to_the_verbs_rbac_checks():
    tfjobs = "/apis/kubeflow.org/v1/namespaces/ml/tfjobs"
    assert rbac_triple("GET", tfjobs, {"watch": "true"}) == ("kubeflow.org", "tfjobs", "watch")
    assert rbac_triple("GET", tfjobs, {"labelSelector": "a=b"})[2] == "list"
    assert rbac_triple("GET", f"{tfjobs}/j", {})[2] == "get"
    assert rbac_triple("DELETE", f"{tfjobs}/j", {})[2] == "delete"
    assert rbac_triple("DELETE", tfjobs, {})[2] == "deletecollection"
    assert rbac_triple("GET", "/api/v1/namespaces/ml/pods/p/log", {}) == ("", "pods/log", "get")


@pytest.mark.fault("credentials in the launcher's environment")
@pytest.mark.slow
def test_the_launcher_sends_no_credential_and_submits_restricted_worker_pods(launcher_use):
    assert launcher_use.planted is not None
    assert launcher_use.submitted and launcher_use.bodies
    assert find_secret(launcher_use.planted.secret, (), launcher_use.bodies) == []
    for manifest in launcher_use.submitted:
        indexed = manifest["kind"] == indexed_manifest.KIND
        template = manifest["spec"]["template"] if indexed else worker_template(manifest)
        assert check_worker_pod(template) == []
