-- Claims a worker's batch after classifying EVERY message, by persisted task identity
-- (queue_name, message_id) first and message body second, before changing anything:
--
--   queued task of this exact route, run and step started -> claimed: attempt counted, worker
--       recorded, visibility = effective step timeout + 2 s (all or nothing, as in 0002)
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
-- Every lookup is by a unique key (from 0010 the run and step state too), so a claim costs the
-- same next to 1,000 or 1,000,000 rows, with or without statistics.
-- Lock order: runs (FOR SHARE) -> step_tasks (FOR UPDATE, key order) -> queue rows. The
-- messages are read after the task locks, so a claim that waited for a concurrent claim of
-- the same tasks sees that claim's result (duplicates), not the state before it.
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
AS $$
#variable_conflict use_column
DECLARE
  v_ids bigint[];
  v_worker pgflow.workers;
  v_mode text;
  v_route_reason text;
  v_qtable text;
  v_found bigint[];
  v_bodies jsonb[];
  -- the classification, one element per requested id
  v_msg bigint[];
  v_verdict text[];
  v_reason text[];
  v_flow text[];
  v_run uuid[];
  v_step text[];
  v_index integer[];
  v_defer integer[];
  v_fatal integer;
  v_pause text;
  -- claimed tasks
  v_c_run uuid[];
  v_c_step text[];
  v_c_index integer[];
  v_c_offset integer[];
  v_c_msg bigint[];
  v_c_flow text[];
  v_c_input jsonb[];
  v_c_flow_input jsonb[];
  v_claimed integer;
  v_changed integer;
  v_foreign bigint[];
