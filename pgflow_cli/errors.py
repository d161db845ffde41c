"""Exit codes and the error types every layer raises.

One table of exit codes serves the whole tool (docs/exit-codes.md, ``pgflow --help``).
Lower layers raise a :class:`PgflowError` subclass; only the CLI turns it into a
message on stderr and an exit code, so library callers get ordinary exceptions.

Every error carries three parts an operator can act on:

* ``message``: what went wrong, naming the object (flow, step, queue, file);
* ``hint``: how to fix it, or the next command to run;
* ``detail``: optional extra lines (a list of offending rows, blocking sessions);
* ``reason``: for errors a script may want to tell apart under one exit code, a stable word
  (:data:`REASONS`), e.g. ``database_missing`` or ``wrong_password`` under exit 3.

Messages never contain passwords or message bodies; :func:`redact` is applied by
the connection layer to anything derived from a DSN.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class ExitCode(enum.IntEnum):
    """Process exit codes of ``pgflow`` (DESIGN.md "One exit-code table")."""

    OK = 0
    """Success, nothing blocking."""
    FINDINGS = 1
    """Ran fine and found a problem: audit findings, uncovered routes, a refused migration."""
    USAGE = 2
    """Usage or configuration error (bad option, unreadable file, invalid name)."""
    CONNECTION = 3
    """Cannot connect or authenticate, or no pgflow schema where one is needed."""
    LOCK_TIMEOUT = 4
    """Lock or statement timeout after the bounded retries."""
    DEADLINE = 5
    """A wait reached its deadline with work still in flight (drain, coverage --wait)."""
    CONFLICT = 6
    """State conflict: already fenced, nothing to restore, flow not found, database newer than the tool."""
    INTERNAL = 70
    """A bug in pgflow-cli itself (EX_SOFTWARE); rerun with --debug and report it."""
    INTERRUPTED = 130
    """Interrupted (Ctrl-C). For a fence this means "stopped watching", not "undone"."""

    @property
    def meaning(self) -> str:
        """One-line meaning, as printed in ``--help`` and docs/exit-codes.md."""
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "success, nothing blocking",
    ExitCode.FINDINGS: "ran fine and found a problem (audit findings, uncovered routes, migration refused by its recheck)",
    ExitCode.USAGE: "usage or configuration error",
    ExitCode.CONNECTION: "cannot connect or authenticate, or no pgflow schema where one is needed",
    ExitCode.LOCK_TIMEOUT: "lock or statement timeout after the bounded retries",
    ExitCode.DEADLINE: "a wait reached its deadline with work still in flight",
    ExitCode.CONFLICT: "state conflict (already fenced, nothing to restore, flow not found, database newer than the tool)",
    ExitCode.INTERNAL: "internal error in pgflow-cli (a bug: rerun with --debug and report it)",
    ExitCode.INTERRUPTED: "interrupted; for a fence: stopped watching, nothing undone",
}


def exit_code_table() -> str:
    """Return the exit-code table as aligned text lines (for ``--help`` epilogs)."""
    return "\n".join(f"{int(code):>4}  {code.meaning}" for code in ExitCode)


REASONS = {
    # cannot connect (exit 3): what the server, libpq or the socket said, never read from message text
    "wrong_password": "the server refused the password (or the role, which it does not reveal)",
    "password_required": "the server asks for a password and none was given",
    "database_missing": "the database does not exist on that server",
    "role_missing": "the role does not exist (a server that does not ask for a password says so)",
    "not_allowed": "pg_hba.conf has no rule letting this role connect to this database from here",
    "connection_refused": "nothing listens on that host and port (or Unix socket): the server is not running there",
    "host_unknown": "the host name does not resolve",
    "timeout": "the server did not answer within --connect-timeout",
    "too_many_connections": "the server has no free connection slot",
    "server_starting": "the server is starting up, shutting down or in recovery",
    "connection_failed": "cannot connect for another reason (see the message)",
    "connection_lost": "the server closed the connection while the command ran",
    # no pgflow schema where one is needed (exit 3)
    "schema_missing": "the database has no pgflow schema",
    "schema_behind": "the pgflow schema is at an earlier level than the command needs (migrations pending)",
    "object_missing": "a pgflow object is missing although no migration is pending",
}
"""Every ``reason`` an error may carry (``null`` in JSON when it has none), with its meaning
(docs/exit-codes.md "Reasons")."""

ERROR_DOCUMENT_KIND = "pgflow-cli/error"
ERROR_DOCUMENT_VERSION = 2
"""2: ``kind``, ``version`` and ``reason`` added (docs/schemas/error.schema.json)."""


class PgflowError(Exception):
    """Base class of every error the CLI reports without a traceback.

    Args:
        message: what went wrong, one sentence naming the object concerned.
        hint: how to fix it (may be empty).
        detail: extra lines shown below the message (e.g. one per offending row).
        exit_code: overrides the class default.
        reason: a key of :data:`REASONS` when scripts may need to tell this error apart from
            others with the same exit code, else None.
    """

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        detail: Iterable[str] = (),
        exit_code: ExitCode | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        if reason is not None and reason not in REASONS:
            raise ValueError(f"unknown error reason {reason!r}")
        self.message = message
        self.hint = hint
        self.detail = list(detail)
        self.reason = reason
        if exit_code is not None:
            self.exit_code = exit_code

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form used by ``--format json`` error output (docs/schemas/error.schema.json)."""
        return {
            "kind": ERROR_DOCUMENT_KIND,
            "version": ERROR_DOCUMENT_VERSION,
            "error": type(self).__name__,
            "exit_code": int(self.exit_code),
            "reason": self.reason,
            "message": self.message,
            "hint": self.hint,
            "detail": self.detail,
        }


class UsageError(PgflowError):
    """Bad option values, unreadable files, names that fail the slug rules (exit 2)."""

    exit_code = ExitCode.USAGE


class ConnectionFailed(PgflowError):
    """The server cannot be reached or refuses the credentials (exit 3)."""

    exit_code = ExitCode.CONNECTION


class SchemaMissing(PgflowError):
    """No pgflow schema (or no PGMQ) where the command needs one (exit 3)."""

    exit_code = ExitCode.CONNECTION


class LockTimeout(PgflowError):
    """A lock or statement timeout persisted through the bounded retries (exit 4)."""

    exit_code = ExitCode.LOCK_TIMEOUT


class DeadlineReached(PgflowError):
    """A wait ended at its deadline with work still in flight (exit 5)."""

    exit_code = ExitCode.DEADLINE


class StateConflict(PgflowError):
    """The database is in a state that forbids the action (exit 6)."""

    exit_code = ExitCode.CONFLICT


class Refused(PgflowError):
    """The command ran but refused to change anything because of findings (exit 1)."""

    exit_code = ExitCode.FINDINGS
