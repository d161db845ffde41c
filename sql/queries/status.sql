-- pgflow status: what runs, per flow (docs/commands/status.md). Read-only: every statement runs
-- in one READ ONLY, REPEATABLE READ transaction (one snapshot), and needs only USAGE on the
-- schemas pgflow and pgmq and SELECT on their tables.
-- The same text runs on every schema level the tool knows (columns that arrived later are read
-- through to_jsonb(row) or picked by the caller), from the protocol-1 baseline to the latest.
--
-- Parameter of every statement: %(flow)s text, one exact flow slug, or NULL for every flow.

--@name now
SELECT pg_catalog.clock_timestamp();

--@name flows
SELECT f.flow_slug
FROM pgflow.flows AS f
WHERE %(flow)s::text IS NULL OR f.flow_slug = %(flow)s::text
ORDER BY f.flow_slug COLLATE "C";

--@name capabilities
-- stalled_recovery: pgflow.requeue_stalled_tasks() exists (not on an upstream-installed schema, whose
-- tasks come back when their message's visibility timeout runs out: nothing is "stalled" there);
-- manual_tasks: step_tasks.execution_mode exists (migration 0003), which picks the stalled rule;
-- worker_routes: workers.flow_slug exists (this tool's schema), which the worker liveness rule reads.
SELECT pg_catalog.to_regprocedure('pgflow.requeue_stalled_tasks()') IS NOT NULL AS stalled_recovery,
       EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
               WHERE attrelid = 'pgflow.workers'::regclass AND attname = 'flow_slug' AND NOT attisdropped)
         AS worker_routes,
       EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
               WHERE attrelid = 'pgflow.step_tasks'::regclass AND attname = 'execution_mode' AND NOT attisdropped)
         AS manual_tasks;

--@name runs_by_state
SELECT r.flow_slug, r.status, pg_catalog.count(*)::integer AS runs
FROM pgflow.runs AS r
WHERE %(flow)s::text IS NULL OR r.flow_slug = %(flow)s::text
GROUP BY r.flow_slug, r.status;

--@name tasks_by_state
SELECT t.flow_slug, t.status, pg_catalog.count(*)::integer AS tasks
FROM pgflow.step_tasks AS t
WHERE %(flow)s::text IS NULL OR t.flow_slug = %(flow)s::text
GROUP BY t.flow_slug, t.status;

--@name manual_waiting
-- Per flow the tasks of manual steps waiting for their outcome (status started, execution_mode
-- manual: no worker runs them, trusted code completes them; docs/manual-tasks.md). Only where
-- step_tasks.execution_mode exists (capabilities.manual_tasks).
SELECT t.flow_slug, pg_catalog.count(*)::integer AS waiting
FROM pgflow.step_tasks AS t
WHERE t.status = 'started' AND t.execution_mode = 'manual'
  AND (%(flow)s::text IS NULL OR t.flow_slug = %(flow)s::text)
GROUP BY t.flow_slug;

--@name oldest_queued
-- Per flow the queued task that has waited longest (since queued_at: its first queueing or its
-- last requeue by a retry or stalled recovery), in seconds.
SELECT DISTINCT ON (t.flow_slug)
       t.flow_slug, t.run_id, t.step_slug, t.task_index, t.queued_at,
       pg_catalog.round(extract(epoch FROM pg_catalog.clock_timestamp() - t.queued_at)::numeric, 3)::float8
         AS age_seconds
FROM pgflow.step_tasks AS t
WHERE t.status = 'queued'
  AND (%(flow)s::text IS NULL OR t.flow_slug = %(flow)s::text)
ORDER BY t.flow_slug, t.queued_at, t.run_id, t.step_slug, t.task_index;

--@name stalled
-- Stalled tasks: exactly the candidates the next pgflow.requeue_stalled_tasks() call takes (its
-- rule, written as the function's file writes it: tests/status/test_status.py compares the two),
-- plus the tasks an earlier call gave up on (permanently_stalled_at set: still started, message
-- archived, nobody will finish them).
WITH candidates AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    JOIN pgflow.runs AS r ON r.run_id = t.run_id
    JOIN pgflow.step_states AS ss ON ss.run_id = t.run_id AND ss.step_slug = t.step_slug
    JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
    JOIN pgflow.flows AS f ON f.flow_slug = t.flow_slug
    WHERE t.status = 'started'
      AND t.execution_mode = 'queue'  -- a manual task has no worker and no message to recover
      AND t.permanently_stalled_at IS NULL
      AND r.status = 'started'
      AND ss.status = 'started'
      AND t.started_at < pg_catalog.now() - pg_catalog.make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
)
--@include fragments/stalled_by_step.sql

--@name stalled_before_manual_tasks
-- The same on the baseline (no step_tasks.execution_mode): the rule without its manual-task line,
-- which is how the baseline's requeue_stalled_tasks reads.
WITH candidates AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    JOIN pgflow.runs AS r ON r.run_id = t.run_id
    JOIN pgflow.step_states AS ss ON ss.run_id = t.run_id AND ss.step_slug = t.step_slug
    JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
    JOIN pgflow.flows AS f ON f.flow_slug = t.flow_slug
    WHERE t.status = 'started'
      AND t.permanently_stalled_at IS NULL
      AND r.status = 'started'
      AND ss.status = 'started'
      AND t.started_at < pg_catalog.now() - pg_catalog.make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
)
--@include fragments/stalled_by_step.sql

