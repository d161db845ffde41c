-- Claims a worker's batch after classifying EVERY message, by persisted task identity
-- (queue_name, message_id) first and message body second, before changing anything:
--
--   queued task of this exact route, run and step started -> claimed: attempt counted, worker
--       recorded, visibility = effective step timeout + 2 s (all or nothing, as the baseline's start_tasks);
--       a message whose visibility the read already set to within 1 s of that is kept as it is
--       (only locked, not rewritten: a worker that knows its steps' timeout reads with it)
--   started task                      -> duplicate: no attempt used, no handler; the message
--       is deferred toward the task's recovery deadline (started_at + timeout + 30 s)
--   completed/failed/skipped/cancelled or permanently stalled task -> archived_terminal
--   no task, body not pgflow-shaped   -> archived_foreign (WARNING with queue and ids)
--   message already gone              -> missing (nothing to do)
--   anything ambiguous: no task but a pgflow-shaped body, a body that does not match its
--   task (a missing key or a NULL body is a mismatch), a task on another route, a task that
--   cannot run, a queue the worker's route does not own (a queue that does not exist
--   included), a queue whose queue table or archive table is missing
--   -> fatal: nothing claimed, no task changed, nothing archived; the whole batch
--   is made visible again, the worker's function is paused (worker_functions.enabled =
--   false, paused_reason) and the worker deprecated. These safety writes are RETURNED as an
--   outcome, not raised, so they commit; the worker logs one error and stops.
--
-- A call for another route than the worker id registered raises PF007 (nothing changed, no
-- function paused: the row belongs to whoever registered it last), as an unregistered id does.
-- Ordinary database errors still raise (and roll back): they are retryable. Notices carry
-- queue names and message ids, never message bodies.
-- Every lookup is by a unique key (the run and step state too), so a claim costs the
-- same next to 1,000 or 1,000,000 rows, with or without statistics. One statement
-- classifies the whole batch and claims its queued work (only when no message is fatal): a batch
-- of plain queued work runs the route check, the two lock statements, the body read, that
-- statement and the visibility helper.
-- Lock order: runs (FOR KEY SHARE) -> step_tasks (FOR UPDATE, key order) -> queue rows. The
-- messages are read after the task locks, so a claim that waited for a concurrent claim of
-- the same tasks sees that claim's result (duplicates), not the state before it. The run lock is
-- the weakest that still takes turns with every report that can end a step or the run, fail or
-- cancel it (those hold the run FOR UPDATE); a completion that only counts its step down holds it
-- FOR NO KEY UPDATE, which a claim does not wait for (docs/runtime.md "Lock order").
CREATE OR REPLACE FUNCTION pgflow.claim_tasks(
  queue_name text,
  msg_ids bigint[],
  worker_id uuid,
  flow_slug text,
  step_slug text DEFAULT NULL
)
RETURNS SETOF pgflow.claim_result
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
-- Every statement is key-driven whatever the planner knows (tests/claim/test_index_driven.py), so
-- each is planned once per session instead of five custom plans first (each call of a fresh
-- session otherwise re-planned every statement: about half of its CPU).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
  v_ids bigint[];
  v_registered boolean;
  v_function text;
  v_w_flow text;
  v_w_queue text;
  v_w_step text;
  v_flow_found boolean;
  v_mode text;
  v_step_owned boolean;
  v_route_reason text;
  v_qtable text;
  v_has_qtable boolean;
  v_found bigint[];
  v_bodies jsonb[];
  v_vts timestamptz[];
  -- the whole batch's answer, one row per requested id in message-id order
  v_result pgflow.claim_result[];
  v_fatal integer;
  v_pause text;
  -- visibility changes through the helper: claimed tasks (effective timeout + 2 s) and
  -- duplicates (toward their recovery deadline)
  v_c_run uuid[];
  v_c_step text[];
  v_c_index integer[];
  v_c_offset integer[];
  v_kept bigint[];  -- claimed messages whose visibility is already within 1 s of the claim's target
  v_d_run uuid[];
  v_d_step text[];
  v_d_index integer[];
  v_d_offset integer[];
  v_claimable integer;
  v_claimed integer;
  v_changed integer;
  v_terminal integer;
  v_foreign bigint[];
