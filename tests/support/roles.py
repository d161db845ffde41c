"""The cluster-wide group roles of docs/permissions.md ("Three roles") for tests."""

from __future__ import annotations

import psycopg


def ensure_group(conn: psycopg.Connection, name: str) -> str:
    """Create the NOLOGIN group role ``name`` unless it exists (roles are shared by every database of
    the server, so parallel tests may race to create it); returns the name."""
    conn.execute(f"DO $$ BEGIN CREATE ROLE {name} NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation "
                 "THEN NULL; END $$")
    return name
