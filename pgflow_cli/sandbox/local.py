"""The sandbox: an embedded local PostgreSQL with real PGMQ and the pgflow schema.

Lets every command run on a fresh machine with no database of one's own. The server
is a :class:`~pgflow_cli.sandbox.embedded.LocalServer`; the database is called ``pgflow``;
where the sandbox lives is :mod:`pgflow_cli.sandbox.location`.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

from pgflow_cli import db, installer, sqlfiles
from pgflow_cli.errors import ConnectionFailed, UsageError
from pgflow_cli.sandbox.embedded import LocalServer, validate_base_dir
from pgflow_cli.sandbox.location import DATABASE, default_dir, running_conninfo

STAGING_DATABASE = "pgflow_installing"
"""A new sandbox database is built under this name and renamed to ``pgflow`` only when complete,
so an ``up`` that fails half way leaves nothing that looks finished; the next ``up`` drops it and
starts over."""
QUERIES = "queries/sandbox.sql"


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
    local_mode: bool | None = None
    """``pgflow.environment`` is ``local`` on the database (a changed flow is recompiled, not refused)."""

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


LOCAL_MODE = "pgflow.environment"
"""The setting that puts a database in local mode (``pgflow.is_local()``): the sandbox sets it to
``local`` on its database, so a worker whose flow changed recompiles it there (deleting its runs, said
loudly first) instead of being refused as in production (docs/architecture.md "Local vs production")."""


def _local_mode(admin: psycopg.Connection) -> None:
    """Put the sandbox database in local mode (every new session of it reads the setting)."""
    admin.execute(pgsql.SQL("ALTER DATABASE {} SET pgflow.environment = 'local'").format(pgsql.Identifier(DATABASE)))


class Sandbox:
    """One sandbox: server lifecycle plus the ``pgflow`` database.

    Args:
        directory: the sandbox directory (see :func:`default_dir`).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = validate_base_dir(directory)
        self.server = LocalServer(self.directory)

    @classmethod
    def default(cls) -> Sandbox:
        return cls(default_dir())

    def conninfo(self) -> str:
        """Conninfo of the sandbox database (Unix socket, no password)."""
        return self.server.conninfo(DATABASE)

    def connect(self, dbname: str = DATABASE, *, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT) -> psycopg.Connection:
        """An autocommit connection to a database of the sandbox server, through :func:`pgflow_cli.db.connect`."""
        return db.connect(db.Target(self.server.conninfo(dbname), "sandbox"), application_name="pgflow-cli sandbox",
                          connect_timeout=connect_timeout)

    def running_conninfo(self) -> str:
        """Conninfo, or :class:`ConnectionFailed` (exit 3) with the command to start it."""
        return running_conninfo(self.server, self.directory)

    def up(self, *, target: int | None = None,
           prepare: Callable[[str], None] | None = None) -> list[installer.Applied]:
        """Create or start the server; create and install the database the first time.

        An existing sandbox database is only started, never migrated: upgrading it is
        ``pgflow migrate apply --sandbox``, exactly as on a real database. A new one is built as
        ``pgflow_installing`` (PGMQ, migrations, then ``prepare``) and renamed to ``pgflow`` only
        when all of it succeeded; a leftover of an ``up`` that failed or was killed half way is
        dropped and built again.

        Args:
            target: for a new database, install migrations only up to this version
                (``None``: all).
            prepare: called with the new database's conninfo after the migrations, before it is
                published (e.g. loading a seed); not called for an existing database.

        Returns:
            The migrations applied by this call (empty for an existing database).
        """
        with self._exclusive():
            self.server = LocalServer(self.directory)  # another `up` may have created it while we waited
            self.server.init()
            self.server.start()
            self.server.wait_ready()
            with self.connect("postgres") as admin:
                exists = admin.execute(sqlfiles.statement(QUERIES, "database_exists"), {"name": DATABASE}).fetchone()
                if exists:
                    _local_mode(admin)  # also a sandbox made before it ran in local mode
                    return []
                admin.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(STAGING_DATABASE)))
                admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(STAGING_DATABASE)))
            with self.connect(STAGING_DATABASE) as conn:
                installer.ensure_pgmq(conn)
                applied = installer.apply(conn, target=target)
            if prepare is not None:
                prepare(self.server.conninfo(STAGING_DATABASE))
            with self.connect("postgres") as admin:
                admin.execute(pgsql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    pgsql.Identifier(STAGING_DATABASE), pgsql.Identifier(DATABASE)))
                _local_mode(admin)
            return applied

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One ``up``/``reset`` at a time per sandbox: a file lock beside the sandbox directory."""
        lock_path = self.directory.parent / f".{self.directory.name}.lock"
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            handle = open(lock_path, "a+")  # noqa: SIM115 (entered below, once the open's OSError is mapped)
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
            with self.connect("postgres") as admin:
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
            with self.connect(connect_timeout=5) as conn:
                plan = installer.make_plan(conn)
                applied = [s.version for s in plan.statuses if s.state == "applied"]
                status.schema_version = max(applied) if applied else None
                status.pending_migrations = len(plan.pending)
                status.pgmq_version = plan.state.pgmq_version
                status.local_mode = bool(conn.execute(sqlfiles.statement(QUERIES, "local_mode")).fetchone()[0])  # type: ignore[index]
                if plan.state.has_flows_table:
                    row = conn.execute(sqlfiles.statement(QUERIES, "counts")).fetchone()
                    status.flows, status.runs_in_flight = (int(row[0]), int(row[1])) if row else (None, None)
        except (ConnectionFailed, psycopg.OperationalError):
            pass  # stopped or restarting meanwhile: report what is known
        return status
