"""Connections, transactions, timeouts and retries (the only module that talks to psycopg directly
for connection setup).

Connection target, first match wins (DESIGN.md "Every command"):

1. ``--dsn`` (a libpq keyword string or a ``postgresql://`` URL);
2. ``PGFLOW_DATABASE_URL``;
3. ``DATABASE_URL``;
4. libpq defaults: ``PGHOST``/``PGPORT``/``PGDATABASE``/``PGUSER``, ``PGSERVICE`` with
   service files, and ``.pgpass`` (an empty conninfo string lets libpq apply them).

Every connection sets ``application_name`` (``pgflow-cli`` unless told otherwise) and a
connect timeout, and never prepares statements on the server (:data:`POOLER_SAFE_PREPARE`), so a
transaction-mode pooler may stand between; the commands that need one server session of their own
refuse a pooler (:func:`require_direct_session`). Every transaction opened through :func:`transaction` sets
``lock_timeout`` and ``statement_timeout`` with ``SET LOCAL`` semantics, so they never
leak into a pooled session. Passwords never appear in messages: targets are shown
with :func:`describe_target`, and libpq error text is passed through :func:`redact`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgflow_cli.errors import (
    ConnectionFailed,
    LockTimeout,
    PgflowError,
    Refused,
    SchemaMissing,
    StateConflict,
    UsageError,
)

DEFAULT_APPLICATION_NAME = "pgflow-cli"
DEFAULT_CONNECT_TIMEOUT = 10
"""Seconds libpq waits for the server to answer before giving up."""

MAX_TIMEOUT_SECONDS = 2_147_483
"""Largest timeout PostgreSQL accepts (INT_MAX milliseconds), in seconds."""

DSN_ENV_VARS = ("PGFLOW_DATABASE_URL", "DATABASE_URL")
"""Environment variables read for the connection string, in order."""

POOLER_SAFE_PREPARE: int | None = None
"""psycopg's ``prepare_threshold`` for every connection: ``None``, never prepare. A prepared statement
lives in one server session; behind a transaction-mode pooler (PgBouncer before 1.21, or with
``max_prepared_statements = 0``) the next transaction may run in another one, which does not know it.
Each statement pgflow-cli sends is a function call or a catalog read whose planning costs little."""

LOCK_ERRORS = (pgerrors.LockNotAvailable, pgerrors.DeadlockDetected)
"""Errors worth a bounded retry: lock_timeout expiry (55P03) and deadlocks (40P01)."""

T = TypeVar("T")


@dataclass(frozen=True)
class ServerInfo:
    """The server a connection actually reached, read from the connection (libpq's view after
    service files, ``PG*`` variables and defaults were applied), never parsed from the DSN.

    Attributes:
        host: host name or Unix-socket directory libpq connected to.
        hostaddr: the IP address connected to (``None`` over a Unix socket).
        port: TCP port (also the socket file's number).
        dbname: the database.
        user: the role logged in as.
        server_version: PostgreSQL's ``server_version`` parameter, e.g. ``15.8``.
        server_version_num: e.g. ``150008``.
        service: the libpq service named by ``service=`` or ``PGSERVICE`` (``None``: none).
    """

    host: str
    hostaddr: str | None
    port: int
    dbname: str
    user: str
    server_version: str
    server_version_num: int
    service: str | None = None

    @classmethod
    def from_connection(cls, conn: psycopg.Connection, conninfo: str = "") -> ServerInfo:
        """Read the facts of an open connection (no query is sent).

        Args:
            conn: an open connection.
            conninfo: the target's conninfo, only to name the service it asked for.
        """
        info = conn.info
        try:
            service = conninfo_to_dict(conninfo).get("service") if conninfo else None
        except psycopg.ProgrammingError:
            service = None
        hostaddr = info.hostaddr if not info.host.startswith("/") else ""
        return cls(
            host=info.host,
            hostaddr=hostaddr or None,
            port=int(info.port),
            dbname=info.dbname,
            user=info.user,
            server_version=info.parameter_status("server_version") or str(info.server_version),
            server_version_num=int(info.server_version),
            service=str(service) if service else (os.environ.get("PGSERVICE") or None),
        )

    def describe(self) -> str:
        """``user@host:port/dbname``, with the service name when one was used."""
        text = f"{self.user}@{self.host}:{self.port}/{self.dbname}"
        return f"{text} (service {self.service})" if self.service else text

    def to_dict(self) -> dict[str, Any]:
        """The ``database`` object of every JSON document (docs/commands/README.md)."""
        return {
            "host": self.host, "hostaddr": self.hostaddr, "port": self.port, "dbname": self.dbname,
            "user": self.user, "server_version": self.server_version,
            "server_version_num": self.server_version_num, "service": self.service,
        }


@dataclass(frozen=True)
class Target:
    """Where to connect.

    Attributes:
        conninfo: libpq conninfo or URL (may contain a password; never print it).
        source: where it came from: ``--dsn``, an environment variable name,
            ``libpq defaults`` or ``sandbox``.
        server: once connected, what the connection reached (:meth:`connected`); ``None`` before.
    """

    conninfo: str
    source: str
    server: ServerInfo | None = None

    def connected(self, conn: psycopg.Connection) -> Target:
        """This target with the facts of ``conn`` (what it really reached) attached."""
        return dataclasses.replace(self, server=ServerInfo.from_connection(conn, self.conninfo))

    def describe(self) -> str:
        """Password-free description, e.g. ``postgres@/tmp:5432/pgflow (from --dsn)``: the server
        connected to once :meth:`connected`, else what the conninfo names (libpq defaults symbolic)."""
        where = self.server.describe() if self.server else describe_target(self.conninfo)
        return redact(f"{where} (from {self.source})", self.conninfo)

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``database`` object: the server's facts (:meth:`ServerInfo.to_dict`, all ``None``
        before connecting) and ``source``."""
        facts = self.server.to_dict() if self.server else dict.fromkeys(
            ("host", "hostaddr", "port", "dbname", "user", "server_version", "server_version_num", "service"))
        return {**facts, "source": self.source}

    def option(self) -> str:
        """The command-line option that names this target again, for hints that work when pasted:
        ``--sandbox``, ``--dsn '<the DSN without its password>'``, or ``""`` (environment, defaults)."""
        if self.source == "sandbox":
            return "--sandbox"
        if self.source != "--dsn":
            return ""
        return "--dsn " + shlex.quote(without_password(self.conninfo))


def has_password(conninfo: str) -> bool:
    """Whether ``conninfo`` itself holds a password (``password=`` or a URL's ``user:password@``)."""
    try:
        return bool(conninfo_to_dict(conninfo).get("password"))
    except psycopg.ProgrammingError:
        return False


def without_password(conninfo: str) -> str:
    """``conninfo`` with its password removed, in the form it was written (URL or key=value).

    A URL keeps its user (``postgresql://user@host/db``); a key=value string is rebuilt without
    the ``password`` keyword. Other secrets (``PGPASSWORD``) are never part of a conninfo.
    """
    match = _URL.match(conninfo)
    if match:
        userinfo = _url_userinfo(conninfo)
        rest = match.group("rest")
        scheme = conninfo[: match.start("rest")]
        if userinfo is not None and ":" in userinfo:
            rest = userinfo.split(":", 1)[0] + rest[len(userinfo):]
        rest = re.sub(r"([?&])password=[^&]*&?", r"\1", rest).rstrip("?&")
        return scheme + rest
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return ""
    params.pop("password", None)
    return make_conninfo("", **params)


def resolve_target(dsn: str | None, environ: Mapping[str, str] | None = None) -> Target:
    """Pick the connection target by the documented precedence.

    Args:
        dsn: the ``--dsn`` option value, or ``None``.
        environ: environment mapping (defaults to ``os.environ``).

    Returns:
        The :class:`Target`; an empty conninfo means "libpq defaults".

    Raises:
        UsageError: when the chosen string cannot be parsed (exit 2); the message
            never repeats the string itself, which may hold a password.
    """
    env = os.environ if environ is None else environ
    if dsn:
        target = Target(dsn, "--dsn")
    else:
        for name in DSN_ENV_VARS:
            if env.get(name):
                target = Target(env[name], name)
                break
        else:
            target = Target("", "libpq defaults (PGHOST, PGPORT, PGDATABASE, PGUSER, PGSERVICE)")
    _parse_or_raise(target)
    return target


def _parse_or_raise(target: Target) -> dict[str, str]:
    _refuse_ambiguous_url(target)
    try:
        # parsed from a string, every value is a string (the other types come only from keywords)
        return {key: str(value) for key, value in conninfo_to_dict(target.conninfo).items() if value is not None}
    except psycopg.ProgrammingError as exc:
        raise UsageError(
            f"the connection string from {target.source} cannot be parsed: {_parse_problem(str(exc))}",
            hint="use key=value pairs (host=... dbname=... password=...) or a postgresql://user@host:port/dbname URL; "
            "the string itself is not shown because it may hold a password",
        ) from None


_URL = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://(?P<rest>.*)$", re.S)


def _url_userinfo(conninfo: str) -> str | None:
    """The ``user:password`` part of a URL conninfo, up to the LAST ``@`` (``None``: not a URL or none)."""
    match = _URL.match(conninfo)
    if not match or "@" not in match.group("rest"):
        return None
    return match.group("rest")[: match.group("rest").rfind("@")]


def _refuse_ambiguous_url(target: Target) -> None:
    """Refuse URLs whose user or password holds an unescaped ``/`` or ``@``.

    libpq would read part of the password as host, port or database name, and every message
    describing that target would then print it. Refused before anything is parsed or printed.
    """
    userinfo = _url_userinfo(target.conninfo)
    if userinfo is not None and ("/" in userinfo or "@" in userinfo):
        raise UsageError(
            f"the connection URL from {target.source} has an unescaped '/' or '@' in its user or password part",
            hint="percent-encode them in the URL (/ as %2F, @ as %40), or use key=value form with password='...'; "
            "the URL is not shown because it holds a password",
        )


_PARSE_PROBLEMS = (
    ('missing "="', 'a word has no "=" (every option is key=value)'),
    ("unterminated quoted string", "a quoted value is not closed"),
    ("invalid connection option", "an option name is not one libpq knows (host, port, dbname, user, password, sslmode, ...)"),
    ("invalid URI", "the URL is malformed"),
    ("invalid percent-encoded token", "the URL has a broken %-escape"),
)


def _parse_problem(message: str) -> str:
    """A fixed description of a libpq parse error; never repeats the string (it may hold a secret)."""
    for needle, words in _PARSE_PROBLEMS:
        if needle in message:
            return words
    return "its syntax is invalid"


def describe_target(conninfo: str) -> str:
    """Describe a conninfo without its password: ``user@host:port/dbname``.

    Unset parts show libpq's defaults symbolically (``$PGHOST`` etc.).
    """
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparsable connection string>"
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "the default Unix socket"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    user = params.get("user") or os.environ.get("PGUSER") or _login_name()
    dbname = params.get("dbname") or os.environ.get("PGDATABASE") or user
    service = params.get("service") or os.environ.get("PGSERVICE")
    text = f"{user}@{host}:{port}/{dbname}"
    return f"{text} (service {service})" if service else text


def _login_name() -> str:
    """The operating-system user libpq uses when no user is given."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "the current OS user"


_PASSWORD_OPTION = re.compile(r"""password\s*[=:]\s*(?:'((?:[^'\\]|\\.)*)'?|"([^"]*)"?|(\S+))""")


