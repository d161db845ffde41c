-- pgflow upgrade audit: a read-only report of everything the queue-identity release rejects
-- or should know about (docs/audit.md).
--
-- `pgflow audit` runs the three named statements below, in this order, in one
-- REPEATABLE READ, READ ONLY transaction. The same text, with includes expanded, ships as
-- sql/dist/pgflow_audit.sql for `psql -f` (regenerate: pgflow audit --print-sql).
--
-- Privileges: USAGE on the schemas pgflow and pgmq, SELECT on their tables. Nothing is
-- created, written or executed beyond built-in functions; the transaction is rolled back.
\set ON_ERROR_STOP on
\pset pager off
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '10min';

--@name session_settings
-- JIT compilation would cost far more than these queries take (this transaction only).
SET LOCAL jit = off;

--@name schema_probe
-- What is installed, read from the catalogs only: the pgflow tables and their columns, PGMQ
-- and its version, the privileges the audit needs. One row.
WITH ns AS (
  SELECT n.oid, n.nspname::text AS nspname
  FROM pg_catalog.pg_namespace AS n
  WHERE n.nspname IN ('pgflow', 'pgmq')
),
rels AS (
  SELECT ns.nspname, c.oid, c.relname::text AS relname, c.relkind
  FROM pg_catalog.pg_class AS c
  JOIN ns ON ns.oid = c.relnamespace
  WHERE c.relkind IN ('r', 'p')
)
SELECT
  current_database()::text                                       AS database_name,
  current_user::text                                             AS role_name,
  current_setting('server_version')                              AS server_version,
  current_setting('server_version_num')::integer                 AS server_version_num,
  now()                                                          AS audited_at,
  EXISTS (SELECT 1 FROM ns WHERE nspname = 'pgflow')             AS has_pgflow_schema,
  (SELECT has_schema_privilege(oid, 'USAGE') FROM ns WHERE nspname = 'pgflow') AS pgflow_usage,
  coalesce((
    SELECT jsonb_object_agg(r.relname, jsonb_build_object(
             'columns', (SELECT coalesce(jsonb_agg(a.attname::text ORDER BY a.attnum), '[]'::jsonb)
                           FROM pg_catalog.pg_attribute AS a
                          WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped),
             'select', has_table_privilege(r.oid, 'SELECT')))
    FROM rels AS r
    WHERE r.nspname = 'pgflow'), '{}'::jsonb)                   AS pgflow_tables,
  EXISTS (SELECT 1 FROM ns WHERE nspname = 'pgmq')               AS has_pgmq_schema,
  (SELECT has_schema_privilege(oid, 'USAGE') FROM ns WHERE nspname = 'pgmq') AS pgmq_usage,
  EXISTS (SELECT 1 FROM rels WHERE nspname = 'pgmq' AND relname = 'meta') AS has_pgmq_meta,
  (SELECT has_table_privilege(oid, 'SELECT') FROM rels WHERE nspname = 'pgmq' AND relname = 'meta') AS pgmq_meta_select,
  (SELECT extversion::text FROM pg_catalog.pg_extension WHERE extname = 'pgmq') AS pgmq_extension_version,
  (SELECT obj_description(oid, 'pg_namespace') FROM ns WHERE nspname = 'pgmq') AS pgmq_schema_comment,
  EXISTS (
    SELECT 1
    FROM pg_catalog.pg_type AS t
    JOIN ns ON ns.oid = t.typnamespace AND ns.nspname = 'pgmq'
    JOIN pg_catalog.pg_attribute AS a ON a.attrelid = t.typrelid
    WHERE t.typname = 'message_record' AND a.attname = 'headers' AND a.attnum > 0 AND NOT a.attisdropped
  )                                                              AS pgmq_message_headers,
  (SELECT count(*) FROM rels
    WHERE nspname = 'pgmq' AND relname LIKE 'q\_%')::integer      AS pgmq_queue_tables,
  (SELECT count(*) FROM rels
    WHERE nspname = 'pgmq' AND (relname LIKE 'q\_%' OR relname LIKE 'a\_%')
      AND NOT has_table_privilege(oid, 'SELECT'))::integer       AS pgmq_unreadable_tables;

