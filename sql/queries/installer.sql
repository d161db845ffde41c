-- Queries used by pgflow_cli.installer (the migration ledger). Named sections, run by name.

--@name ledger_bootstrap
-- Creates the ledger on first use, inside the first migration's transaction.
CREATE SCHEMA IF NOT EXISTS pgflow;
REVOKE ALL ON SCHEMA pgflow FROM PUBLIC;
CREATE TABLE IF NOT EXISTS pgflow.schema_migrations (
  version       integer     NOT NULL PRIMARY KEY,
  name          text        NOT NULL,
  checksum      text        NOT NULL,
  tool_version  text        NOT NULL,
  applied_by    text        NOT NULL DEFAULT session_user,
  applied_at    timestamptz NOT NULL DEFAULT now(),
  duration_ms   integer     NOT NULL,
  state         text        NOT NULL DEFAULT 'applied',
  phases_done   text[]      NOT NULL DEFAULT '{}',
  CONSTRAINT schema_migrations_state_check CHECK (state IN ('applied', 'in_progress'))
);
COMMENT ON TABLE pgflow.schema_migrations IS
  'migrations applied by pgflow-cli: one row per sql/migrations file, with its SHA-256 checksum';
REVOKE ALL ON pgflow.schema_migrations FROM PUBLIC;

--@name database_state
-- What is installed: the pgflow schema, its ledger, PGMQ. Catalog reads only.
SELECT
  to_regnamespace('pgflow') IS NOT NULL                       AS has_pgflow_schema,
  to_regclass('pgflow.schema_migrations') IS NOT NULL         AS has_ledger,
  to_regclass('pgflow.flows') IS NOT NULL                     AS has_flows_table,
  to_regnamespace('pgmq') IS NOT NULL                         AS has_pgmq_schema,
  to_regclass('pgmq.meta') IS NOT NULL                        AS has_pgmq_meta,
  (SELECT extversion FROM pg_extension WHERE extname = 'pgmq') AS pgmq_extension_version,
  obj_description(to_regnamespace('pgmq'), 'pg_namespace')    AS pgmq_schema_comment,
  current_setting('server_version_num')::integer              AS server_version_num,
  current_database()                                          AS database_name,
  -- the ledger's columns (a table of that name from another tool has other ones)
  coalesce((SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute AS a
            WHERE a.attrelid = to_regclass('pgflow.schema_migrations') AND a.attnum > 0 AND NOT a.attisdropped),
           '{}')                                              AS ledger_columns,
  -- what else the pgflow schema holds: relations (tables, views, sequences, types) and functions
  (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = to_regnamespace('pgflow')
     AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'c', 'f'))::integer AS pgflow_relations,
  (SELECT count(*) FROM pg_proc AS p WHERE p.pronamespace = to_regnamespace('pgflow'))::integer AS pgflow_functions;

--@name writable
-- Whether this session can write: not a hot standby, not a read-only session.
SELECT pg_is_in_recovery()                              AS in_recovery,
       current_setting('default_transaction_read_only') AS default_read_only,
       current_setting('transaction_read_only')         AS read_only;

--@name ledger_rows
SELECT version, name, checksum, tool_version, applied_by, applied_at, duration_ms, state, phases_done
FROM pgflow.schema_migrations
ORDER BY version;

--@name ledger_record
-- Records a finished migration, or the progress of a phased one (state 'in_progress').
INSERT INTO pgflow.schema_migrations (version, name, checksum, tool_version, duration_ms, state, phases_done)
VALUES (%(version)s, %(name)s, %(checksum)s, %(tool_version)s, %(duration_ms)s, %(state)s, %(phases_done)s)
ON CONFLICT (version) DO UPDATE
  SET checksum = EXCLUDED.checksum,
      tool_version = EXCLUDED.tool_version,
      applied_by = session_user,
      applied_at = now(),
      duration_ms = pgflow.schema_migrations.duration_ms + EXCLUDED.duration_ms,
      state = EXCLUDED.state,
      phases_done = EXCLUDED.phases_done;

--@name ledger_forget
DELETE FROM pgflow.schema_migrations WHERE version = %(version)s AND state = 'in_progress';

--@name estimated_rows
-- Planner estimate of a table's rows (no scan); -1 when the table was never analysed.
SELECT CASE WHEN c.reltuples < 0 THEN -1 ELSE c.reltuples::bigint END AS estimate
FROM pg_class AS c
WHERE c.oid = to_regclass(%(table)s);

--@name migrator_try_lock
-- Session-level advisory lock: two migrators can never interleave. Key: ('pgfw', 0).
SELECT pg_try_advisory_lock(1885824631, 0) AS locked;

--@name migrator_unlock
SELECT pg_advisory_unlock(1885824631, 0) AS unlocked;