def _secrets(conninfo: str) -> list[str]:
    """Every string that may be a password in ``conninfo`` (parsed or not), and ``PGPASSWORD``."""
    found: list[str] = []
    try:
        password = conninfo_to_dict(conninfo).get("password")
        if password:
            found.append(str(password))
    except psycopg.ProgrammingError:
        pass
    userinfo = _url_userinfo(conninfo)
    if userinfo and ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    for match in _PASSWORD_OPTION.finditer(conninfo):
        found.extend(group for group in match.groups() if group)
    if os.environ.get("PGPASSWORD"):
        found.append(os.environ["PGPASSWORD"])
    pieces = [piece for secret in found for piece in re.split(r"[/@:]", secret) if len(piece) >= 4]
    return sorted({s for s in found + pieces if s}, key=len, reverse=True)


def redact(text: str, conninfo: str) -> str:
    """Remove every possible password of ``conninfo`` (and ``PGPASSWORD``) from ``text``."""
    for secret in _secrets(conninfo):
        text = text.replace(secret, "********")
    return text


def connection_string(
    target: Target,
    *,
    application_name: str = DEFAULT_APPLICATION_NAME,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
) -> str:
    """The conninfo every pgflow connection uses: the target plus ``application_name`` and the
    connect timeout (for connection pools, which open connections themselves).

    Raises:
        UsageError: a non-positive ``connect_timeout``, or an option value libpq would reject
            (checked here, before any connection, so no message text has to be interpreted).
    """
    if connect_timeout <= 0:
        raise UsageError(f"--connect-timeout must be a positive number of seconds, got {connect_timeout}")
    _check_option_values(target)
    return make_conninfo(target.conninfo, application_name=application_name, connect_timeout=str(connect_timeout))


