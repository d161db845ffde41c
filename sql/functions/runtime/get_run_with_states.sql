-- A run with all its step states, as one JSON document: {"run": {...}, "steps": [...]}.
-- A completed step whose stored output is NULL (a run that finished before a database installed by
-- pgflow 0.8-0.12 was adopted, while its history backfill has not stored the outputs) shows the
-- output computed from its tasks, as the backfill stores it: a single step its completed task's
-- output, a map step its completed tasks' outputs in task_index order ([] when none). So the answer
-- is the same before and after the backfill (docs/upgrade.md "The history backfill").
CREATE OR REPLACE FUNCTION pgflow.get_run_with_states(run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_result jsonb;
BEGIN
  SELECT pg_catalog.jsonb_build_object(
           'run', pg_catalog.to_jsonb(r),
           'steps', coalesce((
             SELECT pg_catalog.jsonb_agg(CASE WHEN ss.status = 'completed' AND ss.output IS NULL
               THEN pg_catalog.to_jsonb(ss) || pg_catalog.jsonb_build_object('output', (
                 SELECT CASE WHEN s.step_type = 'map'
                   THEN coalesce(pg_catalog.jsonb_agg(k.output ORDER BY k.task_index), '[]'::jsonb)
                   ELSE (pg_catalog.array_agg(k.output) FILTER (WHERE k.task_index = 0))[1] END
                 FROM pgflow.step_tasks AS k
                 WHERE k.run_id = ss.run_id AND k.step_slug = ss.step_slug AND k.status = 'completed'))
               ELSE pg_catalog.to_jsonb(ss) END ORDER BY s.step_index)
             FROM pgflow.step_states AS ss
             JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
             WHERE ss.run_id = r.run_id), '[]'::jsonb))
  INTO v_result
  FROM pgflow.runs AS r
  WHERE r.run_id = get_run_with_states.run_id;
  IF v_result IS NULL THEN
    RAISE EXCEPTION 'run % does not exist', get_run_with_states.run_id USING ERRCODE = 'PF006';
  END IF;
  RETURN v_result;
END;
$$;
