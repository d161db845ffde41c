"""The local sandbox: a private PostgreSQL server, the ``pgflow`` database on it, and its sample data.

The operations behind ``pgflow sandbox`` (and the private server the tests and benchmarks start),
in one package:

* :mod:`pgflow_cli.sandbox.local`: :class:`Sandbox`, the server lifecycle plus the database;
* :mod:`pgflow_cli.sandbox.embedded`: :class:`LocalServer`, a private PostgreSQL server on a Unix
  socket (also the test harness's server);
* :mod:`pgflow_cli.sandbox.seeds`: ``--seed NAME`` (import it as ``from pgflow_cli.sandbox import seeds``);
* :mod:`pgflow_cli.sandbox.demo`: the demo flows, the ``demo`` seed and the demo workers (imported on
  demand: it loads the reference worker).

What other modules use is re-exported here.
"""

from __future__ import annotations

from pgflow_cli.sandbox.embedded import FAST_SETTINGS, LocalServer, find_bindir, free_port, validate_base_dir
from pgflow_cli.sandbox.local import DATABASE, STAGING_DATABASE, Sandbox, SandboxStatus, default_dir

__all__ = [
    "DATABASE",
    "FAST_SETTINGS",
    "STAGING_DATABASE",
    "LocalServer",
    "Sandbox",
    "SandboxStatus",
    "default_dir",
    "find_bindir",
    "free_port",
    "validate_base_dir",
]