def connect(
    target: Target,
    *,
    application_name: str = DEFAULT_APPLICATION_NAME,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    autocommit: bool = True,
) -> psycopg.Connection:
    """Open a connection, mapping failures to :class:`ConnectionFailed` (exit 3).

    Every connection of pgflow-cli (commands, sandbox, seeds, demo, reference worker) is
    opened here, so every one gets the connect timeout, the error mapping and password
    redaction.

    Args:
        target: from :func:`resolve_target` (or ``Target(conninfo, source)``).
        application_name: shown in ``pg_stat_activity`` (and in lock-blocker reports).
        connect_timeout: seconds before libpq gives up on an unresponsive server.
        autocommit: psycopg autocommit mode; transactions are then opened explicitly
            with :func:`transaction`.

    Returns:
        An open :class:`psycopg.Connection`.

    Raises:
        UsageError: bad ``connect_timeout`` or option values (exit 2).
        ConnectionFailed: the server could not be reached or refused the connection (exit 3);
            classified by SQLSTATE and libpq's connection state, never by message text.
    """
    conninfo = connection_string(target, application_name=application_name, connect_timeout=connect_timeout)
    try:
        return psycopg.connect(conninfo, autocommit=autocommit, prepare_threshold=POOLER_SAFE_PREPARE)
    except psycopg.OperationalError as exc:
        error = _connect_error(target, exc, conninfo, connect_timeout)
    if error.reason == "password_required" and ask_password(
            _tried(None, conninfo).get("user") or os.environ.get("PGUSER") or _login_name()):
        try:
            return psycopg.connect(conninfo, autocommit=autocommit)
        except psycopg.OperationalError as exc:
            error = _connect_error(target, exc, conninfo, connect_timeout)
    raise error


