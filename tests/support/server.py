"""One private PostgreSQL server per test run, template databases, a fresh clone per test.

The server comes from :mod:`pgflow_cli.sandbox.embedded` (the same code as ``pgflow sandbox``).
Templates are built once per run and cloned with ``CREATE DATABASE ... TEMPLATE`` (about
0.1 s each), so every test gets a database nobody else touches.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
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


def label_of(request: Any, suffix: str = "") -> str:
    """The test's name as a database-name part: lower case, ``[a-z0-9_]``, at most 40 characters
    (with ``suffix``: cut to leave room for it)."""
    label = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())
    return label[:40 - len(suffix)] + suffix if suffix else label[:40]


class Harness:
    """Owns the server, the admin connection and the templates of one test run."""

    def __init__(self) -> None:
        base = Path(tempfile.mkdtemp(prefix="pgflow-tests-", dir="/tmp"))
        os.chmod(base, 0o755)
        self.server = LocalServer(base / "pg", tcp=True)
        self.server.start()
        self.server.wait_ready()
        self.base = base
        self.admin = psycopg.connect(self.server.conninfo("postgres"), autocommit=True)
        self._templates: dict[str, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        try:
            self.admin.close()
        finally:
            if os.environ.get("PGFLOW_TEST_KEEP_SERVER"):
                print(f"\nkept test server in {self.base}")
            else:
                self.server.destroy()
                with contextlib.suppress(OSError):
                    os.rmdir(self.base)

    def template(self, name: str, build: Callable[[str], None]) -> str:
        """Return the name of template ``name``, building it once with ``build(conninfo)``."""
        with self._lock:
            if name not in self._templates:
                dbname = f"tmpl_{name}"
                self.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
                self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
                build(self.server.conninfo(dbname))
                # No session may stay connected to a template that is cloned.
                self.admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    (dbname,),
                )
                self._templates[name] = dbname
            return self._templates[name]

    def clone(self, template: str | None, label: str) -> TestDatabase:
        """Create a fresh database from ``template`` (``None``: an empty database)."""
        name = f"t{next(_counter)}_{label}"[:60]
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
