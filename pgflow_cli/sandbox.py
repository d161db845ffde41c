"""The sandbox: an embedded local PostgreSQL with real PGMQ and the pgflow schema.

Lets every command run on a fresh machine with no database of one's own. The server
is a :class:`~pgflow_cli.embedded.LocalServer`; the database is called ``pgflow``.

Location of the sandbox directory, first match wins:

1. ``$PGFLOW_SANDBOX_DIR``;
2. as root: ``/var/lib/pgflow-cli/sandbox`` (the server runs as the ``postgres`` user,
   which cannot enter root's home directory);
3. otherwise: the user cache directory, e.g. ``~/.cache/pgflow-cli/sandbox``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import psycopg
from psycopg import sql as pgsql

from pgflow_cli import installer, sqlfiles
from pgflow_cli.embedded import LocalServer, validate_base_dir
from pgflow_cli.errors import ConnectionFailed, StateConflict, UsageError

DATABASE = "pgflow"
QUERIES = "queries/sandbox.sql"
ROOT_SANDBOX_DIR = Path("/var/lib/pgflow-cli/sandbox")


def default_dir() -> Path:
    """The sandbox directory by the documented precedence."""
    override = os.environ.get("PGFLOW_SANDBOX_DIR")
    if override:
        return Path(override).expanduser().resolve()
    if os.geteuid() == 0:
        return ROOT_SANDBOX_DIR
    return Path(platformdirs.user_cache_dir("pgflow-cli")) / "sandbox"


@dataclass
class SandboxStatus:
    """What ``pgflow sandbox status`` reports."""

    directory: str
    initialised: bool
    running: bool
    port: int | None
    socket_dir: str | None
    conninfo: str | None
    schema_version: int | None = None
    pending_migrations: int | None = None
    pgmq_version: str | None = None
    flows: int | None = None
    runs_in_flight: int | None = None

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


class Sandbox:
    """One sandbox: server lifecycle plus the ``pgflow`` database.

    Args:
        directory: the sandbox directory (see :func:`default_dir`).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = validate_base_dir(directory)
        self.server = LocalServer(self.directory)

    @classmethod
    def default(cls) -> "Sandbox":
        return cls(default_dir())

    def conninfo(self) -> str:
        """Conninfo of the sandbox database (Unix socket, no password)."""
        return self.server.conninfo(DATABASE)

    def running_conninfo(self) -> str:
        """Conninfo, or :class:`ConnectionFailed` (exit 3) with the command to start it."""
        if not self.server.is_running():
            raise ConnectionFailed(
                f"the sandbox in {self.directory} is not running",
                hint="start it with `pgflow sandbox up` (add `--seed demo` for sample flows)",
            )
        return self.conninfo()

    def up(self, *, target: int | None = None) -> list[installer.Applied]:
        """Create or start the server; create and install the database the first time.

        An existing sandbox database is only started, never migrated: upgrading it is
        ``pgflow migrate apply --sandbox``, exactly as on a real database.

        Args:
            target: for a new database, install migrations only up to this version
                (``None``: all).

        Returns:
            The migrations applied by this call (empty for an existing database).
        """
        with self._exclusive():
            self.server = LocalServer(self.directory)  # another `up` may have created it while we waited
            self.server.init()
            self.server.start()
            self.server.wait_ready()
            with psycopg.connect(self.server.conninfo("postgres"), autocommit=True) as admin:
                exists = admin.execute(sqlfiles.statement(QUERIES, "database_exists"), {"name": DATABASE}).fetchone()
                if exists:
                    return []
                admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(DATABASE)))
            with psycopg.connect(self.conninfo(), autocommit=True) as conn:
                installer.ensure_pgmq(conn)
                return installer.apply(conn, target=target)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One ``up``/``reset`` at a time per sandbox: a file lock beside the sandbox directory."""
        lock_path = self.directory.parent / f".{self.directory.name}.lock"
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            handle = open(lock_path, "a+")
        except OSError as exc:
            raise UsageError(
                f"cannot use the sandbox directory {self.directory}: {exc.strerror}",
                hint="choose a directory you can write to with PGFLOW_SANDBOX_DIR",
            ) from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def reset(self) -> None:
        """Drop the sandbox database (the server keeps running); ``up`` creates it again."""
        with self._exclusive():
            self.server = LocalServer(self.directory)
            if not self.server.is_running():
                self.server.start()
            with psycopg.connect(self.server.conninfo("postgres"), autocommit=True) as admin:
                admin.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(DATABASE)))

    def down(self) -> bool:
        """Stop the server, keeping its data. Returns whether it was running."""
        running = self.server.is_running()
        self.server.stop()
        return running

    def destroy(self) -> None:
        """Stop the server and delete the sandbox directory."""
        self.server.destroy()

    def status(self) -> SandboxStatus:
        """Inspect the sandbox without changing it."""
        initialised = self.server.exists()
        running = initialised and self.server.is_running()
        status = SandboxStatus(
            directory=str(self.directory),
            initialised=initialised,
            running=running,
            port=self.server.port if initialised else None,
            socket_dir=str(self.server.socket_dir) if initialised else None,
            conninfo=self.conninfo() if running else None,
        )
        if not running:
            return status
        try:
            with psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=5) as conn:
                plan = installer.make_plan(conn)
                applied = [s.version for s in plan.statuses if s.state == "applied"]
                status.schema_version = max(applied) if applied else None
                status.pending_migrations = len(plan.pending)
                status.pgmq_version = plan.state.pgmq_version
                if plan.state.has_flows_table:
                    row = conn.execute(sqlfiles.statement(QUERIES, "counts")).fetchone()
                    status.flows, status.runs_in_flight = (int(row[0]), int(row[1])) if row else (None, None)
        except psycopg.OperationalError:
            pass
        return status

    def require_schema_at_most(self, version: int) -> None:
        """Refuse (exit 6) when the sandbox database is past ``version``: seeding legacy data needs the baseline."""
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            plan = installer.make_plan(conn)
        applied = [s.version for s in plan.statuses if s.state == "applied"]
        if applied and max(applied) > version:
            raise StateConflict(
                f"the sandbox database is already at schema {max(applied):04d}; the demo seed needs the "
                f"pre-upgrade baseline ({version:04d})",
                hint="run `pgflow sandbox reset --seed demo`",
            )