PASSWORD_PROMPT_ENV = "PGFLOW_NO_PASSWORD_PROMPT"
"""Set to a non-empty value, no command asks for a password, even on a terminal (as ``psql -w``)."""


def ask_password(user: str) -> bool:
    """On a terminal, ask for the password the server wants (as psql does) and keep it in this
    process's ``PGPASSWORD``, where libpq finds it for every later connection of the command (a
    worker's pool too) and :func:`redact` removes it from any text.

    Args:
        user: the role the server asked the password of (named in the prompt).

    Returns:
        True when a password was typed (the caller connects again); False without a terminal on
        stdin, with :data:`PASSWORD_PROMPT_ENV` set, or when nothing was typed.
    """
    import getpass
    import sys

    if os.environ.get(PASSWORD_PROMPT_ENV) or not _stdin_is_terminal():
        return False
    try:
        password = getpass.getpass(f"Password for user {user}: ", stream=sys.stderr)
    except (EOFError, OSError):
        return False
    if not password:
        return False
    os.environ["PGPASSWORD"] = password
    return True


def _stdin_is_terminal() -> bool:
    import sys

    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


async def connect_async(
    target: Target,
    *,
    application_name: str = DEFAULT_APPLICATION_NAME,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    autocommit: bool = True,
) -> psycopg.AsyncConnection:
    """:func:`connect` for asyncio: the same connection string, timeout, error mapping and redaction.

    Raises:
        UsageError, ConnectionFailed: as :func:`connect`.
    """
    conninfo = connection_string(target, application_name=application_name, connect_timeout=connect_timeout)
    try:
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=autocommit,
                                                     prepare_threshold=POOLER_SAFE_PREPARE)
    except psycopg.OperationalError as exc:
        raise _connect_error(target, exc, conninfo, connect_timeout) from None


_INTEGER_OPTIONS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                    "tcp_user_timeout")
_ENUM_OPTIONS = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
}
"""libpq options whose values are checked before connecting (libpq's own checks are only text)."""


def _check_option_values(target: Target) -> None:
    """Refuse option values libpq would reject, with exit 2, before anything is sent."""
    params = _parse_or_raise(target)

    def bad(option: str) -> UsageError:
        return UsageError(
            f"the connection string from {target.source} has an invalid value for {option}",
            hint="check the value's type and spelling in --dsn / PGFLOW_DATABASE_URL / DATABASE_URL / PG* variables",
        )

    for port in (params.get("port") or "").split(","):
        if port.strip() and not (port.strip().isdigit() and 0 < int(port) < 65536):
            raise bad("port")
    for option in _INTEGER_OPTIONS:
        value = (params.get(option) or "").strip()
        if value and not re.fullmatch(r"-?[0-9]+", value):
            raise bad(option)
    for option, allowed in _ENUM_OPTIONS.items():
        if params.get(option) and params[option] not in allowed:
            raise bad(option)