--@name queues
-- Every PGMQ queue (pgmq.meta) with the numbers pgmq.metrics() gives, counted straight from its
-- table: pgmq.metrics() itself fails on some real queues (a name at the identifier limit, whose
-- sequence name PostgreSQL cuts into the table's; a table dropped behind PGMQ's back), and one
-- such queue must not hide the others. messages NULL: the table is missing or not readable.
-- Each queue carries the flow that uses it (a plain flow's queue or a step's private queue),
-- matched on the physical table as PGMQ derives it, by the audit's fragments, so pre-upgrade
-- spellings match too; flow_slug NULL: no flow uses it (listed only without --flow).
WITH flows_x AS (
--@include audit/flows.sql
), steps_x AS (
--@include audit/steps.sql
), flow_queues AS (
--@include audit/flow_queues.sql
), queue_tables AS (
  -- one row per physical table: meta names equal ignoring case (a pre-upgrade case alias) share
  -- one table; the first name in C order stands for it, the others are its aliases
  SELECT (pg_catalog.array_agg(mm.queue_name ORDER BY mm.queue_name COLLATE "C"))[1] AS queue_name,
         (pg_catalog.array_agg(mm.queue_name ORDER BY mm.queue_name COLLATE "C"))[2:] AS aliases,
         n.q_table, pg_catalog.min(c.oid::bigint)::oid AS relid
  FROM pgmq.meta AS mm
  CROSS JOIN LATERAL (SELECT ('q_' || pg_catalog.lower(mm.queue_name))::name::text AS q_table) AS n
  LEFT JOIN pg_catalog.pg_class AS c
    ON c.relname = n.q_table::name AND c.relnamespace = 'pgmq'::regnamespace AND c.relkind IN ('r', 'p')
  GROUP BY n.q_table
), counted AS (
  SELECT k.queue_name, k.aliases, k.q_table,
         CASE WHEN k.relid IS NOT NULL AND pg_catalog.has_table_privilege(k.relid, 'SELECT') THEN
           pg_catalog.query_to_xml(pg_catalog.format(
             'SELECT count(*) AS n, count(*) FILTER (WHERE vt <= clock_timestamp()) AS v, '
             || 'extract(epoch FROM clock_timestamp() - min(enqueued_at))::integer AS oldest, '
             || 'extract(epoch FROM clock_timestamp() - max(enqueued_at))::integer AS newest FROM %%s',
             k.relid::regclass), false, true, '')
         END AS x
  FROM queue_tables AS k
)
SELECT fq.flow_slug,
       q.queue_name,
       q.aliases,
       coalesce(fq.origin, 'none') AS origin,
       (pg_catalog.xpath('/row/n/text()', q.x))[1]::text::bigint AS messages,
       (pg_catalog.xpath('/row/v/text()', q.x))[1]::text::bigint AS visible,
       (pg_catalog.xpath('/row/oldest/text()', q.x))[1]::text::integer AS oldest_message_age_seconds,
       (pg_catalog.xpath('/row/newest/text()', q.x))[1]::text::integer AS newest_message_age_seconds
FROM counted AS q
LEFT JOIN flow_queues AS fq ON fq.q_table = q.q_table
WHERE %(flow)s::text IS NULL OR fq.flow_slug = %(flow)s::text
ORDER BY fq.flow_slug COLLATE "C" NULLS LAST, q.queue_name COLLATE "C";

--@name workers
-- Worker rows that have not stopped, per flow, by the liveness rule and the route rule of `pgflow
-- coverage` (fragments/workers.sql, fragments/worker_routes.sql): live (heartbeat within
-- %(heartbeat_window)s seconds, not deprecated), deprecated (told to stop, still heartbeating:
-- draining), stale (no heartbeat in the window without stopping: killed). A worker counts for the
-- flow of every route it serves (one without a flow serves every route on its queue), once per flow.
WITH routes_x AS (
--@include fragments/routes.sql
), workers_x AS (
--@include fragments/workers.sql
), served AS (
--@include fragments/worker_routes.sql
), attributed AS (
  SELECT DISTINCT sv.flow_slug, w.worker_id, w.live, w.draining, w.stale
  FROM served AS sv
  JOIN workers_x AS w ON w.worker_id = sv.worker_id
  WHERE w.stopped_at IS NULL
)
SELECT a.flow_slug,
       pg_catalog.count(*) FILTER (WHERE a.live)::integer AS live,
       pg_catalog.count(*) FILTER (WHERE a.draining)::integer AS deprecated,
       pg_catalog.count(*) FILTER (WHERE a.stale)::integer AS stale
FROM attributed AS a
WHERE %(flow)s::text IS NULL OR a.flow_slug = %(flow)s::text
GROUP BY a.flow_slug;
--@end
