"""The pipeline DAG, and the code that compiles it and runs it."""

from contracts.process import hide_python_eol_notice

hide_python_eol_notice()
