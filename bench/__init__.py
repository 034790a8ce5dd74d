"""Benchmarks: `bench/<name>_bench.py` modules with `TIER` and `figures(full)`; `python -m bench`
runs them, writes bench/results.json and prints the table (bench/__main__.py)."""