BEGIN
  SELECT pg_catalog.array_agg(DISTINCT m ORDER BY m) INTO v_ids
  FROM pg_catalog.unnest(claim_tasks.msg_ids) AS m WHERE m IS NOT NULL;
  IF v_ids IS NULL THEN
    RETURN;
  END IF;

  SELECT w.* INTO v_worker FROM pgflow.workers AS w WHERE w.worker_id = claim_tasks.worker_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'worker % is not registered; register it (pgflow.register_worker) before claiming', claim_tasks.worker_id
      USING ERRCODE = 'PF007';
  END IF;

  -- The worker's route: a plain flow's worker polls lower(flow_slug) and selects no step; a
  -- step worker polls exactly its step's persisted queue.
  SELECT f.queue_mode INTO v_mode FROM pgflow.flows AS f WHERE f.flow_slug = claim_tasks.flow_slug;
  IF NOT FOUND THEN
    v_route_reason := 'unknown_flow';
  ELSIF v_mode = 'flow' AND claim_tasks.step_slug IS NOT NULL THEN
    v_route_reason := 'step_selector_on_plain_flow';
  ELSIF v_mode = 'flow' AND claim_tasks.queue_name IS DISTINCT FROM pg_catalog.lower(claim_tasks.flow_slug COLLATE "C") THEN
    v_route_reason := 'queue_not_owned_by_route';
  ELSIF v_mode = 'step' AND NOT EXISTS (
          SELECT 1 FROM pgflow.steps AS s
          WHERE s.flow_slug = claim_tasks.flow_slug AND s.step_slug = claim_tasks.step_slug
            AND s.queue_name = claim_tasks.queue_name) THEN
    v_route_reason := 'queue_not_owned_by_route';
  ELSIF v_worker.flow_slug IS NOT NULL
        AND (v_worker.flow_slug, v_worker.queue_name, v_worker.step_slug)
            IS DISTINCT FROM (claim_tasks.flow_slug, claim_tasks.queue_name, claim_tasks.step_slug) THEN
    -- The route the worker registered is the one it may claim from (coverage trusts it). A
    -- consistent call for another route under this id is a stale process (the row was pruned
    -- and the id registered again) or a misconfigured one: refused, and nothing is paused or
    -- deprecated, because the row belongs to whoever registered it last.
    RAISE EXCEPTION 'worker id % is registered for flow "%" (queue "%"%), not for flow "%" (queue "%"%) this call claims for: nothing was claimed',
      claim_tasks.worker_id, v_worker.flow_slug, v_worker.queue_name,
      coalesce(', step "' || v_worker.step_slug || '"', ''), claim_tasks.flow_slug, claim_tasks.queue_name,
      coalesce(', step "' || claim_tasks.step_slug || '"', '')
      USING ERRCODE = 'PF007',
            HINT = 'this process is stale or misconfigured: stop it; a worker id belongs to one registration (docs/claim-protocol.md)';
  END IF;

  -- The queue's own tables: without the queue table nothing can be read, without the archive
  -- table no task could ever be completed or failed; both stop the worker before any handler runs.
  v_qtable := pgmq.format_table_name(claim_tasks.queue_name, 'q');
  IF v_route_reason IS NULL AND pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', v_qtable)) IS NULL THEN
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
  FOR SHARE;
  PERFORM 1 FROM pg_catalog.unnest(ARRAY(
    SELECT st.message_id FROM pg_catalog.unnest(v_ids) AS m CROSS JOIN LATERAL (
      SELECT x.* FROM pgflow.step_tasks AS x WHERE x.queue_name = claim_tasks.queue_name AND x.message_id = m LIMIT 1) AS st
    ORDER BY st.run_id, st.step_slug, st.task_index)) AS k (message_id)
  CROSS JOIN LATERAL (SELECT x.run_id, x.step_slug, x.task_index FROM pgflow.step_tasks AS x
                      WHERE x.queue_name = claim_tasks.queue_name AND x.message_id = k.message_id LIMIT 1) AS t
  ORDER BY t.run_id, t.step_slug, t.task_index
  FOR UPDATE;

  -- The messages, read after the task locks (a concurrent claim of the same tasks has committed
  -- by now). A queue without a table has no messages (the batch is fatal, see above).
  IF pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', v_qtable)) IS NOT NULL THEN
    EXECUTE pg_catalog.format(
      'SELECT pg_catalog.array_agg(q.msg_id ORDER BY q.msg_id), pg_catalog.array_agg(q.message ORDER BY q.msg_id)
         FROM pgmq.%I AS q WHERE q.msg_id = ANY ($1)', v_qtable)
    INTO v_found, v_bodies
    USING v_ids;
  END IF;

  WITH requested AS (
    SELECT m AS msg_id FROM pg_catalog.unnest(v_ids) AS m
  ), body AS (
    SELECT b.msg_id, b.message
    FROM ROWS FROM (pg_catalog.unnest(coalesce(v_found, '{}')), pg_catalog.unnest(coalesce(v_bodies, '{}'))) AS b (msg_id, message)
  ), joined AS (
    SELECT rq.msg_id,
           b.msg_id IS NOT NULL AS present,
           b.message,
           t.flow_slug AS task_flow, t.run_id, t.step_slug AS task_step, t.task_index, t.status, t.started_at,
           t.permanently_stalled_at,
           r.status AS run_status, ss.status AS step_status,
           coalesce(s.opt_timeout, f.opt_timeout) AS timeout
    FROM requested AS rq
    LEFT JOIN body AS b ON b.msg_id = rq.msg_id
    -- one unique-index probe per message, whatever the table size (a join here may hash a full scan)
    LEFT JOIN LATERAL (
      SELECT st.* FROM pgflow.step_tasks AS st
      WHERE st.queue_name = claim_tasks.queue_name AND st.message_id = rq.msg_id
      LIMIT 1  -- unique anyway; keeps the planner from flattening this into a hash join
    ) AS t ON true
    -- run and step state by key too: one probe each per message (0010)
    LEFT JOIN LATERAL (SELECT x.status FROM pgflow.runs AS x WHERE x.run_id = t.run_id LIMIT 1) AS r ON true
    LEFT JOIN LATERAL (SELECT x.status FROM pgflow.step_states AS x
                       WHERE x.run_id = t.run_id AND x.step_slug = t.step_slug LIMIT 1) AS ss ON true
    LEFT JOIN LATERAL (SELECT x.opt_timeout FROM pgflow.steps AS x
                       WHERE x.flow_slug = t.flow_slug AND x.step_slug = t.step_slug LIMIT 1) AS s ON true
    LEFT JOIN LATERAL (SELECT x.opt_timeout FROM pgflow.flows AS x WHERE x.flow_slug = t.flow_slug LIMIT 1) AS f ON true
  ), judged AS MATERIALIZED (  -- each verdict computed once, however often it is read
    SELECT j.*,
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
  )
  SELECT pg_catalog.array_agg(jd.msg_id ORDER BY jd.msg_id),
         pg_catalog.array_agg(jd.verdict[1] ORDER BY jd.msg_id),
         pg_catalog.array_agg(jd.verdict[2] ORDER BY jd.msg_id),
         pg_catalog.array_agg(jd.task_flow ORDER BY jd.msg_id),
         pg_catalog.array_agg(jd.run_id ORDER BY jd.msg_id),
         pg_catalog.array_agg(jd.task_step ORDER BY jd.msg_id),
         pg_catalog.array_agg(jd.task_index ORDER BY jd.msg_id),
         pg_catalog.array_agg(
           CASE WHEN jd.verdict[1] = 'duplicate' THEN
             GREATEST(2, pg_catalog.ceil(EXTRACT(epoch FROM (
               jd.started_at + pg_catalog.make_interval(secs => jd.timeout + 30) - pg_catalog.clock_timestamp())))::integer)
           END ORDER BY jd.msg_id),
         pg_catalog.count(*) FILTER (WHERE jd.verdict[1] = 'fatal')::integer
  INTO v_msg, v_verdict, v_reason, v_flow, v_run, v_step, v_index, v_defer, v_fatal
  FROM judged AS jd;

  IF v_fatal > 0 THEN
    -- Safety writes only: the batch becomes visible again and the function is paused.
    IF v_found IS NOT NULL THEN
      EXECUTE pg_catalog.format('UPDATE pgmq.%I AS q SET vt = pg_catalog.clock_timestamp() WHERE q.msg_id = ANY ($1)', v_qtable)
      USING v_found;
    END IF;
    SELECT pg_catalog.format('fatal claim by worker %s in queue "%s": %s', claim_tasks.worker_id, claim_tasks.queue_name,
             pg_catalog.string_agg(pg_catalog.format('message %s %s', x.msg_id, x.reason), ', ' ORDER BY x.msg_id))
    INTO v_pause
    FROM ROWS FROM (pg_catalog.unnest(v_msg), pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_reason)) AS x (msg_id, verdict, reason)
    WHERE x.verdict = 'fatal';
    INSERT INTO pgflow.worker_functions AS wf (function_name, enabled, paused_at, paused_reason, updated_at)
    VALUES (v_worker.function_name, false, pg_catalog.clock_timestamp(), v_pause, pg_catalog.clock_timestamp())
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
    RAISE WARNING 'pgflow: %; nothing was claimed, the batch is visible again and worker function "%" is paused', v_pause, v_worker.function_name
      USING HINT = 'inspect the messages by id (SELECT msg_id, read_ct, enqueued_at FROM pgmq.q_<queue> WHERE msg_id = ...), fix the cause, then enable the function again (docs/claim-protocol.md)';

    RETURN QUERY
    SELECT CASE WHEN x.verdict = 'fatal' THEN 'fatal' ELSE 'released' END,
           x.msg_id,
           CASE WHEN x.verdict = 'fatal' THEN x.reason ELSE 'batch_released' END,
           x.flow, x.run_id, x.step, x.task_index, NULL::jsonb, NULL::jsonb
    FROM ROWS FROM (pg_catalog.unnest(v_msg), pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_reason),
                    pg_catalog.unnest(v_flow), pg_catalog.unnest(v_run), pg_catalog.unnest(v_step),
                    pg_catalog.unnest(v_index)) AS x (msg_id, verdict, reason, flow, run_id, step, task_index)
    ORDER BY x.msg_id;
    RETURN;
  END IF;

  -- Claim: a guarded update of exactly the eligible tasks (they are locked and queued). Each
  -- task's handler input is built in the same statement: a map task gets its array element (the
  -- run input for a root map, else its single dependency's output); a single step gets
  -- {dependency: output} of its completed dependencies ({} for a root step); flow_input is the
  -- run input for root single steps only.
  WITH candidates AS (
    SELECT x.run_id, x.step, x.task_index
    FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_run), pg_catalog.unnest(v_step),
                    pg_catalog.unnest(v_index)) AS x (verdict, run_id, step, task_index)
    WHERE x.verdict = 'claim'
  ), claimed AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'started',
           attempts_count = t.attempts_count + 1,
           started_at = pg_catalog.now(),
           last_worker_id = claim_tasks.worker_id
      -- the step and flow by key, for the batch's route (a claimed task is on it); the task only by
      -- its primary key: no join condition can lead the planner to another index of step_tasks
      FROM candidates AS c
      CROSS JOIN LATERAL (SELECT x.* FROM pgflow.steps AS x
                          WHERE x.flow_slug = claim_tasks.flow_slug AND x.step_slug = c.step LIMIT 1) AS s
      CROSS JOIN LATERAL (SELECT x.opt_timeout FROM pgflow.flows AS x WHERE x.flow_slug = claim_tasks.flow_slug LIMIT 1) AS f
      -- the run input, only where it is the flow input (a root single step)
      LEFT JOIN LATERAL (SELECT x.input FROM pgflow.runs AS x
                         WHERE x.run_id = c.run_id AND s.step_type = 'single' AND s.deps_count = 0 LIMIT 1) AS r ON true
     WHERE t.run_id = c.run_id AND t.step_slug = c.step AND t.task_index = c.task_index
       AND t.status = 'queued'
    RETURNING t.run_id, t.step_slug, t.task_index, t.message_id, t.flow_slug,
              coalesce(s.opt_timeout, f.opt_timeout) + 2 AS vt_offset,
              CASE
                -- a root map's element of its run's input: each run input is read (and detoasted) once
                -- per claim into an array, not once per task (a 10,000-element input is large)
                WHEN s.step_type = 'map' AND s.deps_count = 0 THEN
                  (ARRAY(SELECT r.input FROM (SELECT DISTINCT x.run_id FROM candidates AS x) AS k
                         LEFT JOIN LATERAL (SELECT y.input FROM pgflow.runs AS y WHERE y.run_id = k.run_id LIMIT 1) AS r ON true
                         ORDER BY k.run_id))[pg_catalog.array_position(
                    ARRAY(SELECT DISTINCT x.run_id FROM candidates AS x ORDER BY 1), t.run_id)] -> t.task_index
                WHEN s.step_type = 'map' THEN (
                  SELECT ds.output -> t.task_index
                  FROM pgflow.deps AS d
                  JOIN pgflow.step_states AS ds ON ds.run_id = t.run_id AND ds.step_slug = d.dep_slug
                  WHERE d.flow_slug = t.flow_slug AND d.step_slug = t.step_slug
                  LIMIT 1)
                WHEN s.deps_count = 0 THEN '{}'::jsonb
                ELSE coalesce((
                  SELECT pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                  FROM pgflow.deps AS d
                  JOIN pgflow.step_states AS ds ON ds.run_id = t.run_id AND ds.step_slug = d.dep_slug
                  WHERE d.flow_slug = t.flow_slug AND d.step_slug = t.step_slug AND ds.status = 'completed'),
                  '{}'::jsonb)
              END AS input,
              CASE WHEN s.step_type = 'single' AND s.deps_count = 0 THEN r.input END AS flow_input
  )
  SELECT pg_catalog.array_agg(c.run_id ORDER BY c.message_id), pg_catalog.array_agg(c.step_slug ORDER BY c.message_id),
         pg_catalog.array_agg(c.task_index ORDER BY c.message_id), pg_catalog.array_agg(c.vt_offset ORDER BY c.message_id),
         pg_catalog.array_agg(c.message_id ORDER BY c.message_id), pg_catalog.array_agg(c.flow_slug ORDER BY c.message_id),
         pg_catalog.array_agg(c.input ORDER BY c.message_id), pg_catalog.array_agg(c.flow_input ORDER BY c.message_id),
         pg_catalog.count(*)::integer
  INTO v_c_run, v_c_step, v_c_index, v_c_offset, v_c_msg, v_c_flow, v_c_input, v_c_flow_input, v_claimed
  FROM claimed AS c;

  IF v_claimed > 0 THEN
    v_changed := pgflow._set_task_messages_vt(v_c_run, v_c_step, v_c_index, v_c_offset);
    IF v_changed < v_claimed THEN
      RAISE EXCEPTION 'claim_tasks(): visibility updated % of % claimed messages in queue "%"; the claim was rolled back and no attempt was consumed',
        v_changed, v_claimed, claim_tasks.queue_name
        USING ERRCODE = 'P0001',
              HINT = 'a claimed task''s message is missing from its queue; check for code that archives or deletes pgflow messages directly';
    END IF;
  END IF;

  -- Duplicates: defer toward the existing recovery deadline (never a fresh full timeout).
  IF 'duplicate' = ANY (v_verdict) THEN
    PERFORM pgflow._set_task_messages_vt(
      ARRAY(SELECT x.run_id FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_run)) AS x (verdict, run_id) WHERE x.verdict = 'duplicate'),
      ARRAY(SELECT x.step FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_step)) AS x (verdict, step) WHERE x.verdict = 'duplicate'),
      ARRAY(SELECT x.task_index FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_index)) AS x (verdict, task_index) WHERE x.verdict = 'duplicate'),
      ARRAY(SELECT x.defer FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_defer)) AS x (verdict, defer) WHERE x.verdict = 'duplicate'));
  END IF;

  -- Late messages of finished tasks: archive (idempotent).
  IF 'archived_terminal' = ANY (v_verdict) THEN
    PERFORM pgflow._archive_task_messages(
      ARRAY(SELECT x.run_id FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_run)) AS x (verdict, run_id) WHERE x.verdict = 'archived_terminal'),
      ARRAY(SELECT x.step FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_step)) AS x (verdict, step) WHERE x.verdict = 'archived_terminal'),
      ARRAY(SELECT x.task_index FROM ROWS FROM (pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_index)) AS x (verdict, task_index) WHERE x.verdict = 'archived_terminal'));
  END IF;

  -- Clearly foreign messages: archive, warn with ids only.
  SELECT pg_catalog.array_agg(x.msg_id ORDER BY x.msg_id) INTO v_foreign
  FROM ROWS FROM (pg_catalog.unnest(v_msg), pg_catalog.unnest(v_verdict)) AS x (msg_id, verdict)
  WHERE x.verdict = 'archived_foreign';
  IF v_foreign IS NOT NULL THEN
    PERFORM pgmq.archive(claim_tasks.queue_name, v_foreign);
    RAISE WARNING 'pgflow: archived % foreign message(s) in queue "%" (message ids %): not pgflow work',
      pg_catalog.cardinality(v_foreign), claim_tasks.queue_name, pg_catalog.array_to_string(v_foreign, ', ')
      USING HINT = 'applications must not send to pgflow-owned queues; the archived messages stay in the queue''s archive table';
  END IF;

  RETURN QUERY
  SELECT 'claimed'::text, c.message_id, NULL::text, c.flow_slug, c.run_id, c.step_slug, c.task_index, c.input, c.flow_input
  FROM ROWS FROM (pg_catalog.unnest(v_c_msg), pg_catalog.unnest(v_c_flow), pg_catalog.unnest(v_c_run),
                  pg_catalog.unnest(v_c_step), pg_catalog.unnest(v_c_index), pg_catalog.unnest(v_c_input),
                  pg_catalog.unnest(v_c_flow_input)) AS c (message_id, flow_slug, run_id, step_slug, task_index, input, flow_input)
  UNION ALL
  SELECT x.verdict, x.msg_id, x.reason, x.flow, x.run_id, x.step, x.task_index, NULL::jsonb, NULL::jsonb
  FROM ROWS FROM (pg_catalog.unnest(v_msg), pg_catalog.unnest(v_verdict), pg_catalog.unnest(v_reason),
                  pg_catalog.unnest(v_flow), pg_catalog.unnest(v_run), pg_catalog.unnest(v_step),
                  pg_catalog.unnest(v_index)) AS x (msg_id, verdict, reason, flow, run_id, step, task_index)
  WHERE x.verdict <> 'claim'
  ORDER BY 2;
END;
$$;
