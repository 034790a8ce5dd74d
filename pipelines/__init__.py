"""The pipeline DAG, and the code that compiles it and runs it."""