--@name migrator_lock_holder
-- The session holding the migrator lock; it takes the lock right after connecting, so its
-- connection time is when it started migrating. Advisory locks belong to one database: a
-- migrator of another database on the same server holds its own.
SELECT a.pid, a.application_name, a.usename AS user_name, a.state,
       to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC' AS since,
       extract(epoch FROM (clock_timestamp() - a.backend_start))::integer AS connected_seconds
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = 1885824631 AND l.objid = 0 AND l.granted
  AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND l.pid <> pg_backend_pid();

--@name lock_table
-- One lock of a migration's lock plan; the runner fills in the table (as quoted identifiers) and
-- the mode (from the fixed list installer.files.LOCK_MODES).
LOCK TABLE {table} IN {mode} MODE;

--@name lock_table_nowait
-- The same, but never queued: fails at once (55P03) when another session holds a conflicting lock.
LOCK TABLE {table} IN {mode} MODE NOWAIT;

--@name lock_contention
-- Asked by the lock plan while it holds some of its locks and the next one (%(table)s) is taken:
--   cycle:  a session holding %(table)s in one of %(conflicting)s (pg_locks spelling) is waiting,
--           directly or through others, for this session: waiting for it would be a deadlock;
--   oldest_wait_seconds: how long the longest lock wait of this database has lasted. Each waiter
--           checks for a deadlock once, deadlock_timeout after its wait began (pg_locks.waitstart
--           is that moment), so the plan may only wait until the oldest waiter's check comes.
WITH RECURSIVE waiting AS (
  SELECT l.pid, pg_catalog.pg_blocking_pids(l.pid) AS blockers,
         coalesce(l.waitstart, pg_catalog.clock_timestamp()) AS waitstart
  FROM pg_catalog.pg_locks AS l
  JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid AND a.datname = pg_catalog.current_database()
  WHERE NOT l.granted AND l.pid <> pg_catalog.pg_backend_pid()
),
waiting_for_me (pid) AS (
  SELECT w.pid FROM waiting AS w WHERE pg_catalog.pg_backend_pid() = ANY (w.blockers)
  UNION
  SELECT w.pid FROM waiting AS w JOIN waiting_for_me AS m ON m.pid = ANY (w.blockers)
)
SELECT EXISTS (SELECT 1
               FROM pg_catalog.pg_locks AS h
               JOIN waiting_for_me AS m ON m.pid = h.pid
               WHERE h.granted AND h.locktype = 'relation'
                 AND h.relation = pg_catalog.to_regclass(%(table)s)
                 AND h.mode = ANY (%(conflicting)s::text[])) AS cycle,
       coalesce(extract(epoch FROM pg_catalog.clock_timestamp() - (SELECT min(w.waitstart) FROM waiting AS w)),
                0)::float8 AS oldest_wait_seconds;

--@name local_lock_timeout
SELECT set_config('lock_timeout', %(value)s, true);

