"""Command-line options several `gptpipe` commands share: the config, parameters, secrets."""

import argparse

from pipelines.config import RunConfig
from trainer.config import Config, resolve_config


def config_options(parser: argparse.ArgumentParser) -> None:
    """--config and --set: the trainer config, resolved once here and passed on resolved."""
    parser.add_argument(
        "--config",
        default=RunConfig().config,
        help=f"trainer preset or YAML file (default {RunConfig().config})",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="trainer config override, repeatable",
    )


def resolved_config(args: argparse.Namespace) -> Config:
    """The one place a command resolves the trainer config from its --config and --set
    (no --config: the default preset)."""
    return resolve_config(args.config or RunConfig().config, args.overrides)


def image_pull_secret_option(parser: argparse.ArgumentParser) -> None:
    """--image-pull-secret: compiled into every step pod (the TFJob workers copy the train's)."""
    parser.add_argument(
        "--image-pull-secret",
        dest="image_pull_secrets",
        action="append",
        default=[],
        metavar="NAME",
        help="a Secret the step pods pull their image with, repeatable",
    )


def param_option(parser: argparse.ArgumentParser, what: str) -> None:
    """--param KEY=VALUE, repeatable: `what` says which keys the command takes."""
    parser.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{what}; repeatable",
    )
