"""Benchmark scripts; run each from the repository root as `python -m bench.NAME`.

`lib/` holds what they share; every other module is a script that imports only that library and
the project's packages (tests/bench/test_imports.py). The experiments that train models to test a
claim are the `experiments` package.
"""
