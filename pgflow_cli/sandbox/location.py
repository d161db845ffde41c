"""Where the sandbox lives and how to reach it, without connecting: what ``pgflow sandbox dsn`` and
``--sandbox`` need, kept free of psycopg so that printing the connection string stays cheap.

Location of the sandbox directory, first match wins:

1. ``$PGFLOW_SANDBOX_DIR``;
2. as root: ``/var/lib/pgflow-cli/sandbox`` (the server runs as the ``postgres`` user,
   which cannot enter root's home directory);
3. otherwise: the user cache directory, e.g. ``~/.cache/pgflow-cli/sandbox``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pgflow_cli.errors import ConnectionFailed
from pgflow_cli.sandbox.embedded import LocalServer

DATABASE = "pgflow"
"""The sandbox's database."""
ROOT_SANDBOX_DIR = Path("/var/lib/pgflow-cli/sandbox")


def default_dir() -> Path:
    """The sandbox directory by the documented precedence."""
    override = os.environ.get("PGFLOW_SANDBOX_DIR")
    if override:
        return Path(override).expanduser().resolve()
    if os.geteuid() == 0:
        return ROOT_SANDBOX_DIR
    import platformdirs

    return Path(platformdirs.user_cache_dir("pgflow-cli")) / "sandbox"


def running_conninfo(server: LocalServer, directory: Path) -> str:
    """The conninfo of the sandbox database (Unix socket, no password), or :class:`ConnectionFailed`
    (exit 3) with the command that starts it.

    Args:
        server: the sandbox's server.
        directory: the sandbox directory (for the message).
    """
    if not server.is_running():
        raise ConnectionFailed(
            f"the sandbox in {directory} is not running",
            hint="start it with `pgflow sandbox up` (add `--seed demo` for sample flows)",
        )
    return server.conninfo(DATABASE)
