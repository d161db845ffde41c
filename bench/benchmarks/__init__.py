"""Benchmark modules: each ``<name>.py`` here defines ``run(ctx) -> list[bench.core.Result]``.

``bench/run.py`` discovers them in name order; see bench/README.md.
"""
