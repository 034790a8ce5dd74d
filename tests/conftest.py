"""Shared pytest setup: tf-keras before TensorFlow, quiet TF logs, and small fixtures."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/ from the current compiler output instead of comparing",
    )
