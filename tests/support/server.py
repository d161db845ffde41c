"""One private PostgreSQL server per test run, template databases, a fresh clone per test.

The server comes from :mod:`pgflow_cli.sandbox.embedded` (the same code as ``pgflow sandbox``).
Templates are built once per run and cloned with ``CREATE DATABASE ... TEMPLATE`` (about
0.03 s each), so every test gets a database nobody else touches.

With pytest-xdist (``-n 2``) the workers share the one server: the controller process starts it
(:func:`start_shared_server`) and each worker attaches to it (``Harness(shared=...)``). A template
is built by whichever worker asks first, under a PostgreSQL advisory lock; the others wait for that
lock and then find it marked ``IS_TEMPLATE``. Database names carry the worker id, so two workers
never pick the same name.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgflow_cli.sandbox import LocalServer

_counter = itertools.count(1)

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
"""``gw0``, ``gw1``... under pytest-xdist, else empty: the per-worker part of database names."""
_PREFIX = f"t{_WORKER.removeprefix('gw')}x" if _WORKER else "t"

_TEMPLATE_LOCK = 7310514
"""First key of the advisory lock that serialises template builds across xdist workers."""


TERMINATING = (signal.SIGTERM, signal.SIGHUP)
"""The signals that end a test run early besides Ctrl-C; the process owning the server then still
stops and deletes it (tests/conftest.py, :func:`stop_shared_server`)."""


def start_shared_server() -> Path:
    """Start the one server an xdist run shares; returns its base directory (for ``Harness(shared=...)``).

    Interrupted while starting (Ctrl-C, or SIGTERM/SIGHUP, which tests/conftest.py turns into
    ``pytest.exit``), it deletes what it made before passing the interruption on.
    """
    base = Path(tempfile.mkdtemp(prefix="pgflow-tests-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        server = LocalServer(base / "pg", tcp=True)
        server.start()
        server.wait_ready()
    except BaseException:
        stop_shared_server(base)
        raise
    return base


@contextlib.contextmanager
def termination_held() -> Iterator[None]:
    """In the block, SIGTERM and SIGHUP are ignored (in the main thread; elsewhere nothing changes),
    so a stop in progress is never cut short; the previous handlers are back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in TERMINATING}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_shared_server(base: Path) -> None:
    """Stop and delete the server :func:`start_shared_server` started (kept with PGFLOW_TEST_KEEP_SERVER),
    ignoring SIGTERM and SIGHUP meanwhile (:func:`termination_held`)."""
    if os.environ.get("PGFLOW_TEST_KEEP_SERVER"):
        print(f"\nkept test server in {base}")
        return
    with termination_held():
        LocalServer(base / "pg").destroy()
        with contextlib.suppress(OSError):
            os.rmdir(base)


@dataclass
class TestDatabase:
    """A database created for one test.

    Attributes:
        name: database name.
        server: the :class:`LocalServer` it lives on.
    """

    name: str
    server: LocalServer
    _connections: list[psycopg.Connection] = field(default_factory=list)

    @property
    def conninfo(self) -> str:
        """Socket conninfo (trust auth as the superuser)."""
        return self.server.conninfo(self.name)

    def connect(self, *, autocommit: bool = True, **kwargs) -> psycopg.Connection:
        """Open a connection that is closed when the test ends."""
        conn = psycopg.connect(self.conninfo, autocommit=autocommit, **kwargs)
        self._connections.append(conn)
        return conn

    def close_all(self) -> None:
        for conn in self._connections:
            with contextlib.suppress(Exception):
                conn.close()
        self._connections.clear()

    def through(self, pooler: Any) -> PooledDatabase:
        """This database reached through ``pooler`` (a :class:`pgflow_cli.sandbox.pooler.LocalPooler`)."""
        return PooledDatabase(self.name, self.server, pooler=pooler)


@dataclass
class PooledDatabase(TestDatabase):
    """A test database reached through a connection pooler: ``conninfo`` is the pooler's (TCP, with the
    server's password), and :meth:`connect` turns psycopg's prepared statements off, as every client of a
    transaction-mode pooler must (a statement prepared in one server session is unknown in the next).
    The test's ``db`` fixture drops the database; this view only closes its own connections."""

    pooler: Any = None

    @property
    def conninfo(self) -> str:
        return str(self.pooler.conninfo(self.name))

    def connect(self, *, autocommit: bool = True, **kwargs) -> psycopg.Connection:
        kwargs.setdefault("prepare_threshold", None)
        return super().connect(autocommit=autocommit, **kwargs)


def label_of(request: Any, suffix: str = "") -> str:
    """The test's name as a database-name part: lower case, ``[a-z0-9_]``, at most 40 characters
    (with ``suffix``: cut to leave room for it)."""
    label = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())
    return label[:40 - len(suffix)] + suffix if suffix else label[:40]


class Harness:
    """Owns the server, the admin connection and the templates of one test run."""

    def __init__(self, shared: Path | None = None) -> None:
        """Start a server of its own, or (``shared``: a :func:`start_shared_server` directory) use that one."""
        self.owned = shared is None
        base = start_shared_server() if shared is None else shared
        self.server = LocalServer(base / "pg", tcp=True)
        self.base = base
        try:
            self.admin = psycopg.connect(self.server.conninfo("postgres"), autocommit=True)
        except BaseException:  # also an interruption: a server of its own is not left behind
            if self.owned:
                stop_shared_server(base)
            raise
        self._templates: dict[str, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        try:
            self.admin.close()
        finally:
            if self.owned:
                stop_shared_server(self.base)

    def template(self, name: str, build: Callable[[str], None]) -> str:
        """Return the name of template ``name``, building it once per server with ``build(conninfo)``.

        Marked ``IS_TEMPLATE`` only when the build finished, so a database of that name without the
        mark (a build that failed or was interrupted) is dropped and built again.
        """
        with self._lock:
            if name not in self._templates:
                dbname = f"tmpl_{name}"
                self.admin.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_TEMPLATE_LOCK, dbname))
                try:
                    row = self.admin.execute("SELECT datistemplate FROM pg_database WHERE datname = %s",
                                             (dbname,)).fetchone()
                    if not (row and row[0]):
                        self._build(dbname, build)
                finally:
                    self.admin.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_TEMPLATE_LOCK, dbname))
                self._templates[name] = dbname
            return self._templates[name]

    def _build(self, dbname: str, build: Callable[[str], None]) -> None:
        self.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        build(self.server.conninfo(dbname))
        # No session may stay connected to a template that is cloned.
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        )
        self.admin.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true").format(sql.Identifier(dbname)))

    def clone(self, template: str | None, label: str) -> TestDatabase:
        """Create a fresh database from ``template`` (``None``: an empty database)."""
        name = f"{_PREFIX}{next(_counter)}_{label}"[:60]
        if template:
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        else:
            stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        with self._lock:
            self.admin.execute(stmt)
        return TestDatabase(name, self.server)

    def fresh(self, template: str | None, request: Any, suffix: str = "") -> Iterator[TestDatabase]:
        """For a fixture, ``yield from harness.fresh(template, request)``: a clone of ``template``
        named after the test (plus ``suffix``), dropped when the test is done."""
        database = self.clone(template, label_of(request, suffix))
        try:
            yield database
        finally:
            self.drop(database)

    def drop(self, database: TestDatabase) -> None:
        database.close_all()
        with self._lock:
            self.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database.name)))
