--@note Protocol-1 baseline: pgflow.start_tasks as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/claim/start_tasks.sql.
-- Claims the queued tasks behind the given messages of a flow's queue for one worker. Only tasks
-- of started runs and started steps are claimed: attempts_count + 1, status started,
-- started_at, last_worker_id. Before anything is returned, the claimed messages become
-- invisible for the effective timeout + 2 s; if fewer messages could be changed than tasks were
-- claimed, the call raises and the whole claim rolls back (no attempt consumed). Messages that
-- match no claimable task are ignored (they reappear after the reader's own visibility timeout).
--@include functions/claim/start_tasks.sql lines=2-8
DECLARE
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
  v_offsets integer[];
  v_claimed integer;
  v_changed integer;
BEGIN
  IF coalesce(pg_catalog.cardinality(start_tasks.msg_ids), 0) = 0 THEN
--@include functions/claim/claim_tasks.sql lines=352-354
  -- Lock order runs -> step_tasks, as complete_task/fail_task: the runs in share mode (claims do
  -- not block each other, but wait for a completion or failure of the same run), then the task
  -- rows in key order, so two claims with overlapping batches cannot deadlock either.
  PERFORM 1
  FROM pgflow.runs AS r
  WHERE r.run_id IN (SELECT t.run_id FROM pgflow.step_tasks AS t
                     WHERE t.flow_slug = start_tasks.flow_slug
                       AND t.message_id = ANY (start_tasks.msg_ids)
                       AND t.status = 'queued')
  ORDER BY r.run_id
  FOR SHARE;

  WITH locked AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    WHERE t.flow_slug = start_tasks.flow_slug
      AND t.message_id = ANY (start_tasks.msg_ids)
      AND t.status = 'queued'
    ORDER BY t.run_id, t.step_slug, t.task_index
    FOR UPDATE
  ), claimed AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'started',
           attempts_count = t.attempts_count + 1,
           started_at = pg_catalog.now(),
           last_worker_id = start_tasks.worker_id
      FROM locked AS l, pgflow.runs AS r, pgflow.step_states AS ss, pgflow.steps AS s, pgflow.flows AS f
     WHERE t.run_id = l.run_id AND t.step_slug = l.step_slug AND t.task_index = l.task_index
       AND t.status = 'queued'
       AND r.run_id = t.run_id AND r.status = 'started'
       AND ss.run_id = t.run_id AND ss.step_slug = t.step_slug AND ss.status = 'started'
       AND s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
       AND f.flow_slug = t.flow_slug
    RETURNING t.run_id, t.step_slug, t.task_index, coalesce(s.opt_timeout, f.opt_timeout) + 2 AS vt_offset
  )
  SELECT pg_catalog.array_agg(c.run_id), pg_catalog.array_agg(c.step_slug),
         pg_catalog.array_agg(c.task_index), pg_catalog.array_agg(c.vt_offset), pg_catalog.count(*)::integer
  INTO v_run_ids, v_step_slugs, v_task_indexes, v_offsets, v_claimed
  FROM claimed AS c;

  IF v_claimed = 0 THEN
    RETURN;
  END IF;

  v_changed := pgflow._set_task_messages_vt(v_run_ids, v_step_slugs, v_task_indexes, v_offsets);
  IF v_changed < v_claimed THEN
    RAISE EXCEPTION 'start_tasks(): visibility updated % of % claimed messages in queue "%"; the claim was rolled back and no attempt was consumed',
      v_changed, v_claimed, start_tasks.flow_slug
      USING ERRCODE = 'P0001',
            HINT = 'a claimed task''s message is missing from its queue; check for code that archives or deletes pgflow messages directly';
  END IF;

  RETURN QUERY
  SELECT t.flow_slug,
         t.run_id,
         t.step_slug,
         CASE
           WHEN s.step_type = 'map' AND s.deps_count = 0 THEN r.input -> t.task_index
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
         END,
         t.message_id,
         t.task_index,
         CASE WHEN s.step_type = 'single' AND s.deps_count = 0 THEN r.input END
  FROM ROWS FROM (pg_catalog.unnest(v_run_ids), pg_catalog.unnest(v_step_slugs), pg_catalog.unnest(v_task_indexes)) AS k (run_id, step_slug, task_index)
  JOIN pgflow.step_tasks AS t ON t.run_id = k.run_id AND t.step_slug = k.step_slug AND t.task_index = k.task_index
  JOIN pgflow.runs AS r ON r.run_id = t.run_id
  JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
  ORDER BY pg_catalog.array_position(start_tasks.msg_ids, t.message_id), t.run_id, t.step_slug, t.task_index;
END;
$$;
