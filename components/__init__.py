"""The pipeline steps: one package per step, each a thin KFP component over a plain `run()`."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
