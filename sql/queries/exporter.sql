-- pgflow exporter: what the exporter reads beyond the queries of `pgflow status`, `pgflow coverage`,
-- `pgflow fence status` and the migration ledger, which it runs as they are (docs/observability.md).

--@name write_privileges
-- What the connected role could change in pgflow's or PGMQ's data: tables it may INSERT into,
-- UPDATE, DELETE from or TRUNCATE, and SECURITY DEFINER functions that are not read-only and that
-- it may EXECUTE (they write with their owner's rights). A superuser has every privilege. The
-- exporter only reads; a role that can write is refused unless --allow-write-role.
SELECT 'table ' || pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS object
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname IN ('pgflow', 'pgmq') AND c.relkind IN ('r', 'p')
  AND pg_catalog.has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname IN ('pgflow', 'pgmq') AND p.prosecdef AND p.provolatile = 'v'
  AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE')
ORDER BY 1;

--@name fence_read_missing
-- True where the database has the fence record but the role may not run the function `pgflow fence
-- status` reads it with (pgflow._fence_holds, revoked from PUBLIC like every pgflow function).
SELECT pg_catalog.to_regprocedure('pgflow._fence_holds(pgflow.fences, pgflow.worker_functions)') IS NOT NULL
       AND NOT pg_catalog.has_function_privilege(
             'pgflow._fence_holds(pgflow.fences, pgflow.worker_functions)'::regprocedure, 'EXECUTE') AS missing;
--@end
