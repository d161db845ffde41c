"""PGMQ bootstrap: the PGMQ SQL bundled through the ``pgmq`` PyPI package, pinned.

pgflow-cli installs PGMQ only into databases that have none (the sandbox, tests, and
``migrate apply --install-pgmq``), from the SQL file the ``pgmq`` package ships. The version and
SHA-256 of that file are pinned here: a different ``pgmq`` release refuses to install instead of
silently installing another PGMQ, and the installed version is recorded in the ``pgmq`` schema's
comment.
"""

from __future__ import annotations

import hashlib
from importlib import metadata, resources

import psycopg
from psycopg import sql as pgsql

from pgflow_cli import __version__
from pgflow_cli.db import transaction
from pgflow_cli.errors import StateConflict
from pgflow_cli.installer.ledger import read_state

PGMQ_PACKAGE = "pgmq==1.1.4"
"""The ``pgmq`` PyPI release whose SQL pgflow-cli installs (also pinned in pyproject.toml)."""

PGMQ_SQL_VERSION = "1.13.0"
"""The PGMQ version of that SQL (the package's ``sql/VERSION``)."""

PGMQ_SQL_SHA256 = "bf7e66c75ed771df0c5f7cb2b9f0123ca77992daacd56e3911d1894a3efa99de"
"""SHA-256 of the package's ``sql/pgmq.sql``: the exact text a SQL install runs."""


def bundled_pgmq_sql() -> tuple[str, str]:
    """The PGMQ install script bundled in the ``pgmq`` PyPI package, and its version, checked against the pins.

    Returns:
        ``(version, sql_text)``: :data:`PGMQ_SQL_VERSION` and the text whose SHA-256 is
        :data:`PGMQ_SQL_SHA256`.

    Raises:
        StateConflict: the installed ``pgmq`` package ships another PGMQ (exit 6); nothing is
            installed, so a different release never silently changes the PGMQ a database gets.
    """
    base = resources.files("pgmq").joinpath("sql")
    version = base.joinpath("VERSION").read_text(encoding="utf-8").strip().splitlines()[0].strip()
    script = base.joinpath("pgmq.sql").read_bytes()
    if version != PGMQ_SQL_VERSION or hashlib.sha256(script).hexdigest() != PGMQ_SQL_SHA256:
        try:
            installed = metadata.version("pgmq")
        except metadata.PackageNotFoundError:
            installed = "unknown"
        raise StateConflict(
            f"the installed pgmq package ({installed}) bundles PGMQ SQL {version}, not the PGMQ {PGMQ_SQL_VERSION} "
            "this pgflow-cli release installs",
            hint=f"reinstall the pinned package (pip install '{PGMQ_PACKAGE}'), or install the pgmq extension "
            "yourself (CREATE EXTENSION pgmq) and run without --install-pgmq",
        )
    return version, script.decode("utf-8")


def ensure_pgmq(conn: psycopg.Connection) -> str | None:
    """Install PGMQ from the bundled SQL when the database has none.

    Runs in one transaction. Does nothing when a ``pgmq`` schema with its ``meta`` table
    exists (extension or SQL install).

    Returns:
        The version installed, or ``None`` when PGMQ was already there.
    """
    state = read_state(conn)
    if state.has_pgmq_meta:
        return None
    version, script = bundled_pgmq_sql()
    with transaction(conn, lock_timeout=30, statement_timeout=None):
        conn.execute(script)  # trusted, shipped SQL
        conn.execute(
            pgsql.SQL("COMMENT ON SCHEMA pgmq IS {}").format(
                pgsql.Literal(f"PGMQ {version} (SQL install by pgflow-cli {__version__}, "
                              f"sha256 {PGMQ_SQL_SHA256[:12]})")
            )
        )
    return version