--@name bounded_statement
-- A backfill range in its own transaction: its lock waits and the statement itself end within
-- this (the runner's 0.75 * deadlock_timeout), so its row locks never form a deadlock anyone sees.
SELECT set_config('lock_timeout', %(value)s, true), set_config('statement_timeout', %(value)s, true);

--@name deadlock_timeout_ms
-- The server's deadlock_timeout: a lock waiter checks for a deadlock after this long.
SELECT setting::integer AS ms FROM pg_settings WHERE name = 'deadlock_timeout';

--@name index_validity
-- Whether an index exists and is valid (a failed CREATE INDEX CONCURRENTLY leaves it invalid).
SELECT i.indisvalid AS valid
FROM pg_index AS i
WHERE i.indexrelid = to_regclass(%(index)s);

--@name drop_index_concurrently
-- Drops an invalid index left by a failed concurrent build; the runner fills in the index name.
DROP INDEX CONCURRENTLY IF EXISTS {index};

--@name invalid_indexes
-- Invalid indexes in the pgflow schema (left by an interrupted CREATE INDEX CONCURRENTLY).
SELECT n.nspname || '.' || c.relname AS index_name, t.relname AS table_name
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_class AS t ON t.oid = i.indrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'pgflow' AND NOT i.indisvalid
ORDER BY 1;

--@name session_lock_timeout
-- Session-level lock_timeout for statements that cannot run in a transaction (CONCURRENTLY).
SELECT set_config('lock_timeout', %(value)s, false);
--@end

--@name migrator_xact_lock
-- The migrators' advisory lock (key as migrator_try_lock), held to the end of the transaction:
-- `migrate apply --sql` scripts wait for any running migrator, and it for them.
SELECT pg_advisory_xact_lock(1885824631, 0)

--@name schema_facts
-- The relational schema of pgflow, one row per object: kind, name, detail. Catalog reads only.
-- What a ledger of an earlier build is compared with before it is converted (installer.old_levels):
--   table       relname                  its comment
--   column      table.column             type [not null] [default ...] [identity ...] [-- comment] (by name:
--                                        a table's column order depends on how it was built, adoption included)
--   attribute   type.attribute           position: type (composite types: the order is the type)
--   constraint  table.constraint         definition [NOT VALID] [-- comment]
--   index       index name               definition [INVALID]
--   trigger     table.trigger            definition [disabled]
-- The ledger's own tables (schema_migrations, schema_migration_files) and the adoption record are
-- left out: they are the installer's, not the runtime's.
WITH ns AS (
  SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'pgflow'
), rel AS (
  SELECT c.oid, c.relname, c.relkind
  FROM pg_catalog.pg_class AS c
  WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'p', 'c')
    AND c.relname NOT IN ('schema_migrations', 'schema_migration_files', 'schema_adoption')
)
SELECT 'table' AS kind, r.relname::text AS name, coalesce(pg_catalog.obj_description(r.oid, 'pg_class'), '') AS detail
FROM rel AS r
WHERE r.relkind IN ('r', 'p')
UNION ALL
SELECT CASE r.relkind WHEN 'c' THEN 'attribute' ELSE 'column' END,
       r.relname || '.' || a.attname,
       CASE r.relkind WHEN 'c' THEN pg_catalog.row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum) || ': ' ELSE '' END
         || pg_catalog.format_type(a.atttypid, a.atttypmod)
         || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
         || coalesce(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
         || CASE a.attidentity WHEN 'a' THEN ' generated always as identity'
                               WHEN 'd' THEN ' generated by default as identity' ELSE '' END
         || coalesce(' -- ' || pg_catalog.col_description(r.oid, a.attnum), '')
FROM rel AS r
JOIN pg_catalog.pg_attribute AS a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
UNION ALL
SELECT 'constraint', r.relname || '.' || k.conname,
       pg_catalog.pg_get_constraintdef(k.oid) || CASE WHEN k.convalidated THEN '' ELSE ' NOT VALID' END
         || coalesce(' -- ' || pg_catalog.obj_description(k.oid, 'pg_constraint'), '')
FROM pg_catalog.pg_constraint AS k
JOIN rel AS r ON r.oid = k.conrelid
UNION ALL
SELECT 'index', i.relname::text,
       pg_catalog.pg_get_indexdef(x.indexrelid) || CASE WHEN x.indisvalid THEN '' ELSE ' INVALID' END
FROM pg_catalog.pg_index AS x
JOIN pg_catalog.pg_class AS i ON i.oid = x.indexrelid
JOIN rel AS r ON r.oid = x.indrelid
UNION ALL
SELECT 'trigger', r.relname || '.' || t.tgname,
       pg_catalog.pg_get_triggerdef(t.oid) || CASE t.tgenabled WHEN 'D' THEN ' disabled' ELSE '' END
FROM pg_catalog.pg_trigger AS t
JOIN rel AS r ON r.oid = t.tgrelid
WHERE NOT t.tgisinternal
ORDER BY 1, 2;

--@name function_definitions
-- Every function of pgflow as the catalog holds it, for the comparison with the function files
-- (installer.catalog.function_drift): its body and the options a CREATE FUNCTION states.
SELECT p.proname::text AS name,
       pg_catalog.pg_get_function_identity_arguments(p.oid) AS arguments,
       p.prosrc AS body,
       l.lanname::text AS language,
       p.provolatile::text AS volatility,
       p.prosecdef AS security_definer,
       p.proisstrict AS strict,
       coalesce(p.proconfig, '{}') AS config
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
WHERE p.pronamespace = pg_catalog.to_regnamespace('pgflow')
ORDER BY 1, 2;

--@name drop_file_ledger
-- The per-file ledger of an earlier build (its --@apply migrations recorded each function file).
DROP TABLE IF EXISTS pgflow.schema_migration_files;

--@name ledger_replace_old_levels
-- The rows of an earlier build's migrations 0003-0016 become the one row of the migration that
-- replaces them (installer.old_levels: the conversion).
DELETE FROM pgflow.schema_migrations WHERE version BETWEEN %(first)s AND %(last)s;

--@name drop_function
-- A function of an earlier build that the current migration no longer creates; the runner fills in
-- its signature as the catalog writes it (installer.old_levels.LEVEL_16_FUNCTIONS).
DROP FUNCTION {function};

--@name function_rows
-- Where each function of pgflow is stored: a CREATE OR REPLACE writes a new row version, so a
-- function whose row did not move was not created by the text that ran in between.
SELECT p.oid::regprocedure::text AS signature, p.ctid::text AS row_version
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = pg_catalog.to_regnamespace('pgflow');
