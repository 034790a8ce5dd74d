"""The pipeline steps: one package per step, each a thin KFP component over a plain `run()`."""

import os

from contracts.process import hide_python_eol_notice

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
hide_python_eol_notice()
