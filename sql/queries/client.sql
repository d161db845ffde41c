-- The run client (pgflow_cli.client): start runs, read one, await many. Starting and reading go
-- through pgflow's public functions (start_flow, start_flows, get_run_with_states); awaiting reads
-- pgflow.runs and, for a failed run, the failed step states and tasks (SELECT on those tables).
-- Every statement is one round trip on its own: no session state, no prepared statement needed, so a
-- transaction-mode connection pooler between the client and the server changes nothing.

--@name start
-- One run; %(input)s is JSON text or a Jsonb value. The run input is never read back.
SELECT r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at
FROM pgflow.start_flow(%(flow_slug)s::text, %(input)s::jsonb, %(run_id)s::uuid) AS r;

--@name start_many
-- One run per element of the JSON array %(inputs)s, in array order.
SELECT r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at
FROM pgflow.start_flows(%(flow_slug)s::text, %(inputs)s::jsonb) AS r;

--@name retry
-- A fresh run of a failed run's flow and input (pgflow.retry_run, migration 0003; an operator's call).
-- The new run restarts the run named (its pgflow.run_restarts row says so).
SELECT r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at,
       %(run_id)s::uuid AS restart_of_run_id, NULL::text AS cancel_reason
FROM pgflow.retry_run(%(run_id)s::uuid) AS r;

--@name resume
-- A run that reuses every task a failed run completed (pgflow.resume_run, migration 0003).
SELECT r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at,
       %(run_id)s::uuid AS restart_of_run_id, NULL::text AS cancel_reason
FROM pgflow.resume_run(%(run_id)s::uuid) AS r;

--@name cancel
-- Ends a started run failed with a reason (pgflow.cancel_run, migration 0003); a cancelled run is
-- returned as it is. Its cancel record is read by the next statement (cancel_record): rows the
-- function writes are not visible to the statement that calls it.
SELECT r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at
FROM pgflow.cancel_run(%(run_id)s::uuid, %(reason)s::text) AS r;

--@name cancel_record
-- A cancelled run's lineage and reason (pgflow.run_restarts, pgflow.run_cancellations: primary-key probes).
SELECT (SELECT rr.restart_of_run_id FROM pgflow.run_restarts AS rr WHERE rr.run_id = %(run_id)s::uuid),
       (SELECT c.reason FROM pgflow.run_cancellations AS c WHERE c.run_id = %(run_id)s::uuid);

--@name get
-- The run and its step states ({"run": {...}, "steps": [...]}); PF006 when there is no such run.
SELECT pgflow.get_run_with_states(%(run_id)s::uuid);

--@name poll
-- Where each awaited run stands: one index probe per run id, whatever the number of runs. A run
-- still started costs its status and step count only; an ended one brings its output (completed)
-- or its failed steps with their failed tasks (failed), so a waiter learns everything in the same
-- statement that tells it the run ended. A run id with no row is missing from the answer.
SELECT r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at,
       CASE WHEN r.status = 'completed' THEN r.output END AS output,
       CASE WHEN r.status = 'failed' THEN (
         SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                  'step_slug', ss.step_slug,
                  'error_message', ss.error_message,
                  'tasks', (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                                     'task_index', t.task_index, 'error_message', t.error_message,
                                     'attempts_count', t.attempts_count) ORDER BY t.task_index), '[]'::jsonb)
                            FROM (SELECT k.task_index, k.error_message, k.attempts_count
                                  FROM pgflow.step_tasks AS k
                                  WHERE k.run_id = ss.run_id AND k.step_slug = ss.step_slug AND k.status = 'failed'
                                  ORDER BY k.task_index
                                  LIMIT 20) AS t)
                ) ORDER BY s.step_index), '[]'::jsonb)
         FROM pgflow.step_states AS ss
         JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
         WHERE ss.run_id = r.run_id AND ss.status = 'failed') END AS failures
FROM pgflow.runs AS r
WHERE r.run_id = ANY (%(run_ids)s::uuid[]);
--@end
