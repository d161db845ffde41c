"""pgflow-cli benchmarks: ``python bench/run.py`` (or ``python -m bench``). See bench/README.md."""
