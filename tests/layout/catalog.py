"""Catalog snapshots of the pgflow schema's routines, types, views and triggers, for exact comparisons."""

from __future__ import annotations

import psycopg

DEFINITIONS = """
SELECT 'function ' || p.oid::regprocedure::text AS object,
       pg_catalog.pg_get_functiondef(p.oid) || coalesce(' ACL ' || p.proacl::text, '') AS definition
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace AND p.prokind IN ('f', 'p')
UNION ALL
SELECT 'type ' || t.typname,
       (SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod), ', '
                                     ORDER BY a.attnum)
        FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = t.typrelid AND a.attnum > 0)
FROM pg_catalog.pg_type AS t JOIN pg_catalog.pg_class AS c ON c.oid = t.typrelid
WHERE t.typnamespace = 'pgflow'::regnamespace AND t.typtype = 'c' AND c.relkind = 'c'
UNION ALL
SELECT 'view ' || c.relname, pg_catalog.pg_get_viewdef(c.oid)
FROM pg_catalog.pg_class AS c
WHERE c.relnamespace = 'pgflow'::regnamespace AND c.relkind IN ('v', 'm')
UNION ALL
SELECT 'trigger ' || tg.tgname, pg_catalog.pg_get_triggerdef(tg.oid)
FROM pg_catalog.pg_trigger AS tg JOIN pg_catalog.pg_class AS c ON c.oid = tg.tgrelid
WHERE c.relnamespace = 'pgflow'::regnamespace AND NOT tg.tgisinternal
ORDER BY 1
"""


def definitions(conn: psycopg.Connection) -> dict[str, str]:
    """Every function, composite type, view and trigger of the pgflow schema -> its definition text."""
    return dict(conn.execute(DEFINITIONS).fetchall())


PRIVILEGES = """
SELECT 'function', p.oid::regprocedure::text, coalesce(p.proacl::text, '') FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace
UNION ALL
SELECT 'relation', c.oid::regclass::text, coalesce(c.relacl::text, '') FROM pg_catalog.pg_class AS c
WHERE c.relnamespace = 'pgflow'::regnamespace AND c.relname NOT IN ('schema_migrations', 'schema_adoption')
UNION ALL
SELECT 'schema', n.nspname, coalesce(n.nspacl::text, '') FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'pgflow'
ORDER BY 1, 2
"""


def identity(conn: psycopg.Connection) -> dict[str, object]:
    """What two databases that claim to be the same schema must share: every function (with its body,
    options, comment and ACL), composite type and trigger; the relational schema (tables, columns,
    defaults, constraints, indexes, triggers, comments: ``installer.catalog.read_schema_facts``); and
    the privileges of functions, relations and the schema. The ledger and an adoption record are left
    out (they say how the schema got there)."""
    from pgflow_cli.installer.catalog import read_schema_facts

    facts = read_schema_facts(conn)
    return {"definitions": definitions(conn),
            "schema": {f"{kind} {name}": detail for kind, found in facts.items() for name, detail in found.items()},
            "privileges": conn.execute(PRIVILEGES).fetchall()}


def differences(mine: dict[str, object], theirs: dict[str, object]) -> list[str]:
    """The parts of two :func:`identity` results that differ, each with its first differing keys."""
    out = []
    for part, value in mine.items():
        other = theirs[part]
        if value == other:
            continue
        if isinstance(value, dict) and isinstance(other, dict):
            keys = sorted({k for k in set(value) | set(other) if value.get(k) != other.get(k)}, key=str)
            out.append(f"{part}: {keys[:5]}")
        else:
            out.append(f"{part}: {sorted(set(value) ^ set(other))[:5]}")  # type: ignore[arg-type]
    return out
