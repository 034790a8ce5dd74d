"""`gptpipe serve`, and `gptpipe generate`/`score --endpoint` as its clients.

The clients against a server of the session's tiny model give what the in-process commands
give: the same continuation for a seed, the same scores to the last bit. `gptpipe serve` runs
once as a process: it prints its line, answers, and ends cleanly on Ctrl-C. The rest are the
one-line errors of both commands' options.
"""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from components import serving
from contracts.artifacts import SERVING_DIR
from contracts.errors import UserError
from pipelines.cli import model as model_cmd
from pipelines.cli import serve as serve_cmd
from tests.pipelines.cli import commands
from tests.processes import REPO

PROMPT = "ROMEO:"
CAP = 32  # the test server's --max-new-tokens-cap
DEADLINE_S = 300.0  # the longest `gptpipe serve` may take to start on a loaded machine


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_model):
    path = tmp_path_factory.mktemp("cli-serve") / "serving" / "gpt"
    path.mkdir(parents=True)
    serving.publish_next(str(tiny_model / SERVING_DIR), str(path))
    return path


@pytest.fixture(scope="module")
def endpoint(folder):
    from server import app
    from server.guards import Limits

    settings = app.Settings(str(folder), "gpt", port=0, limits=Limits(max_new_tokens=CAP))
    with app.running(settings) as running:
        yield running.url.removesuffix("/v1/models/gpt")


def output(capsys, argv):
    return commands.output(capsys, model_cmd.add_parser, argv)


def generate_argv(*where: str) -> list[str]:
    return ["generate", *where, "--max-new-tokens", "12", "--seed", "7", PROMPT]


# ---- the clients --------------------------------------------------------------------------


@pytest.mark.slow
def test_generate_through_the_endpoint_is_the_in_process_continuation(folder, endpoint, capsys):
    in_process = output(capsys, generate_argv("--model", str(folder)))
    assert in_process.strip()
    assert output(capsys, generate_argv("--endpoint", endpoint)) == in_process
    pinned = f"{endpoint}/v1/models/gpt/versions/1"
    assert output(capsys, generate_argv("--endpoint", pinned)) == in_process
    through = ["--through-eos", "--seed", "3", "--max-new-tokens", "12", PROMPT]
    served = output(capsys, ["generate", "--endpoint", endpoint, *through])
    assert served == output(capsys, ["generate", "--model", str(folder), *through])


@pytest.mark.slow
def test_score_through_the_endpoint_is_the_in_process_score_to_the_last_bit(
    folder, endpoint, capsys, tmp_path
):
    text = tmp_path / "text.txt"  # several batches of evaluate's chunks: several requests
    text.write_text((REPO / "data" / "tinyshakespeare.txt").read_text()[:40_000], "utf-8")
    local = json.loads(output(capsys, ["score", "--model", str(folder), "--json", str(text)]))
    served = json.loads(output(capsys, ["score", "--endpoint", endpoint, "--json", str(text)]))
    assert served.pop("model") == f"{endpoint}/v1/models/gpt/versions/1"
    assert local.pop("model") == str(folder / "1")
    assert served == local


@pytest.mark.slow
@pytest.mark.bad_input("a request the server refuses, through the CLI")
def test_the_servers_refusal_is_one_user_error_naming_the_url(endpoint):
    argv = ["generate", "--endpoint", endpoint, "--max-new-tokens", str(CAP + 1), PROMPT]
    with pytest.raises(UserError) as caught:
        commands.run(model_cmd.add_parser, argv)
    assert str(caught.value) == (
        f"{endpoint}/v1/models/gpt:predict answered HTTP 400: max_new_tokens is {CAP + 1}: this "
        f"server generates 0 to {CAP} tokens a request (gptpipe serve --max-new-tokens-cap)"
    )
    with pytest.raises(
        UserError, match=r"answered HTTP 404: Servable not found for request: Latest\(other\)"
    ):
        commands.run(
            model_cmd.add_parser, ["score", "--endpoint", endpoint, "--name", "other", __file__]
        )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["generate", "--model", "x", "--endpoint", "http://h:1", "p"], "pass one"),
        (["generate", "--name", "gpt", "p"], "--name names the model at --endpoint"),
        (["score", "--endpoint", "localhost:8501", __file__], "pass an http:// URL"),
    ],
    ids=["--model and --endpoint", "--name alone", "no scheme"],
)
@pytest.mark.bad_input("--endpoint options that contradict each other")
def test_endpoint_options_are_checked(argv, says):
    with pytest.raises(UserError, match=says):
        commands.run(model_cmd.add_parser, argv)


# ---- gptpipe serve ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--poll-seconds", "0"], "--poll-seconds 0.0: pass a number above 0"),
        (["--port", "70000"], "--port 70000: pass 0 to 65535"),
        (["--name", "a/b"], "--name 'a/b': pass a name without"),
        (["--max-body-bytes", "0"], "--max-body-bytes 0: pass 1 or more"),
    ],
    ids=["--poll-seconds", "--port", "--name", "--max-body-bytes"],
)
@pytest.mark.bad_input("a gptpipe serve option out of range")
def test_serve_options_are_checked(folder, extra, says):
    with pytest.raises(UserError, match=re.escape(says)):
        commands.run(serve_cmd.add_parser, ["serve", "--model", str(folder), *extra])


@pytest.mark.bad_input("gptpipe serve on a missing folder or on a SavedModel folder")
def test_serve_needs_a_serving_folder(folder, tmp_path):
    with pytest.raises(UserError, match="no serving folder at"):
        commands.run(serve_cmd.add_parser, ["serve", "--model", str(tmp_path / "nope")])
    with pytest.raises(UserError, match="is a SavedModel folder; serve takes the serving folder"):
        commands.run(serve_cmd.add_parser, ["serve", "--model", str(folder / "1")])


SERVE = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the test runner ignores
from pipelines.cli.main import main
sys.exit(main())
"""


@pytest.mark.slow
def test_gptpipe_serve_answers_then_ends_cleanly_on_ctrl_c(folder):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", SERVE, "serve", "--model", str(folder), "--port", "0"]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        line = lines.get(timeout=DEADLINE_S)  # its one line, once it answers
        match = re.fullmatch(r"gptpipe serve: serving gpt \(version 1\) at (\S+) \(.*\)\n", line)
        assert match, line
        url = match.group(1)
        with urllib.request.urlopen(url, timeout=60) as response:
            assert json.load(response)["model_version_status"][0]["state"] == "AVAILABLE"
        body = json.dumps({"signature_name": "score", "inputs": {"text": [PROMPT]}}).encode()
        request = urllib.request.Request(f"{url}:predict", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.load(response)["outputs"]["chars"] == [len(PROMPT)]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and err.rstrip().endswith("gptpipe serve: stopped")
    assert "gptpipe serve: serving version 1 of gpt" in err
