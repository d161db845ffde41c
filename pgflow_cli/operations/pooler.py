"""Whether a connection is a PostgreSQL session of its own, or goes through a connection pooler.

Most of pgflow-cli works through a transaction-mode pooler (PgBouncer): every statement it sends is
one transaction or runs inside one, and it prepares nothing on the server. A few commands need the
same server session from start to end and refuse a pooler (:func:`require_direct_session`):
``migrate apply`` and ``migrate abort`` (a session advisory lock held across transactions, index
builds outside a transaction, a session ``lock_timeout`` for them) and ``fence disable`` /
``fence restore`` (the fence record names the client address of whoever changed it, and a pooler
would put its own address there).

How a pooler is told apart, deterministically: when a connection starts, PostgreSQL names the
server process that serves it (the process id of the protocol's BackendKeyData message, which
libpq keeps and psycopg shows as ``conn.info.backend_pid``), and that process runs every statement
of the connection, so ``pg_backend_pid()`` returns the same number. A pooler answers the startup
itself, before it picks a server connection, and names a process id of its own (PgBouncer: a
random cancel key, in every pool mode); ``pg_backend_pid()`` then names the server process the
pooler chose. A TCP proxy that does not speak the protocol (HAProxy, an SSH tunnel) passes the
server's message through and is not a pooler here. The check cannot tell a session-mode pooler
from a transaction-mode one (PgBouncer does not say), so both are refused; a random key that
happens to equal the server's process id (about 1 in 2**31) would let a pooler pass.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from pgflow_cli import db, sqlfiles
from pgflow_cli.errors import UsageError

QUERIES = "queries/pooler.sql"


@dataclass(frozen=True)
class PoolerEvidence:
    """What shows a pooler between this client and the server.

    Attributes:
        announced_pid: the server process id the connection's startup named (the pooler's own).
        backend_pid: the server process that ran the check (``pg_backend_pid()``).
        server_host: where the server is reached from the pooler: its IP address, or the Unix
            socket directory; ``None`` when the role may not read the socket directories.
        server_port: the server's port as the pooler reached it.
    """

    announced_pid: int
    backend_pid: int
    server_host: str | None
    server_port: int

    def detail(self) -> list[str]:
        """The evidence in words, for an error's detail lines."""
        return [f"the connection's startup named server process {self.announced_pid}, but process "
                f"{self.backend_pid} ran this session's statement: something that speaks the PostgreSQL "
                "protocol (PgBouncer or another pooler) answered the startup itself",
                "PostgreSQL always names the process that serves the connection"]


def evidence(conn: psycopg.Connection) -> PoolerEvidence | None:
    """Look at one connection: ``None`` when it is a server session of its own, else the evidence.

    Args:
        conn: an open autocommit connection (the check is one read-only statement, its own transaction).
    """
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(sqlfiles.statement(QUERIES, "server_session")).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    announced = conn.info.backend_pid
    if announced == row["backend_pid"]:
        return None
    if row["server_addr"]:
        host: str | None = row["server_addr"]
    else:  # the pooler reaches the server over a Unix socket
        host = _first_socket_dir(row["socket_dirs"])
    return PoolerEvidence(announced, row["backend_pid"], host, row["server_port"] or row["port"])


def _first_socket_dir(setting: str | None) -> str | None:
    """The first directory of ``unix_socket_directories`` (comma-separated, ``None``: hidden)."""
    if not setting:
        return None
    first = setting.split(",")[0].strip().strip('"')
    return first or None


def direct_conninfo(target: db.Target, conn: psycopg.Connection, found: PoolerEvidence) -> str:
    """The target's connection string (without its password) pointed at the server the pooler uses.

    The database and user are the ones this connection logged in as; the host and port are the
    address the server reported for the pooler's connection (``SERVER_HOST`` when hidden from
    this role). Other options of the target (sslmode, ...) are kept.
    """
    try:
        params: dict[str, Any] = conninfo_to_dict(db.without_password(target.conninfo))
    except psycopg.ProgrammingError:
        params = {}
    for name in ("host", "hostaddr", "port", "service", "password", "application_name", "connect_timeout", "dbname",
                 "user"):
        params.pop(name, None)
    return make_conninfo("", host=found.server_host or "SERVER_HOST", port=str(found.server_port),
                         dbname=conn.info.dbname, user=conn.info.user, **params)


def require_direct_session(conn: psycopg.Connection, target: db.Target, command: str, needs: str) -> None:
    """Refuse to go on when ``conn`` goes through a connection pooler (exit 2: use another ``--dsn``).

    Args:
        conn: the command's connection, just opened.
        target: where it connected (for the direct connection string in the hint).
        command: e.g. ``pgflow migrate apply``.
        needs: why the command needs one server session, in words.

    Raises:
        UsageError: a pooler stands between; the hint names the direct connection string.
    """
    found = evidence(conn)
    if found is None:
        return
    direct = direct_conninfo(target, conn, found)
    where = ("the address the pooler reaches the server at; from another host use the server's own address"
             if found.server_host else "SERVER_HOST: the server's host or socket directory, hidden from this role")
    raise UsageError(
        f"{command} needs a PostgreSQL session of its own, and {target.describe()} is a connection pooler",
        hint=f"connect to PostgreSQL itself for this command: --dsn {shlex.quote(direct)} ({where}); workers, the run client "
        "and the read-only commands may keep using the pooler",
        detail=[*found.detail(), f"the command {needs}; a transaction-mode pooler runs each transaction on any of its "
                "server connections, and a session-mode one cannot be told apart from the client"],
    )
