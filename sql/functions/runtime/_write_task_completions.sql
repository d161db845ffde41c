-- The set-based writes of _complete_started_tasks, the one way started tasks complete, for a batch
-- of several elements (one element is written by the core itself, by primary key): it decides
-- whether the elements can be applied and records them, one statement per table whatever the
-- number of elements; its caller moves the runs on.
-- The arrays are the elements in order; p_execution_mode is the mode the entry point reports
-- ('queue': a worker's report, 'manual': trusted code's). The caller holds every element's run row
-- lock (FOR UPDATE where the element may end its step, else at least FOR NO KEY UPDATE) and has
-- checked that the elements name different tasks and each run one step (several tasks of one map
-- step may share a run). This function locks each element's step state and then its task FOR
-- UPDATE, element after element in array order (a caller that locked them already holds them), and
-- then:
--   * writes nothing and returns no tasks when an element's run, step or task is not started or
--     the task has another execution mode, or when an element would raise a [TYPE_VIOLATION] (a
--     single step's output that is not an array, feeding a map step: the caller goes element by
--     element, and that element fails its run between the others);
--   * otherwise completes every task and counts each step state down once, by the number of its
--     elements, or completes it as the core does for one element (_complete_started_tasks),
--     releases the children of every step that completed and takes that step off its run's
--     remaining_steps. Returns the tasks in array order and the step states that completed, in
--     the array order of each one's last element.
-- Every statement is planned once per session and reaches each row by key or by the ctid its lock
-- returned, never by a scan or a hash of a table (the settings below): a generic plan made while a
-- table was small would otherwise keep scanning it as it grows. Those settings are saved and
-- restored on every call, which is why a single element does not come here.
CREATE OR REPLACE FUNCTION pgflow._write_task_completions(p_run_ids uuid[], p_step_slugs text[], p_task_indexes integer[],
                                                          p_outputs jsonb[], p_execution_mode text,
                                                          OUT tasks pgflow.step_tasks[], OUT completed_steps pgflow.step_states[])
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
  v_ok boolean;
  v_violation boolean;
  v_state_tids tid[];
  v_task_tids tid[];
  v_types text[];
  v_flows text[];
  v_done_runs uuid[];
