"""Byte-level fingerprints of a database, to prove that a refused or interrupted change left it as it was.

:func:`fingerprint` hashes ``pg_dump --schema-only`` and ``pg_dump --data-only`` of the pgflow and
pgmq schemas (catalog and rows), plus the attribute numbers of every pgflow/pgmq table (a column
added and dropped again leaves a trace there that pg_dump does not show).
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass

import psycopg

from pgflow_cli.sandbox import find_bindir


@dataclass(frozen=True)
class Fingerprint:
    schema: str
    data: str
    attributes: tuple

    def differences(self, other: Fingerprint) -> list[str]:
        return [name for name in ("schema", "data", "attributes") if getattr(self, name) != getattr(other, name)]


def _dump(conninfo: str, *flags: str) -> str:
    pg_dump = str(find_bindir() / "pg_dump")
    out = subprocess.run(
        [pg_dump, "--no-owner", "--no-privileges", "--schema=pgflow", "--schema=pgmq", *flags, "-d", conninfo],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    # Drop the lines that differ between two dumps of the same state: version banners and the
    # random \restrict key newer pg_dump releases add.
    volatile = ("-- Dumped", "\\restrict", "\\unrestrict")
    return "\n".join(line for line in out.splitlines() if not line.startswith(volatile))


def fingerprint(conninfo: str) -> Fingerprint:
    """Fingerprint the pgflow and pgmq schemas of the database at ``conninfo``."""
    with psycopg.connect(conninfo) as conn:
        attributes = tuple(conn.execute(
            """
            SELECT c.relname, a.attnum, a.attname, a.attisdropped
            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname IN ('pgflow', 'pgmq') AND c.relkind IN ('r', 'p') AND a.attnum > 0
            ORDER BY 1, 2
            """
        ).fetchall())
    schema = hashlib.sha256(_dump(conninfo, "--schema-only").encode()).hexdigest()
    data = hashlib.sha256(_dump(conninfo, "--data-only").encode()).hexdigest()
    return Fingerprint(schema, data, attributes)
