"""`gptpipe doctor`: will a run work on this cluster (checks.py)."""