BEGIN
  SELECT pg_catalog.bool_and(coalesce(r.status = 'started' AND ss.status = 'started' AND t.status = 'started'
                                      AND t.execution_mode = p_execution_mode, false)),
         pg_catalog.bool_or(s.step_type = 'single' AND pg_catalog.jsonb_typeof(k.output) IS DISTINCT FROM 'array'
                            AND EXISTS (SELECT 1 FROM pgflow.deps AS d
                                        JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
                                        WHERE d.flow_slug = s.flow_slug AND d.dep_slug = s.step_slug AND c.step_type = 'map')),
         pg_catalog.array_agg(ss.ctid ORDER BY k.n),
         pg_catalog.array_agg(t.ctid ORDER BY k.n),
         pg_catalog.array_agg(s.step_type ORDER BY k.n),
         pg_catalog.array_agg(r.flow_slug ORDER BY k.n)
  INTO v_ok, v_violation, v_state_tids, v_task_tids, v_types, v_flows
  FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes),
                  pg_catalog.unnest(p_outputs)) WITH ORDINALITY AS k (run_id, step_slug, task_index, output, n)
  -- one primary-key probe per element (LIMIT 1 keeps the planner from a join over the tables)
  LEFT JOIN LATERAL (SELECT x.status, x.flow_slug FROM pgflow.runs AS x WHERE x.run_id = k.run_id LIMIT 1) AS r ON true
  LEFT JOIN LATERAL (SELECT y.ctid, y.status FROM pgflow.step_states AS y
                     WHERE y.run_id = k.run_id AND y.step_slug = k.step_slug LIMIT 1 FOR UPDATE) AS ss ON true
  LEFT JOIN LATERAL (SELECT z.ctid, z.status, z.execution_mode FROM pgflow.step_tasks AS z
                     WHERE z.run_id = k.run_id AND z.step_slug = k.step_slug AND z.task_index = k.task_index
                     LIMIT 1 FOR UPDATE) AS t ON true
  LEFT JOIN LATERAL (SELECT w.flow_slug, w.step_slug, w.step_type FROM pgflow.steps AS w
                     WHERE w.flow_slug = r.flow_slug AND w.step_slug = k.step_slug LIMIT 1) AS s ON true;
  IF v_ok IS NOT TRUE OR v_violation THEN
    RETURN;
  END IF;

  WITH completed AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'completed', completed_at = GREATEST(pg_catalog.now(), t.started_at), output = u.output
      FROM ROWS FROM (pg_catalog.unnest(v_task_tids), pg_catalog.unnest(p_outputs)) WITH ORDINALITY AS u (tid, output, n)
     WHERE t.ctid = u.tid
    RETURNING t AS task, u.n
  )
  SELECT pg_catalog.array_agg(c.task ORDER BY c.n) INTO tasks FROM completed AS c;

  -- each step state once, counted down by the number of its elements (several tasks of one map
  -- step); its position is its last element's, where one call per element would complete it
  WITH counted AS (
    UPDATE pgflow.step_states AS ss
       SET remaining_tasks = ss.remaining_tasks - u.reported,
           status = CASE WHEN ss.remaining_tasks = u.reported THEN 'completed' ELSE ss.status END,
           completed_at = CASE WHEN ss.remaining_tasks = u.reported THEN pg_catalog.now() ELSE ss.completed_at END,
           output = CASE WHEN ss.remaining_tasks <> u.reported THEN ss.output
                         WHEN u.step_type = 'map' THEN
                           coalesce((SELECT pg_catalog.jsonb_agg(t.output ORDER BY t.task_index)
                                     FROM pgflow.step_tasks AS t
                                     WHERE t.run_id = ss.run_id AND t.step_slug = ss.step_slug AND t.status = 'completed'),
                                    '[]'::jsonb)
                         ELSE u.output END
      FROM (SELECT e.tid, pg_catalog.count(*) AS reported, pg_catalog.max(e.n) AS n,
                   (pg_catalog.array_agg(e.output ORDER BY e.n DESC))[1] AS output,
                   pg_catalog.min(e.step_type) AS step_type, pg_catalog.min(e.flow_slug) AS flow_slug
            FROM ROWS FROM (pg_catalog.unnest(v_state_tids), pg_catalog.unnest(p_outputs), pg_catalog.unnest(v_types),
                            pg_catalog.unnest(v_flows)) WITH ORDINALITY AS e (tid, output, step_type, flow_slug, n)
            GROUP BY e.tid) AS u
     WHERE ss.ctid = u.tid
    RETURNING ss AS state, ss.run_id, ss.step_slug, ss.remaining_tasks, ss.output, u.flow_slug, u.n
  ), released AS (
    UPDATE pgflow.step_states AS cs
       SET remaining_deps = cs.remaining_deps - 1,
           initial_tasks = CASE
             WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL
               THEN CASE WHEN pg_catalog.jsonb_typeof(done.output) = 'array' THEN pg_catalog.jsonb_array_length(done.output) END
             ELSE cs.initial_tasks END
      FROM counted AS done
      JOIN pgflow.deps AS d ON d.flow_slug = done.flow_slug AND d.dep_slug = done.step_slug
      JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
     WHERE done.remaining_tasks = 0
       AND cs.run_id = done.run_id AND cs.step_slug = d.step_slug AND cs.status = 'created'
  )  -- (a data-modifying WITH runs to completion whether or not the query reads it)
  SELECT pg_catalog.array_agg(done.state ORDER BY done.n), pg_catalog.array_agg(done.run_id ORDER BY done.n)
  INTO completed_steps, v_done_runs
  FROM counted AS done
  WHERE done.remaining_tasks = 0;

  IF v_done_runs IS NOT NULL THEN
    -- one step less; on the last step the run completes in the same row version (status,
    -- completed_at, the {leaf_step: output} of its completed leaf steps, as maybe_complete_run
    -- would set them): no cascade can change a run with no step left, and one write spares a
    -- second row version and its foreign-key check
    UPDATE pgflow.runs AS r SET
        remaining_steps = r.remaining_steps - 1,
        status = CASE WHEN r.remaining_steps = 1 THEN 'completed' ELSE r.status END,
        completed_at = CASE WHEN r.remaining_steps = 1 THEN pg_catalog.now() ELSE r.completed_at END,
        output = CASE WHEN r.remaining_steps <> 1 THEN r.output
                      ELSE coalesce((SELECT pg_catalog.jsonb_object_agg(ls.step_slug, ls.output)
                                     FROM pgflow.step_states AS ls
                                     WHERE ls.run_id = r.run_id AND ls.status = 'completed'
                                       AND NOT EXISTS (SELECT 1 FROM pgflow.deps AS ld
                                                       WHERE ld.flow_slug = ls.flow_slug AND ld.dep_slug = ls.step_slug)),
                                    '{}'::jsonb) END
     WHERE r.run_id = ANY (v_done_runs);
  END IF;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._write_task_completions(uuid[], text[], integer[], jsonb[], text) FROM PUBLIC;
