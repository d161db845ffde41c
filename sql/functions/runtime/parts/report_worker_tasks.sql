RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_kind text := '{{kind}}';
  v_function text := '{{kind}}_tasks';
  v_value_key text := CASE v_kind WHEN 'complete' THEN 'output' ELSE 'error_message' END;
  v_bad bigint;
  v_problem text;
  v_runs uuid[];
  v_steps text[];
  v_indexes integer[];
  v_values jsonb[];
  v_at integer;  -- the element being applied (a FOR loop's own variable is not visible in the handler)
  v_task pgflow.step_tasks;
  v_archive_runs uuid[] := '{}';
  v_archive_steps text[] := '{}';
  v_archive_indexes integer[] := '{}';
  v_sqlstate text;
  v_message text;
  v_detail text;
  v_hint text;
  v_batched boolean := false;
BEGIN
  IF pg_catalog.jsonb_typeof({{kind}}_tasks.tasks) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION '%(): tasks must be a JSON array of {"run_id", "step_slug", "task_index", "%"} objects, not %',
      v_function, v_value_key, coalesce(pg_catalog.jsonb_typeof({{kind}}_tasks.tasks), 'NULL')
      USING ERRCODE = '22023';
  END IF;

  SELECT x.n - 1, x.problem INTO v_bad, v_problem
  FROM (
    SELECT e.n, CASE
             WHEN pg_catalog.jsonb_typeof(e.task) <> 'object' THEN 'is not a JSON object'
             WHEN NOT e.task ?& ARRAY['run_id', 'step_slug', 'task_index', v_value_key]
               THEN pg_catalog.format('lacks a key: it needs run_id, step_slug, task_index and %s', v_value_key)
             WHEN pg_catalog.jsonb_typeof(e.task -> 'run_id') <> 'string'
                  OR (e.task ->> 'run_id') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
               THEN 'run_id is not a UUID string'
             WHEN pg_catalog.jsonb_typeof(e.task -> 'step_slug') <> 'string' THEN 'step_slug is not a string'
             WHEN pg_catalog.jsonb_typeof(e.task -> 'task_index') <> 'number'
                  OR (e.task ->> 'task_index') !~ '^-?[0-9]{1,10}$'
               THEN 'task_index is not an integer'
             WHEN (e.task ->> 'task_index')::bigint NOT BETWEEN -2147483648 AND 2147483647
               THEN 'task_index is out of range'
             WHEN v_kind = 'fail' AND pg_catalog.jsonb_typeof(e.task -> 'error_message') NOT IN ('string', 'null')
               THEN 'error_message is not a string or null'
           END AS problem
    FROM pg_catalog.jsonb_array_elements({{kind}}_tasks.tasks) WITH ORDINALITY AS e (task, n)
  ) AS x
  WHERE x.problem IS NOT NULL
  ORDER BY x.n
  LIMIT 1;
  IF v_bad IS NOT NULL THEN
    RAISE EXCEPTION '%(): element %: %; nothing was applied', v_function, v_bad, v_problem
      USING ERRCODE = '22023';
  END IF;

  SELECT pg_catalog.array_agg((e.task ->> 'run_id')::uuid ORDER BY e.n),
         pg_catalog.array_agg(e.task ->> 'step_slug' ORDER BY e.n),
         pg_catalog.array_agg((e.task ->> 'task_index')::integer ORDER BY e.n),
         pg_catalog.array_agg(e.task -> v_value_key ORDER BY e.n)
  INTO v_runs, v_steps, v_indexes, v_values
  FROM pg_catalog.jsonb_array_elements({{kind}}_tasks.tasks) WITH ORDINALITY AS e (task, n);
  IF v_runs IS NULL THEN
    RETURN;
  END IF;

  -- Every run of the batch, in run_id order, before any element: the lock order of claims.
  PERFORM 1 FROM pgflow.runs AS r WHERE r.run_id = ANY (v_runs) ORDER BY r.run_id FOR UPDATE;

  IF v_kind = 'complete' THEN
    -- completions that need no element-by-element handling go through in one set-based pass (0014)
    BEGIN
      v_batched := pgflow._complete_worker_tasks(v_runs, v_steps, v_indexes, v_values);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS v_sqlstate = RETURNED_SQLSTATE;
      IF v_sqlstate IN ('40001', '40P01', '55P03') THEN
        RAISE;  -- a deadlock or lock timeout is the caller's to retry, as in the element path
      END IF;
      -- anything else is undone; the element path below raises it again, naming its element
      v_batched := false;
    END;
  END IF;

  BEGIN
    IF v_batched THEN
      RETURN QUERY
      SELECT t.*
      FROM ROWS FROM (pg_catalog.unnest(v_runs), pg_catalog.unnest(v_steps), pg_catalog.unnest(v_indexes))
             WITH ORDINALITY AS k (run_id, step_slug, task_index, n)
      CROSS JOIN LATERAL (
        SELECT x.* FROM pgflow.step_tasks AS x
        WHERE x.run_id = k.run_id AND x.step_slug = k.step_slug AND x.task_index = k.task_index
        LIMIT 1  -- the primary key
      ) AS t
      ORDER BY k.n;
      v_archive_runs := v_runs;
      v_archive_steps := v_steps;
      v_archive_indexes := v_indexes;
      v_runs := '{}';  -- nothing left for the element loop
    END IF;
    FOR v_i IN 1 .. pg_catalog.cardinality(v_runs) LOOP
      v_at := v_i;
      IF v_kind = 'complete' THEN
        SELECT * INTO v_task FROM pgflow._complete_worker_task(v_runs[v_i], v_steps[v_i], v_indexes[v_i], v_values[v_i]);
      ELSE
        SELECT * INTO v_task FROM pgflow.fail_task(v_runs[v_i], v_steps[v_i], v_indexes[v_i], v_values[v_i] #>> '{}');
      END IF;
      CONTINUE WHEN NOT FOUND;
      RETURN NEXT v_task;
      -- a finished (or late) completion's message; a queued task keeps its message
      IF v_kind = 'complete' AND v_task.status <> 'queued' THEN
        v_archive_runs := v_archive_runs || v_task.run_id;
        v_archive_steps := v_archive_steps || v_task.step_slug;
        v_archive_indexes := v_archive_indexes || v_task.task_index;
      END IF;
    END LOOP;
    v_at := NULL;
    IF pg_catalog.cardinality(v_archive_runs) > 0 THEN
      PERFORM pgflow._archive_task_messages(v_archive_runs, v_archive_steps, v_archive_indexes);
    END IF;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_sqlstate = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                            v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    -- the element's own error, as the single call raises it
    v_message := pg_catalog.replace(v_message, '_complete_worker_task(): ', 'complete_task(): ');
    v_message := pg_catalog.format('%s(): %s%s; nothing was applied', v_function,
                                   coalesce('element ' || (v_at - 1) || ': ', 'archiving the messages: '), v_message);
    IF v_detail <> '' AND v_hint <> '' THEN
      RAISE EXCEPTION USING ERRCODE = v_sqlstate, MESSAGE = v_message, DETAIL = v_detail, HINT = v_hint;
    ELSIF v_detail <> '' THEN
      RAISE EXCEPTION USING ERRCODE = v_sqlstate, MESSAGE = v_message, DETAIL = v_detail;
    ELSIF v_hint <> '' THEN
      RAISE EXCEPTION USING ERRCODE = v_sqlstate, MESSAGE = v_message, HINT = v_hint;
    END IF;
    RAISE EXCEPTION USING ERRCODE = v_sqlstate, MESSAGE = v_message;
  END;
END;
$$;
