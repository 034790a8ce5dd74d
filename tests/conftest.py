"""Shared pytest setup: tf-keras before TensorFlow, quiet TF logs, and small fixtures."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
