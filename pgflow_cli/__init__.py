"""pgflow-cli: operator tooling and authoritative SQL for pgflow on PostgreSQL + PGMQ.

The package is layered (see docs/architecture.md):

* :mod:`pgflow_cli.cli` parses options and renders results;
* :mod:`pgflow_cli.operations` holds audit, migrate and the other operator actions;
* :mod:`pgflow_cli.naming` mirrors the SQL slug and queue-name rules in Python;
* :mod:`pgflow_cli.db` owns connections, transactions, timeouts and retries;
* ``sql/`` (shipped as ``pgflow_cli/sql``) is the authoritative schema.
"""

__version__ = "0.1.0rc1"