_SQLSTATE_REASON = {
    "28P01": "wrong_password",
    "3D000": "database_missing",
    "53300": "too_many_connections",
    "57P03": "server_starting",
}
"""The reason of a connection-time SQLSTATE (28000 is decided by :func:`_refused_role_reason`)."""

_ROLE_LOOKUP_ROUTINE = "InitializeSessionUserId"
"""The server routine that reports an unknown role with SQLSTATE 28000 (pg_hba.conf refusals share the
SQLSTATE and come from the authentication code): a routine name, the same in every server language."""

_VERBOSE_SQLSTATE = re.compile(r"(?m)(?:^|: )[^:\n]{1,32}:  (?P<sqlstate>[0-9A-Z]{5}): ")
_VERBOSE_ROUTINE = re.compile(r"(?m)^[^:\n]{1,32}:  (?P<routine>[A-Za-z_][A-Za-z0-9_]*), [\w.-]+:[0-9]+\s*$")


def _meaning(reason: str, params: Mapping[str, str]) -> tuple[str, str]:
    """What went wrong and how to fix it, for a connection failure's reason.

    Args:
        reason: a key of :data:`pgflow_cli.errors.REASONS` for connection failures.
        params: what libpq tried (``user``, ``dbname``, ``host``, ``port``), for naming them.
    """
    user, dbname = params.get("user") or "?", params.get("dbname") or "?"
    where = f"{params.get('host') or 'the default socket'} port {params.get('port') or '5432'}"
    supply = ("supply it with PGPASSWORD, in the connection string of PGFLOW_DATABASE_URL, or in ~/.pgpass "
              "or a libpq service file; pgflow asks for it on a terminal and never prints it")
    return {
        "wrong_password": (f"authentication failed: the server refused the password of role {user!r}",
                           "check the user name and password (PGPASSWORD, PGFLOW_DATABASE_URL, ~/.pgpass or a "
                           "service file); pgflow never prints them"),
        "password_required": (f"authentication failed: the server wants a password for role {user!r} and none "
                              "was given", supply),
        "database_missing": (f"the database does not exist: there is no database {dbname!r} on that server",
                             "check the database name (dbname= in the connection string, PGDATABASE); "
                             "`psql -l` lists the databases"),
        "role_missing": (f"the role does not exist: the server has no role {user!r}",
                         "check the user name (user= in the connection string, PGUSER)"),
        "not_allowed": (f"the server refused this role: no pg_hba.conf rule lets role {user!r} connect to "
                        f"database {dbname!r} from here",
                        "ask the server's administrator for a pg_hba.conf entry, or connect as another role"),
        "connection_refused": (f"connection refused: nothing listens on {where}",
                               "is the server running? check the host and port (--dsn, PGFLOW_DATABASE_URL, "
                               "DATABASE_URL, PGHOST/PGPORT); `pgflow sandbox up` starts a local one"),
        "host_unknown": (f"unknown host: {params.get('host')!r} does not resolve",
                         "check the host name (host= in the connection string, PGHOST)"),
        "timeout": ("connection timed out",
                    "the server did not answer in time; check the host, port and firewall, or raise --connect-timeout"),
        "too_many_connections": ("the server has no free connection slots",
                                 "too many connections: close idle sessions or raise max_connections, then retry"),
        "server_starting": ("the server is not accepting connections yet",
                            "it is starting up, shutting down or in recovery; retry shortly"),
    }.get(reason, ("cannot connect",
                   "check that the server runs and that host/port are right (--dsn, PGFLOW_DATABASE_URL, DATABASE_URL, "
                   "PGHOST/PGPORT); try `pgflow sandbox up` for a local database"))


def _connect_error(target: Target, exc: psycopg.OperationalError, conninfo: str, connect_timeout: int) -> PgflowError:
    """Classify a failed connection (:data:`pgflow_cli.errors.REASONS`): exception type, libpq's
    connection state, the server's SQLSTATE (read in libpq's verbose mode, never from message text),
    and, when no server answered, what a plain socket connection to the same address meets."""
    raw = redact(str(exc).strip(), target.conninfo)
    pgconn = getattr(exc, "pgconn", None)
    params = _tried(pgconn, conninfo)
    if isinstance(exc, pgerrors.ConnectionTimeout):
        reason = "timeout"
    elif pgconn is not None and getattr(pgconn, "needs_password", False):  # asked, and none was given
        reason = "password_required"
    else:
        # A refusal after a password was sent is a wrong password or something the server checks only
        # after authentication (a missing database): one more attempt in verbose mode tells them apart.
        sqlstate, routine = _server_diagnosis(conninfo, connect_timeout)
        sqlstate = getattr(exc, "sqlstate", None) or sqlstate
        if sqlstate == "28000":
            reason = "role_missing" if routine == _ROLE_LOOKUP_ROUTINE else "not_allowed"
        elif sqlstate in _SQLSTATE_REASON:
            reason = _SQLSTATE_REASON[sqlstate]
        elif sqlstate is None and pgconn is not None and getattr(pgconn, "used_password", False):
            reason = "wrong_password"
        elif sqlstate is None:
            reason = _socket_reason(params, connect_timeout)
        else:
            reason = "connection_failed"
    what, hint = _meaning(reason, params)
    detail = [line.strip() for line in raw.splitlines() if line.strip()] or ["no detail from libpq"]
    return ConnectionFailed(f"cannot connect to {target.describe()}: {what}", hint=hint, detail=detail, reason=reason)


