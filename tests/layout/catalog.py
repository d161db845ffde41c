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
