# The pgflow_database fixture: a throwaway database with PGMQ and the pgflow schema per test.
pytest_plugins = ["pgflow_cli.testing.pytest_plugin"]