def _tried(pgconn: Any, conninfo: str) -> dict[str, str]:
    """``user``, ``dbname``, ``host`` and ``port`` libpq tried (from the failed connection, else the conninfo)."""
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(conninfo).items() if v is not None}
    except psycopg.ProgrammingError:
        params = {}
    for key in ("user", "dbname", "host", "port"):
        try:
            value = getattr(pgconn, "db" if key == "dbname" else key, None) if pgconn is not None else None
        except Exception:  # a finished PGconn may refuse; the conninfo still says what was meant
            value = None
        if isinstance(value, bytes) and value:
            params[key] = value.decode("utf-8", "replace")
    return params


def _socket_reason(params: Mapping[str, str], connect_timeout: int) -> str:
    """Why no server answered: a plain connection to the address libpq tried (first host only).

    Returns ``connection_refused`` (nothing listens: ECONNREFUSED, or a Unix socket file that does not
    exist), ``host_unknown`` (the name does not resolve) or ``connection_failed`` (anything else, e.g.
    a host that is unreachable, or a listener that then closed the connection).
    """
    import socket

    host = (params.get("host") or os.environ.get("PGHOST") or "").split(",")[0]
    port = int((params.get("port") or os.environ.get("PGPORT") or "5432").split(",")[0] or 5432)
    try:
        if not host or host.startswith("/"):
            path = f"{host or '/var/run/postgresql'}/.s.PGSQL.{port}"
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(min(connect_timeout, 3))
                sock.connect(path)
        else:
            with socket.create_connection((params.get("hostaddr") or host, port), timeout=min(connect_timeout, 3)):
                pass
    except (FileNotFoundError, ConnectionRefusedError):
        return "connection_refused"
    except socket.gaierror:
        return "host_unknown"
    except OSError:
        return "connection_failed"
    return "connection_failed"


def _server_diagnosis(conninfo: str, connect_timeout: int) -> tuple[str | None, str | None]:
    """The SQLSTATE of the server's refusal and the server routine that raised it, read from one more
    attempt in libpq's verbose error mode.

    libpq keeps a connection-time error's SQLSTATE only in its message text, and only in verbose
    mode (``FATAL:  3D000: ...``, the same code in every server language; the ``LOCATION`` line names
    the routine). Not used after a timeout or a missing password. After a refused password it tries the
    same password once more: a missing database is only reported after a successful authentication,
    and nothing else tells it from a wrong password. ``(None, None)`` when libpq cannot be switched to
    verbose mode or no server answered.
    """
    import selectors

    from psycopg import pq

    set_verbosity = _libpq_set_error_verbosity()
    if set_verbosity is None:
        return None, None
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        # psycopg's PGconn protocol omits pgconn_ptr; both implementations (ctypes, C) have it
        set_verbosity(pgconn.pgconn_ptr, 2)  # type: ignore[attr-defined]  # PQERRORS_VERBOSE
        deadline = time.monotonic() + min(connect_timeout, 5)
        with selectors.DefaultSelector() as selector:
            while pgconn.status != pq.ConnStatus.BAD and time.monotonic() < deadline:
                status = pgconn.connect_poll()
                if status in (pq.PollingStatus.OK, pq.PollingStatus.FAILED):
                    break
                event = selectors.EVENT_READ if status == pq.PollingStatus.READING else selectors.EVENT_WRITE
                selector.register(pgconn.socket, event)
                selector.select(max(0.0, deadline - time.monotonic()))
                selector.unregister(pgconn.socket)
        text = pgconn.error_message.decode("utf-8", "replace")
        sqlstate, routine = _VERBOSE_SQLSTATE.search(text), _VERBOSE_ROUTINE.search(text)
        return (sqlstate.group("sqlstate") if sqlstate else None), (routine.group("routine") if routine else None)
    except Exception:  # diagnosis only: never worse than no SQLSTATE
        return None, None
    finally:
        pgconn.finish()


