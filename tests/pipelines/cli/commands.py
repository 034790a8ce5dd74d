"""Run one `gptpipe` subcommand in-process, through only the parser its module adds, as
`gptpipe` runs it: for tests of command modules that need nothing else of the CLI."""

import argparse
from collections.abc import Callable
from typing import Any

import pytest

AddParser = Callable[[Any], None]  # a command module's `add_parser(subparsers)`


def run(add_parser: AddParser, argv: list[str]) -> int:
    """The command's exit status; a UserError propagates (cli.main would print it)."""
    parser = argparse.ArgumentParser(prog="gptpipe")
    add_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def output(capsys: pytest.CaptureFixture[str], add_parser: AddParser, argv: list[str]) -> str:
    """What a successful command printed on stdout."""
    capsys.readouterr()
    assert run(add_parser, argv) == 0
    return capsys.readouterr().out
