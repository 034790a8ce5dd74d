"""Benchmarks: `bench/<name>_bench.py` modules with `main() -> dict`; `python -m bench` runs all."""
