"""Benchmark scripts; run each from the repository root as `python -m bench.NAME`."""