def _libpq_set_error_verbosity() -> Callable[[int | None, int], object] | None:
    """``PQsetErrorVerbosity`` of the libpq psycopg runs on (psycopg's pq wrapper does not expose it)."""
    import ctypes
    import ctypes.util
    import glob

    from psycopg import pq

    # Only the very library psycopg loaded may touch its connection structures.
    if pq.__impl__ == "binary":
        import psycopg_binary

        libs = os.path.join(os.path.dirname(os.path.dirname(psycopg_binary.__file__)), "psycopg_binary.libs")
        candidates = sorted(glob.glob(os.path.join(libs, "libpq-*.so*")))
    else:
        found = ctypes.util.find_library("pq")
        candidates = [found] if found else []
    for candidate in candidates:
        try:
            function = ctypes.CDLL(candidate).PQsetErrorVerbosity
        except (OSError, AttributeError):
            continue
        function.argtypes = [ctypes.c_void_p, ctypes.c_int]
        return function
    return None


def scalar(cursor: psycopg.Cursor[tuple[Any, ...]]) -> Any:
    """The first value of the next row of ``cursor``, for statements that always return one row
    (``SELECT pgflow.some_function(...)``, ``SELECT count(*) ...``).

    Raises:
        psycopg.ProgrammingError: the statement returned no row (a bug in the statement).
    """
    row = cursor.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the statement returned no row")
    return row[0]


@contextmanager
def transaction(
    conn: psycopg.Connection,
    *,
    read_only: bool = False,
    lock_timeout: float | None = 5.0,
    statement_timeout: float | None = 60.0,
    isolation: str | None = None,
) -> Iterator[psycopg.Connection]:
    """Run a block in one transaction with local timeouts; roll back on any error.

    Args:
        conn: an autocommit connection from :func:`connect`.
        read_only: start ``READ ONLY`` (the audit uses this).
        lock_timeout: seconds to wait for any lock; ``None`` or 0 disables the limit.
        statement_timeout: seconds any statement may run; ``None`` or 0 disables it.
        isolation: ``"repeatable read"`` or ``"serializable"`` (default: server default).

    Yields:
        The same connection, inside the transaction.
    """
    mode = []
    if isolation:
        if isolation not in ("read committed", "repeatable read", "serializable"):
            raise ValueError(f"unknown isolation level {isolation!r}")
        mode.append(f"ISOLATION LEVEL {isolation.upper()}")
    mode.append("READ ONLY" if read_only else "READ WRITE")
    with conn.transaction():
        # BEGIN was sent by psycopg; set the characteristics before any query runs.
        conn.execute(f"SET TRANSACTION {' '.join(mode)}")
        conn.execute(
            "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)",
            (_ms(lock_timeout), _ms(statement_timeout)),
        )
        yield conn


