"""The local sandbox: a private PostgreSQL server, the ``pgflow`` database on it, and its sample data.

The operations behind ``pgflow sandbox`` (and the private server the tests and benchmarks start),
in one package:

* :mod:`pgflow_cli.sandbox.local`: :class:`Sandbox`, the server lifecycle plus the database;
* :mod:`pgflow_cli.sandbox.embedded`: :class:`LocalServer`, a private PostgreSQL server on a Unix
  socket (also the test harness's server);
* :mod:`pgflow_cli.sandbox.seeds`: ``--seed NAME`` (import it as ``from pgflow_cli.sandbox import seeds``);
* :mod:`pgflow_cli.sandbox.demo`: the demo flows, the ``demo`` seed and the demo workers (imported on
  demand: it loads the reference worker).

* :mod:`pgflow_cli.sandbox.location`: where the sandbox lives and its connection string, without
  connecting (no psycopg: ``pgflow sandbox dsn`` stays cheap).

What other modules use is re-exported here; the names of :mod:`~pgflow_cli.sandbox.local` (which
imports psycopg and the installer) are loaded when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgflow_cli.sandbox.embedded import FAST_SETTINGS, LocalServer, find_bindir, free_port, validate_base_dir
from pgflow_cli.sandbox.location import DATABASE, default_dir

if TYPE_CHECKING:
    from pgflow_cli.sandbox.local import STAGING_DATABASE, Sandbox, SandboxStatus

_LOCAL = ("STAGING_DATABASE", "Sandbox", "SandboxStatus")


def __getattr__(name: str) -> Any:
    """The names of :mod:`pgflow_cli.sandbox.local`, imported on first use (PEP 562)."""
    if name in _LOCAL:
        from pgflow_cli.sandbox import local

        return getattr(local, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
