-- The elements of a batch report (complete_tasks, fail_tasks), checked before anything is applied,
-- with their runs locked: p_tasks must be a JSON array of objects with "run_id" (a UUID string),
-- "step_slug" (a string), "task_index" (an integer) and p_value_key ('output': any JSON;
-- 'error_message': a string or null; then optionally "retry_delay_seconds", a number or null, and
-- "fail_now", true, false or null: fail_task's arguments, which the caller reads from p_tasks).
-- p_function names the entry point in the errors. Then the runs the batch names are locked in
-- run_id order, before any element is applied (the lock order of claims, so two batches, or a batch
-- and a claim, whose runs overlap never deadlock):
--   failures ('error_message') lock every run FOR UPDATE: a failure can end its step or the run and
--   change sibling tasks, so claims of the run take turns with it;
--   completions ('output') lock every run FOR NO KEY UPDATE, then the step states the batch names
--   FOR UPDATE in (run_id, step_slug) order, then FOR UPDATE each run where the batch may end a
--   step (a step state not started, or with no more remaining tasks than the batch names of it),
--   all before any task row is locked. A batch that only counts steps down so neither waits for nor
--   holds up the claims of its runs; reports of one run still take turns (docs/runtime.md "Lock order").
--   Then every task the batch names FOR UPDATE in (run_id, step_slug, task_index) order: the order
--   in which a claim beside it locks the tasks they share.
-- Returns the elements as arrays in array order (all NULL for an empty array); the values stay
-- JSON (an error message is read from it with #>> '{}').
-- Raises 22023 when p_tasks is not an array, or naming the 0-based index of the first element that
-- is not such an object: "<p_function>(): element <i>: ...; nothing was applied".
CREATE OR REPLACE FUNCTION pgflow._task_report_elements(p_function text, p_tasks jsonb, p_value_key text,
                                                        OUT run_ids uuid[], OUT step_slugs text[],
                                                        OUT task_indexes integer[], OUT reported jsonb[])
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_bad bigint;
  v_problem text;
BEGIN
  IF pg_catalog.jsonb_typeof(p_tasks) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION '%(): tasks must be a JSON array of {"run_id", "step_slug", "task_index", "%"} objects, not %',
      p_function, p_value_key, coalesce(pg_catalog.jsonb_typeof(p_tasks), 'NULL')
      USING ERRCODE = '22023';
  END IF;

  SELECT x.n - 1, x.problem INTO v_bad, v_problem
  FROM (
    SELECT e.n, CASE
             WHEN pg_catalog.jsonb_typeof(e.task) <> 'object' THEN 'is not a JSON object'
             WHEN NOT e.task ?& ARRAY['run_id', 'step_slug', 'task_index', p_value_key]
               THEN pg_catalog.format('lacks a key: it needs run_id, step_slug, task_index and %s', p_value_key)
             WHEN pg_catalog.jsonb_typeof(e.task -> 'run_id') <> 'string'
                  OR (e.task ->> 'run_id') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
               THEN 'run_id is not a UUID string'
             WHEN pg_catalog.jsonb_typeof(e.task -> 'step_slug') <> 'string' THEN 'step_slug is not a string'
             WHEN pg_catalog.jsonb_typeof(e.task -> 'task_index') <> 'number'
                  OR (e.task ->> 'task_index') !~ '^-?[0-9]{1,10}$'
               THEN 'task_index is not an integer'
             WHEN (e.task ->> 'task_index')::bigint NOT BETWEEN -2147483648 AND 2147483647
               THEN 'task_index is out of range'
             WHEN p_value_key = 'error_message' AND pg_catalog.jsonb_typeof(e.task -> 'error_message') NOT IN ('string', 'null')
               THEN 'error_message is not a string or null'
             WHEN p_value_key = 'error_message'
                  AND pg_catalog.jsonb_typeof(e.task -> 'retry_delay_seconds') NOT IN ('number', 'null')
               THEN 'retry_delay_seconds is not a number or null'
             WHEN p_value_key = 'error_message' AND pg_catalog.jsonb_typeof(e.task -> 'fail_now') NOT IN ('boolean', 'null')
               THEN 'fail_now is not true, false or null'
           END AS problem
    FROM pg_catalog.jsonb_array_elements(p_tasks) WITH ORDINALITY AS e (task, n)
  ) AS x
  WHERE x.problem IS NOT NULL
  ORDER BY x.n
  LIMIT 1;
  IF v_bad IS NOT NULL THEN
    RAISE EXCEPTION '%(): element %: %; nothing was applied', p_function, v_bad, v_problem
      USING ERRCODE = '22023';
  END IF;

  SELECT pg_catalog.array_agg((e.task ->> 'run_id')::uuid ORDER BY e.n),
         pg_catalog.array_agg(e.task ->> 'step_slug' ORDER BY e.n),
         pg_catalog.array_agg((e.task ->> 'task_index')::integer ORDER BY e.n),
         pg_catalog.array_agg(e.task -> p_value_key ORDER BY e.n)
  INTO run_ids, step_slugs, task_indexes, reported
  FROM pg_catalog.jsonb_array_elements(p_tasks) WITH ORDINALITY AS e (task, n);

  IF p_value_key <> 'output' THEN
    PERFORM 1 FROM pgflow.runs AS r WHERE r.run_id = ANY (run_ids) ORDER BY r.run_id FOR UPDATE;
    RETURN;
  END IF;
  PERFORM 1 FROM pgflow.runs AS r WHERE r.run_id = ANY (run_ids) ORDER BY r.run_id FOR NO KEY UPDATE;
  -- each step state by its own key probe, in key order (the lock happens inside the probe)
  PERFORM 1 FROM pgflow.runs AS r
  WHERE r.run_id = ANY (ARRAY(
    SELECT k.run_id
    FROM (SELECT u.run_id, u.step_slug, pg_catalog.count(*) AS reported
          FROM ROWS FROM (pg_catalog.unnest(run_ids), pg_catalog.unnest(step_slugs)) AS u (run_id, step_slug)
          GROUP BY u.run_id, u.step_slug
          ORDER BY u.run_id, u.step_slug) AS k
    LEFT JOIN LATERAL (SELECT ss.status, ss.remaining_tasks FROM pgflow.step_states AS ss
                       WHERE ss.run_id = k.run_id AND ss.step_slug = k.step_slug LIMIT 1 FOR UPDATE) AS s ON true
    WHERE s.status IS DISTINCT FROM 'started' OR s.remaining_tasks <= k.reported))
  ORDER BY r.run_id
  FOR UPDATE;
  -- every task the batch names, in key order (the element positions sorted by key, each task by its
  -- own key probe): a claim of the same run runs beside a batch that only counts down and locks
  -- the tasks it shares with the batch in this order, so the batch must not take them in array order
  PERFORM 1 FROM pg_catalog.unnest(ARRAY(
    SELECT u.n
    FROM ROWS FROM (pg_catalog.unnest(run_ids), pg_catalog.unnest(step_slugs), pg_catalog.unnest(task_indexes))
         WITH ORDINALITY AS u (run_id, step_slug, task_index, n)
    ORDER BY u.run_id, u.step_slug, u.task_index, u.n)) AS k (n)
  CROSS JOIN LATERAL (SELECT 1 FROM pgflow.step_tasks AS t
                      WHERE t.run_id = run_ids[k.n] AND t.step_slug = step_slugs[k.n] AND t.task_index = task_indexes[k.n]
                      LIMIT 1 FOR UPDATE) AS t;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._task_report_elements(text, jsonb, text) FROM PUBLIC;
