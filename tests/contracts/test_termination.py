"""contracts.termination: the record a worker leaves in its termination-message file."""

from __future__ import annotations

import json

import pytest

from contracts import termination
from contracts.errors import UserError
from contracts.termination import INPUT_ERROR, TerminationMessage


def test_a_record_round_trips_through_the_file(tmp_path):
    said = TerminationMessage(INPUT_ERROR, "examples: folder 'x' not found; pass --examples DIR")
    path = tmp_path / "termination-log"
    termination.write(str(path), said)
    assert json.loads(path.read_text()) == {"kind": "input_error", "message": said.message}
    assert termination.read(str(path)) == said
    assert termination.parse(path.read_text()) == said


def test_a_long_message_is_shortened_to_fit_what_the_kubelet_keeps():
    said = TerminationMessage(INPUT_ERROR, "é" * 10_000)  # 2 bytes each in UTF-8
    data = termination.encode(said)
    assert len(data) <= termination.MAX_MESSAGE_BYTES
    back = termination.parse(data.decode())
    assert back is not None and back.message.endswith("é…")
    assert said.message.startswith(back.message.removesuffix("…"))


def test_the_file_is_read_as_the_kubelet_reads_it_its_end(tmp_path):
    path = tmp_path / "termination-log"
    record = termination.encode(TerminationMessage(INPUT_ERROR, "bad"))
    path.write_bytes(b"x" * 5000 + record)  # what the kubelet keeps is no JSON
    assert termination.read(str(path)) is None
    path.write_bytes(b"x" * 5000)
    path.write_bytes(record)
    assert termination.read(str(path)) == TerminationMessage(INPUT_ERROR, "bad")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "out of cheese",
        "error: examples not found",  # the old log-line protocol means nothing here
        "[1, 2]",
        '{"kind": "input_error"}',  # no message
        '{"kind": "input_error", "message": 7}',
        '{"kind": "coffee", "message": "x"}',
        '{"kind": "input_error", "message": "x", "more": 1}',
    ],
)
def test_anything_but_our_record_is_no_record(text):
    assert termination.parse(text) is None


def test_no_file_is_no_record(tmp_path):
    assert termination.read(str(tmp_path / "missing")) is None


def test_a_record_of_an_unknown_kind_cannot_be_made():
    with pytest.raises(UserError, match="kind 'coffee'"):
        TerminationMessage("coffee", "x")