def _ms(seconds: float | None) -> str:
    """A timeout in PostgreSQL's terms: ``0`` (no limit) only for ``None``/0; at least ``1ms`` otherwise."""
    if not seconds:
        return "0"
    if seconds != seconds or seconds == float("inf") or seconds > MAX_TIMEOUT_SECONDS:
        raise UsageError(f"a timeout of {seconds} seconds is out of range (at most {MAX_TIMEOUT_SECONDS:,} s; 0 for none)")
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def retry_on_lock(
    action: Callable[[], T],
    *,
    attempts: int = 5,
    base_delay: float = 0.5,
    max_delay: float = 8.0,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Run ``action`` and retry it only on lock timeouts and deadlocks.

    Args:
        action: a callable that runs one complete transaction (it must be safe to rerun
            because the failed attempt was rolled back).
        attempts: total tries, at least 1.
        base_delay: seconds before the first retry; doubles each time, with jitter.
        max_delay: cap on one wait, seconds.
        on_retry: called as ``on_retry(attempt_number, error, sleep_seconds)`` before each wait.

    Returns:
        What ``action`` returned.

    Raises:
        LockTimeout: when every attempt hit a lock timeout or deadlock (exit 4).
        Any other error from ``action`` unchanged (never retried).
    """
    attempts = max(1, attempts)
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except LOCK_ERRORS as exc:
            if attempt == attempts:
                raise LockTimeout(
                    f"gave up after {attempts} attempt(s): {first_line(exc)}",
                    hint="another session holds a conflicting lock; find it in pg_stat_activity, let it finish, "
                    "or retry with a larger --lock-timeout / --retries",
                ) from None
            delay = min(max_delay, base_delay * (2 ** (attempt - 1)))
            delay *= 0.5 + random.random() / 2
            if on_retry:
                on_retry(attempt, exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def first_line(exc: BaseException) -> str:
    """First line of an exception's text (libpq errors are multi-line)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


PGFLOW_SQLSTATES: dict[str, type[PgflowError]] = {
    "PF001": StateConflict,  # worker function disabled (fence or fatal pause)
    "PF002": StateConflict,  # worker/database protocol mismatch
    "PF003": UsageError,  # invalid flow or step definition
    "PF004": StateConflict,  # queue collision, or a queue pgflow must not adopt
    "PF005": Refused,  # the upgrade recheck found incompatible data
    "PF006": StateConflict,  # unknown flow or run
    "PF007": StateConflict,  # worker not registered
    "PF008": Refused,  # whole-flow deletion refused: the flow is still active (no force)
    "PF009": StateConflict,  # manual task not found
    "PF010": StateConflict,  # execution mode mismatch: manual API on a queue task, worker API on a manual task
    "PF011": StateConflict,  # manual task no longer active
    "PF012": StateConflict,  # manual task already has another outcome
    "PF013": UsageError,  # a failure's retry delay out of range, or a retry delay with fail-now
}
"""Exit-code class of each pgflow SQLSTATE (docs/architecture.md "Errors raised by pgflow SQL")."""


def map_database_error(exc: psycopg.Error, *, target: Target | None = None) -> PgflowError:
    """Translate a psycopg error raised during a command into a :class:`PgflowError`.

    Lock and statement timeouts give exit 4, missing pgflow objects exit 3,
    missing privileges exit 3, everything else keeps the server's message with
    exit 70 (a bug or an unexpected server state).
    """
    message = str(exc).strip()
    if target is not None:
        message = redact(message, target.conninfo)
    diag = getattr(exc, "diag", None)
    detail = [line for line in ((diag.message_detail if diag else None) or "").splitlines() if line]
    hint_from_server = (diag.message_hint if diag else None) or ""
    first = message.splitlines()[0] if message else type(exc).__name__
    pgflow_error = PGFLOW_SQLSTATES.get(getattr(exc, "sqlstate", None) or "")
    if pgflow_error is not None:
        return pgflow_error(first, hint=hint_from_server, detail=detail)
    if isinstance(exc, (pgerrors.LockNotAvailable, pgerrors.QueryCanceled, pgerrors.DeadlockDetected)):
        return LockTimeout(
            f"timed out: {message.splitlines()[0]}",
            hint="a lock was held by another session or a statement ran past its limit; "
            "retry later or raise --lock-timeout / --statement-timeout",
            detail=detail,
        )
    if isinstance(exc, pgerrors.InvalidSchemaName):  # 3F000: a schema (pgflow, pgmq) is not there at all
        return SchemaMissing(
            f"a schema is missing: {message.splitlines()[0]}",
            hint="is this the right database? a database without pgflow gets it with `pgflow migrate apply` "
            "(`pgflow migrate plan` shows what it does first)",
            detail=detail, reason="schema_missing",
        )
    if isinstance(exc, (pgerrors.UndefinedTable, pgerrors.UndefinedFunction)):
        return SchemaMissing(
            f"a pgflow object is missing: {message.splitlines()[0]}",
            hint="is this the right database? `pgflow migrate status` shows what is installed, and `pgflow migrate "
            "apply` adds what a later migration brings",
            detail=detail, reason="object_missing",
        )
    if isinstance(exc, pgerrors.ReadOnlySqlTransaction):  # 25006: a hot standby or a read-only session
        return ConnectionFailed(
            f"the database refused a write: {message.splitlines()[0]}",
            hint="this is a hot standby or a read-only session (default_transaction_read_only); connect to the "
            "primary, as a role that may write",
            detail=detail,
        )
    if isinstance(exc, pgerrors.InsufficientPrivilege):
        return ConnectionFailed(
            f"permission denied: {message.splitlines()[0]}",
            hint=hint_from_server or "connect as a role with the privileges this command needs (see docs/permissions.md)",
            detail=detail,
        )
    if isinstance(exc, psycopg.OperationalError):
        return ConnectionFailed(f"lost the connection: {message.splitlines()[0] if message else 'no detail'}",
                                hint="the server closed the connection; check the server log and retry",
                                reason="connection_lost")
    return PgflowError(
        f"database error: {message.splitlines()[0] if message else type(exc).__name__}",
        hint=hint_from_server,
        detail=detail,
    )