BEGIN
  -- The batch, the worker's registration and the route, in one look-up.
  SELECT (SELECT pg_catalog.array_agg(DISTINCT m ORDER BY m) FROM pg_catalog.unnest(claim_tasks.msg_ids) AS m WHERE m IS NOT NULL),
         w.worker_id IS NOT NULL, w.function_name, w.flow_slug, w.queue_name, w.step_slug,
         f.flow_slug IS NOT NULL, f.queue_mode,
         EXISTS (SELECT 1 FROM pgflow.steps AS s
                 WHERE s.flow_slug = claim_tasks.flow_slug AND s.step_slug = claim_tasks.step_slug
                   AND s.queue_name = claim_tasks.queue_name)
  INTO v_ids, v_registered, v_function, v_w_flow, v_w_queue, v_w_step, v_flow_found, v_mode, v_step_owned
  FROM (SELECT) AS one
  LEFT JOIN pgflow.workers AS w ON w.worker_id = claim_tasks.worker_id
  LEFT JOIN pgflow.flows AS f ON f.flow_slug = claim_tasks.flow_slug;
  IF v_ids IS NULL THEN
    RETURN;
  END IF;
  IF NOT v_registered THEN
    RAISE EXCEPTION 'worker % is not registered; register it (pgflow.register_worker) before claiming', claim_tasks.worker_id
      USING ERRCODE = 'PF007';
  END IF;

  -- The worker's route: a plain flow's worker polls lower(flow_slug) and selects no step; a
  -- step worker polls exactly its step's persisted queue.
  IF NOT v_flow_found THEN
    v_route_reason := 'unknown_flow';
  ELSIF v_mode = 'flow' AND claim_tasks.step_slug IS NOT NULL THEN
    v_route_reason := 'step_selector_on_plain_flow';
  ELSIF v_mode = 'flow' AND claim_tasks.queue_name IS DISTINCT FROM pg_catalog.lower(claim_tasks.flow_slug COLLATE "C") THEN
    v_route_reason := 'queue_not_owned_by_route';
  ELSIF v_mode = 'step' AND NOT v_step_owned THEN
    v_route_reason := 'queue_not_owned_by_route';
  ELSIF v_w_flow IS NOT NULL
        AND (v_w_flow, v_w_queue, v_w_step)
            IS DISTINCT FROM (claim_tasks.flow_slug, claim_tasks.queue_name, claim_tasks.step_slug) THEN
    -- The route the worker registered is the one it may claim from (coverage trusts it). A
    -- consistent call for another route under this id is a stale process (the row was pruned
    -- and the id registered again) or a misconfigured one: refused, and nothing is paused or
    -- deprecated, because the row belongs to whoever registered it last.
    RAISE EXCEPTION 'worker id % is registered for flow "%" (queue "%"%), not for flow "%" (queue "%"%) this call claims for: nothing was claimed',
      claim_tasks.worker_id, v_w_flow, v_w_queue,
      coalesce(', step "' || v_w_step || '"', ''), claim_tasks.flow_slug, claim_tasks.queue_name,
      coalesce(', step "' || claim_tasks.step_slug || '"', '')
      USING ERRCODE = 'PF007',
            HINT = 'this process is stale or misconfigured: stop it; a worker id belongs to one registration (docs/claim-protocol.md)';
  END IF;

  -- The queue's own tables: without the queue table nothing can be read, without the archive
  -- table no task could ever be completed or failed; both stop the worker before any handler runs.
  v_qtable := pgmq.format_table_name(claim_tasks.queue_name, 'q');
  v_has_qtable := pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', v_qtable)) IS NOT NULL;
  IF v_route_reason IS NULL AND NOT v_has_qtable THEN
    v_route_reason := 'queue_table_missing';
  ELSIF v_route_reason IS NULL AND pg_catalog.to_regclass(
          pg_catalog.format('pgmq.%I', pgmq.format_table_name(claim_tasks.queue_name, 'a'))) IS NULL THEN
    v_route_reason := 'archive_table_missing';
  END IF;

  -- Lock what the classification reads, in the runtime's order.
  -- Every row is reached by its own unique-key probe (a LATERAL ... LIMIT 1 is never turned into
  -- a join), so no statistics can make a lock scan step_tasks or runs; the driving arrays are in
  -- lock order (the lock happens inside the probe, row by row).
  PERFORM 1 FROM pg_catalog.unnest(ARRAY(
    SELECT DISTINCT st.run_id FROM pg_catalog.unnest(v_ids) AS m CROSS JOIN LATERAL (
      SELECT x.run_id FROM pgflow.step_tasks AS x WHERE x.queue_name = claim_tasks.queue_name AND x.message_id = m LIMIT 1) AS st
    ORDER BY 1)) AS k (run_id)
  CROSS JOIN LATERAL (SELECT x.run_id FROM pgflow.runs AS x WHERE x.run_id = k.run_id LIMIT 1) AS r
  ORDER BY r.run_id
  FOR KEY SHARE;
  PERFORM 1 FROM pg_catalog.unnest(ARRAY(
    SELECT st.message_id FROM pg_catalog.unnest(v_ids) AS m CROSS JOIN LATERAL (
      SELECT x.* FROM pgflow.step_tasks AS x WHERE x.queue_name = claim_tasks.queue_name AND x.message_id = m LIMIT 1) AS st
    ORDER BY st.run_id, st.step_slug, st.task_index)) AS k (message_id)
  CROSS JOIN LATERAL (SELECT x.run_id, x.step_slug, x.task_index FROM pgflow.step_tasks AS x
                      WHERE x.queue_name = claim_tasks.queue_name AND x.message_id = k.message_id LIMIT 1) AS t
  ORDER BY t.run_id, t.step_slug, t.task_index
  FOR UPDATE;

  -- The messages, read after the task locks (a concurrent claim of the same tasks has committed
  -- by now) and locked in message-id order: each is written below anyway (visibility, archive),
  -- except a claimed one whose visibility the claim keeps, which the lock keeps in the queue until
  -- the claim commits. A queue without a table has no messages (the batch is fatal, see above).
  IF v_has_qtable THEN
    EXECUTE pg_catalog.format(
      'SELECT pg_catalog.array_agg(x.msg_id ORDER BY x.msg_id), pg_catalog.array_agg(x.message ORDER BY x.msg_id),
              pg_catalog.array_agg(x.vt ORDER BY x.msg_id)
         FROM (SELECT q.msg_id, q.message, q.vt FROM pgmq.%I AS q WHERE q.msg_id = ANY ($1) ORDER BY q.msg_id FOR UPDATE) AS x',
      v_qtable)
    INTO v_found, v_bodies, v_vts
    USING v_ids;
  END IF;

  -- Classify the whole batch and, only when no message is fatal, claim its queued work, in one
  -- statement: the claim UPDATE reads the classification it belongs to, so nothing changes
  -- before every message has its verdict.
  WITH requested AS (
    SELECT m AS msg_id FROM pg_catalog.unnest(v_ids) AS m
  ), body AS (
    SELECT b.msg_id, b.message, b.vt
    FROM ROWS FROM (pg_catalog.unnest(coalesce(v_found, '{}')), pg_catalog.unnest(coalesce(v_bodies, '{}')),
                    pg_catalog.unnest(coalesce(v_vts, '{}'))) AS b (msg_id, message, vt)
  ), joined AS (
    SELECT rq.msg_id,
           b.msg_id IS NOT NULL AS present,
           b.message,
           b.vt,
           t.tid, t.flow_slug AS task_flow, t.run_id, t.step_slug AS task_step, t.task_index, t.status, t.started_at,
           t.permanently_stalled_at,
           r.status AS run_status, ss.status AS step_status,
           s.step_type, s.deps_count,
           coalesce(s.opt_timeout, f.opt_timeout) AS timeout
    FROM requested AS rq
    LEFT JOIN body AS b ON b.msg_id = rq.msg_id
    -- one unique-index probe per message, whatever the table size (a join here may hash a full scan);
    -- the task row is locked by this transaction, so its ctid is the row the claim updates
    LEFT JOIN LATERAL (
      SELECT st.ctid AS tid, st.* FROM pgflow.step_tasks AS st
      WHERE st.queue_name = claim_tasks.queue_name AND st.message_id = rq.msg_id
      LIMIT 1  -- unique anyway; keeps the planner from flattening this into a hash join
    ) AS t ON true
    -- run and step state by key too: one probe each per message
    LEFT JOIN LATERAL (SELECT x.status FROM pgflow.runs AS x WHERE x.run_id = t.run_id LIMIT 1) AS r ON true
    LEFT JOIN LATERAL (SELECT x.status FROM pgflow.step_states AS x
                       WHERE x.run_id = t.run_id AND x.step_slug = t.step_slug LIMIT 1) AS ss ON true
    LEFT JOIN LATERAL (SELECT x.opt_timeout, x.step_type, x.deps_count FROM pgflow.steps AS x
                       WHERE x.flow_slug = t.flow_slug AND x.step_slug = t.step_slug LIMIT 1) AS s ON true
    LEFT JOIN LATERAL (SELECT x.opt_timeout FROM pgflow.flows AS x WHERE x.flow_slug = t.flow_slug LIMIT 1) AS f ON true
  ), judged AS MATERIALIZED (  -- each verdict computed once, however often it is read
    SELECT j.*,
           -- the read left the message hidden until within 1 s of the claim's target (effective
           -- timeout + 2 s from now): the claim keeps that visibility instead of rewriting the row
           pg_catalog.abs(EXTRACT(epoch FROM (j.vt - pg_catalog.clock_timestamp()))
                          - (j.timeout + 2)) <= 1 AS vt_kept,
           CASE
             WHEN v_route_reason IS NOT NULL THEN ARRAY['fatal', v_route_reason]
             WHEN NOT j.present THEN ARRAY['missing', CASE WHEN j.run_id IS NULL THEN 'message_gone' ELSE 'message_gone_task_exists' END]
             WHEN j.run_id IS NOT NULL THEN
               CASE
                 -- IS NOT TRUE: a NULL body or a missing key is a mismatch, never "unknown"
                 WHEN (pg_catalog.jsonb_typeof(j.message) = 'object'
                       AND j.message -> 'flow_slug' = pg_catalog.to_jsonb(j.task_flow)
                       AND j.message -> 'run_id' = pg_catalog.to_jsonb(j.run_id::text)
                       AND j.message -> 'step_slug' = pg_catalog.to_jsonb(j.task_step)
                       AND j.message -> 'task_index' = pg_catalog.to_jsonb(j.task_index)) IS NOT TRUE
                   THEN ARRAY['fatal', 'message_does_not_match_task']
                 WHEN j.task_flow <> claim_tasks.flow_slug
                      OR (claim_tasks.step_slug IS NOT NULL AND j.task_step <> claim_tasks.step_slug)
                   THEN ARRAY['fatal', 'task_on_another_route']
                 WHEN j.status IN ('completed', 'failed', 'skipped', 'cancelled')
                   THEN ARRAY['archived_terminal', 'task_' || j.status]
                 WHEN j.permanently_stalled_at IS NOT NULL
                   THEN ARRAY['archived_terminal', 'task_permanently_stalled']
                 WHEN j.status = 'started'
                   THEN ARRAY['duplicate', 'task_started']
                 WHEN j.status = 'queued' AND j.run_status = 'started' AND j.step_status = 'started'
                   THEN ARRAY['claim', NULL]
                 ELSE ARRAY['fatal', 'task_not_claimable']
               END
             WHEN pg_catalog.jsonb_typeof(j.message) = 'object'
                  AND j.message ?& ARRAY['flow_slug', 'run_id', 'step_slug', 'task_index']
               THEN ARRAY['fatal', CASE WHEN j.message -> 'flow_slug' = pg_catalog.to_jsonb(claim_tasks.flow_slug)
                                        THEN 'task_missing' ELSE 'work_for_another_flow' END]
             WHEN pg_catalog.jsonb_typeof(j.message) = 'object'
                  AND j.message ?| ARRAY['flow_slug', 'run_id', 'step_slug', 'task_index']
               THEN ARRAY['fatal', 'ambiguous_message']
             ELSE ARRAY['archived_foreign', 'not_pgflow_work']
           END AS verdict
    FROM joined AS j
  ), batch AS (
    SELECT pg_catalog.count(*) FILTER (WHERE x.verdict[1] = 'fatal')::integer AS fatal FROM judged AS x
  ), sources AS MATERIALIZED (
    -- what the batch's map tasks index into, one row per (run, map step): the run input of a root
    -- map, else the output of the map's single dependency (read by key)
    SELECT k.run_id::text || k.task_step AS key,
           CASE WHEN k.deps_count = 0
                THEN (SELECT x.input FROM pgflow.runs AS x WHERE x.run_id = k.run_id LIMIT 1)
                ELSE (SELECT ds.output FROM pgflow.deps AS d
                      CROSS JOIN LATERAL (SELECT y.output FROM pgflow.step_states AS y
                                          WHERE y.run_id = k.run_id AND y.step_slug = d.dep_slug LIMIT 1) AS ds
                      WHERE d.flow_slug = k.task_flow AND d.step_slug = k.task_step LIMIT 1)
           END AS doc
    FROM (SELECT DISTINCT x.run_id, x.task_flow, x.task_step, x.deps_count FROM judged AS x
          WHERE x.verdict[1] = 'claim' AND x.step_type = 'map') AS k
  ), claimed AS (
    -- Claim: a guarded update of exactly the eligible tasks (they are locked and queued). Each
    -- task's handler input is built in the same statement: a map task gets its array element (the
    -- run input for a root map, else its single dependency's output); a single step gets
    -- {dependency: output} of its completed dependencies ({} for a root step); flow_input is the
    -- run input for root single steps only.
    UPDATE pgflow.step_tasks AS t
       SET status = 'started',
           attempts_count = t.attempts_count + 1,
           -- the moment of the claim, not of the statement's start: a claim that waited for a lock
           -- counts its recovery deadline (started_at + timeout + 30 s) from when it took the task
           started_at = pg_catalog.clock_timestamp(),
           last_worker_id = claim_tasks.worker_id
      -- the task row by its ctid (locked above, so it cannot move): no index choice is left to the
      -- planner, however many queued siblings share the task's (run_id, step_slug)
      FROM judged AS c
      -- the run input, only where it is the flow input (a root single step)
      LEFT JOIN LATERAL (SELECT x.input FROM pgflow.runs AS x
                         WHERE x.run_id = c.run_id AND c.step_type = 'single' AND c.deps_count = 0 LIMIT 1) AS r ON true
     WHERE t.ctid = c.tid AND c.verdict[1] = 'claim' AND (SELECT b.fatal FROM batch AS b) = 0
       AND t.status = 'queued'
    RETURNING t.message_id,
              CASE
                -- a map task's element: each run input or dependency output is read (and detoasted)
                -- once per claim into an array, not once per task (a 10,000-element array is large)
                WHEN c.step_type = 'map' THEN
                  (ARRAY(SELECT so.doc FROM sources AS so ORDER BY so.key))[pg_catalog.array_position(
                    ARRAY(SELECT so.key FROM sources AS so ORDER BY so.key), c.run_id::text || c.task_step)] -> t.task_index
                WHEN c.deps_count = 0 THEN '{}'::jsonb
                ELSE coalesce((
                  SELECT pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                  FROM pgflow.deps AS d
                  JOIN pgflow.step_states AS ds ON ds.run_id = t.run_id AND ds.step_slug = d.dep_slug
                  WHERE d.flow_slug = t.flow_slug AND d.step_slug = t.step_slug AND ds.status = 'completed'),
                  '{}'::jsonb)
              END AS input,
              r.input AS flow_input
  )
  SELECT pg_catalog.array_agg(ROW(
           CASE WHEN b.fatal > 0 THEN CASE WHEN j.verdict[1] = 'fatal' THEN 'fatal' ELSE 'released' END
                WHEN j.verdict[1] = 'claim' THEN 'claimed'
                ELSE j.verdict[1] END,
           j.msg_id,
           CASE WHEN b.fatal > 0 AND j.verdict[1] <> 'fatal' THEN 'batch_released' ELSE j.verdict[2] END,
           j.task_flow, j.run_id, j.task_step, j.task_index, cl.input, cl.flow_input)::pgflow.claim_result ORDER BY j.msg_id),
         pg_catalog.array_agg(j.run_id) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'claim' AND NOT j.vt_kept),
         pg_catalog.array_agg(j.task_step) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'claim' AND NOT j.vt_kept),
         pg_catalog.array_agg(j.task_index) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'claim' AND NOT j.vt_kept),
         pg_catalog.array_agg(j.timeout + 2) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'claim' AND NOT j.vt_kept),
         pg_catalog.array_agg(j.msg_id ORDER BY j.msg_id) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'claim' AND j.vt_kept),
         pg_catalog.array_agg(j.run_id) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'duplicate'),
         pg_catalog.array_agg(j.task_step) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'duplicate'),
         pg_catalog.array_agg(j.task_index) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'duplicate'),
         pg_catalog.array_agg(GREATEST(2, pg_catalog.ceil(EXTRACT(epoch FROM (
           j.started_at + pg_catalog.make_interval(secs => j.timeout + 30) - pg_catalog.clock_timestamp())))::integer))
           FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'duplicate'),
         pg_catalog.count(*) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'claim')::integer,
         pg_catalog.count(cl.message_id)::integer,
         pg_catalog.count(*) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'archived_terminal')::integer,
         pg_catalog.array_agg(j.msg_id ORDER BY j.msg_id) FILTER (WHERE b.fatal = 0 AND j.verdict[1] = 'archived_foreign'),
         pg_catalog.min(b.fatal)
  INTO v_result, v_c_run, v_c_step, v_c_index, v_c_offset, v_kept, v_d_run, v_d_step, v_d_index, v_d_offset,
       v_claimable, v_claimed, v_terminal, v_foreign, v_fatal
  FROM judged AS j
  CROSS JOIN batch AS b
  LEFT JOIN claimed AS cl ON cl.message_id = j.msg_id;

  IF v_fatal > 0 THEN
    -- Safety writes only: the batch becomes visible again and the function is paused.
    IF v_found IS NOT NULL THEN
      EXECUTE pg_catalog.format('UPDATE pgmq.%I AS q SET vt = pg_catalog.clock_timestamp() WHERE q.msg_id = ANY ($1)', v_qtable)
      USING v_found;
    END IF;
    SELECT pg_catalog.format('fatal claim by worker %s in queue "%s": %s', claim_tasks.worker_id, claim_tasks.queue_name,
             pg_catalog.string_agg(pg_catalog.format('message %s %s', x.message_id, x.reason), ', ' ORDER BY x.message_id))
    INTO v_pause
    FROM pg_catalog.unnest(v_result) AS x
    WHERE x.outcome = 'fatal';
    INSERT INTO pgflow.worker_functions AS wf (function_name, enabled, paused_at, paused_reason, updated_at)
    VALUES (v_function, false, pg_catalog.clock_timestamp(), v_pause, pg_catalog.clock_timestamp())
    -- A function already paused by a fatal claim (another of its workers) keeps its first pause
    -- time and collects every reason, so the operator sees every preserved message at once
    -- (bounded: a reason that would grow past 8000 characters is not extended).
    ON CONFLICT (function_name) DO UPDATE
      SET enabled = false,
          paused_at = CASE WHEN wf.enabled OR wf.paused_reason IS NULL THEN EXCLUDED.paused_at ELSE wf.paused_at END,
          paused_reason = CASE
                            WHEN wf.enabled OR wf.paused_reason IS NULL THEN EXCLUDED.paused_reason
                            WHEN pg_catalog.length(wf.paused_reason) + pg_catalog.length(EXCLUDED.paused_reason) > 8000
                              THEN wf.paused_reason
                            ELSE wf.paused_reason || '; ' || EXCLUDED.paused_reason
                          END,
          updated_at = EXCLUDED.updated_at;
    UPDATE pgflow.workers AS w SET deprecated_at = coalesce(w.deprecated_at, pg_catalog.now())
    WHERE w.worker_id = claim_tasks.worker_id;
    RAISE WARNING 'pgflow: %; nothing was claimed, the batch is visible again and worker function "%" is paused', v_pause, v_function
      USING HINT = 'inspect the messages by id (SELECT msg_id, read_ct, enqueued_at FROM pgmq.q_<queue> WHERE msg_id = ...), fix the cause, then enable the function again (docs/claim-protocol.md)';

    RETURN QUERY SELECT * FROM pg_catalog.unnest(v_result) AS x ORDER BY x.message_id;
    RETURN;
  END IF;

  IF v_claimed <> v_claimable THEN
    -- cannot happen: every claimable task is locked by this transaction and was queued
    RAISE EXCEPTION 'claim_tasks(): claimed % of % claimable tasks in queue "%"; the claim was rolled back',
      v_claimed, v_claimable, claim_tasks.queue_name
      USING ERRCODE = 'P0001';
  END IF;

  IF v_claimed > 0 THEN
    -- a kept visibility counts as set: its message was there when read and is locked since
    v_changed := pgflow._set_task_messages_vt(v_c_run, v_c_step, v_c_index, v_c_offset)
                 + coalesce(pg_catalog.cardinality(v_kept), 0);
    IF v_changed < v_claimed THEN
      RAISE EXCEPTION 'claim_tasks(): visibility updated % of % claimed messages in queue "%"; the claim was rolled back and no attempt was consumed',
        v_changed, v_claimed, claim_tasks.queue_name
        USING ERRCODE = 'P0001',
              HINT = 'a claimed task''s message is missing from its queue; check for code that archives or deletes pgflow messages directly';
    END IF;
  END IF;

  -- Duplicates: defer toward the existing recovery deadline (never a fresh full timeout).
  IF v_d_run IS NOT NULL THEN
    PERFORM pgflow._set_task_messages_vt(v_d_run, v_d_step, v_d_index, v_d_offset);
  END IF;

  -- Late messages of finished tasks: archive (idempotent).
  IF v_terminal > 0 THEN
    PERFORM pgflow._archive_task_messages(
      ARRAY(SELECT x.run_id FROM pg_catalog.unnest(v_result) AS x WHERE x.outcome = 'archived_terminal'),
      ARRAY(SELECT x.step_slug FROM pg_catalog.unnest(v_result) AS x WHERE x.outcome = 'archived_terminal'),
      ARRAY(SELECT x.task_index FROM pg_catalog.unnest(v_result) AS x WHERE x.outcome = 'archived_terminal'));
  END IF;

  -- Clearly foreign messages: archive, warn with ids only.
  IF v_foreign IS NOT NULL THEN
    PERFORM pgmq.archive(claim_tasks.queue_name, v_foreign);
    RAISE WARNING 'pgflow: archived % foreign message(s) in queue "%" (message ids %): not pgflow work',
      pg_catalog.cardinality(v_foreign), claim_tasks.queue_name, pg_catalog.array_to_string(v_foreign, ', ')
      USING HINT = 'applications must not send to pgflow-owned queues; the archived messages stay in the queue''s archive table';
  END IF;

  RETURN QUERY SELECT * FROM pg_catalog.unnest(v_result) AS x ORDER BY x.message_id;
END;
$$;