--@name findings
-- Every finding, one row each (columns and check ids: docs/audit.md). The same statement is
-- rerun by the queue-identity migration under its locks; rows with blocking = true make it refuse.
--@include audit/findings.sql
;

--@name flow_impact
-- Data at stake per flow: runs, tasks, queue backlog and archive size.
--
-- Queue tables are counted through query_to_xml(), so every per-queue table is read inside
-- this one statement; a missing or unreadable table yields NULLs, never an error. Reading a
-- table keeps its ACCESS SHARE locks (table and indexes, about 3 per queue) until the
-- transaction ends, so exact counts are taken only while the flows use at most
-- 4 x max_locks_per_transaction queue tables (256 with the default 64, ~10% of a default lock
-- table); beyond that the backlog comes from the activity statistics (pg_stat n_live_tup, no
-- lock) and backlog_exact is false. Archive rows and sizes are estimates from the catalog alone
-- (pg_class.reltuples; pg_class.relpages of the table, its TOAST table and all their indexes, as
-- of the last VACUUM, ANALYZE or index build): no archive table is opened or locked.
WITH
flows_x AS NOT MATERIALIZED (
--@include audit/flows.sql
),
steps_x AS NOT MATERIALIZED (
--@include audit/steps.sql
),
flow_queues AS (
--@include audit/flow_queues.sql
),
pgmq_rel AS (
  SELECT c.oid, c.relname::text AS relname, c.reltuples, c.reltoastrelid
  FROM pg_catalog.pg_class AS c
  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
  WHERE n.nspname = 'pgmq' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
),
queue_tables AS (
  SELECT DISTINCT q_table FROM flow_queues
),
-- each queue's archive table, its TOAST table and all their indexes
archive_parts AS (
  SELECT k.q_table, at.oid, at.reltoastrelid
  FROM queue_tables AS k
  JOIN pgmq_rel AS at ON at.relname = 'a_' || substr(k.q_table, 3)
),
archive_rels AS (
  SELECT ap.q_table, ap.oid FROM archive_parts AS ap
  UNION ALL
  SELECT ap.q_table, ap.reltoastrelid FROM archive_parts AS ap WHERE ap.reltoastrelid <> 0
),
-- their pages per queue, one catalog lookup per relation (pg_class.relpages)
archive_pages AS (
  SELECT r.q_table, sum(c.relpages)::bigint AS pages
  FROM (
    SELECT ar.q_table, ar.oid FROM archive_rels AS ar
    UNION ALL
    SELECT ar.q_table, x.indexrelid
    FROM archive_rels AS ar
    JOIN pg_catalog.pg_index AS x ON x.indrelid = ar.oid
  ) AS r
  JOIN pg_catalog.pg_class AS c ON c.oid = r.oid
  GROUP BY r.q_table
),
budget AS (
  SELECT (SELECT count(*) FROM queue_tables)
           <= 4 * current_setting('max_locks_per_transaction')::integer AS exact
),
queue_stats AS (
  SELECT k.q_table,
         b.exact,
         qt.oid IS NOT NULL AS has_queue_table,
         qt.oid IS NOT NULL AND b.exact AND NOT has_table_privilege(qt.oid, 'SELECT') AS unreadable,
         CASE
           WHEN b.exact AND qt.oid IS NOT NULL AND has_table_privilege(qt.oid, 'SELECT') THEN
             query_to_xml(
               format('SELECT count(*) AS messages, '
                      || 'round(extract(epoch FROM now() - min(enqueued_at))::numeric, 3) AS oldest_age '
                      || 'FROM pgmq.%I', qt.relname),
               false, true, '')
         END AS stats,
         CASE WHEN NOT b.exact AND qt.oid IS NOT NULL THEN pg_stat_get_live_tuples(qt.oid) END AS estimated,
         CASE WHEN at.reltuples >= 0 THEN at.reltuples::bigint END AS archive_rows_estimate,
         ap.pages * current_setting('block_size')::bigint AS archive_bytes
  FROM queue_tables AS k
  CROSS JOIN budget AS b
  LEFT JOIN pgmq_rel AS qt ON qt.relname = k.q_table
  LEFT JOIN pgmq_rel AS at ON at.relname = 'a_' || substr(k.q_table, 3)
  LEFT JOIN archive_pages AS ap ON ap.q_table = k.q_table
),
per_queue AS (
  SELECT qs.q_table,
         qs.exact,
         qs.has_queue_table,
         qs.unreadable,
         coalesce((xpath('/row/messages/text()', qs.stats))[1]::text::bigint, qs.estimated) AS messages,
         (xpath('/row/oldest_age/text()', qs.stats))[1]::text::numeric AS oldest_age,
         qs.archive_rows_estimate,
         qs.archive_bytes
  FROM queue_stats AS qs
),
per_flow_queues AS (
  SELECT fq.flow_slug,
         array_agg(fq.queue_name ORDER BY fq.queue_name COLLATE "C") AS queue_names,
         count(*) FILTER (WHERE NOT pq.has_queue_table) AS queues_missing,
         count(*) FILTER (WHERE pq.unreadable) AS queues_unreadable,
         sum(pq.messages)::bigint AS queue_backlog,
         bool_and(pq.exact) AS backlog_exact,
         max(pq.oldest_age) AS oldest_message_age_seconds,
         sum(pq.archive_rows_estimate)::bigint AS archive_rows_estimate,
         sum(pq.archive_bytes)::bigint AS archive_bytes
  FROM flow_queues AS fq
  JOIN per_queue AS pq ON pq.q_table = fq.q_table
  GROUP BY fq.flow_slug
),
sharing AS (
  SELECT mine.flow_slug,
         array_agg(DISTINCT (o.flow_slug COLLATE "C") ORDER BY (o.flow_slug COLLATE "C")) AS shares_queue_with
  FROM flow_queues AS mine
  JOIN flow_queues AS o ON o.q_table = mine.q_table AND o.flow_slug <> mine.flow_slug
  GROUP BY mine.flow_slug
),
step_counts AS (
  SELECT s.flow_slug, count(*) AS steps
  FROM steps_x AS s
  GROUP BY s.flow_slug
),
runs_agg AS (
  SELECT r.flow_slug,
         count(*) AS total_runs,
         count(*) FILTER (WHERE r.status = 'started') AS active_runs
  FROM pgflow.runs AS r
  GROUP BY r.flow_slug
),
tasks_agg AS (
--@include audit/open_tasks.sql
)
SELECT f.flow_slug,
       f.queue_mode,
       coalesce(sc.steps, 0)::integer AS steps,
       coalesce(r.total_runs, 0)::bigint AS total_runs,
       coalesce(r.active_runs, 0)::bigint AS active_runs,
       coalesce(t.queued_tasks, 0)::bigint AS queued_tasks,
       coalesce(t.started_tasks, 0)::bigint AS started_tasks,
       coalesce(q.queue_names, ARRAY[]::text[]) AS queue_names,
       coalesce(q.queues_missing, 0)::integer AS queues_missing,
       coalesce(q.queues_unreadable, 0)::integer AS queues_unreadable,
       q.queue_backlog,
       coalesce(q.backlog_exact, true) AS backlog_exact,
       q.oldest_message_age_seconds,
       q.archive_rows_estimate,
       q.archive_bytes,
       coalesce(sh.shares_queue_with, ARRAY[]::text[]) AS shares_queue_with
FROM flows_x AS f
LEFT JOIN step_counts AS sc ON sc.flow_slug = f.flow_slug
LEFT JOIN runs_agg AS r ON r.flow_slug = f.flow_slug
LEFT JOIN tasks_agg AS t ON t.flow_slug = f.flow_slug
LEFT JOIN per_flow_queues AS q ON q.flow_slug = f.flow_slug
LEFT JOIN sharing AS sh ON sh.flow_slug = f.flow_slug
ORDER BY f.flow_slug COLLATE "C";
--@end

ROLLBACK;
