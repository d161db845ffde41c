-- The core of start_flow and start_flows: starts one run per element of p_inputs (a JSON
-- array of run inputs), created in array order; p_run_id, when given, is the first run's id.
-- p_function names the entry point in errors; start_flows' per-element errors name the element's
-- 0-based index. p_restart_of_run_id and p_restart_kind ('retry' or 'resume') mark the runs as
-- restarts of that run (retry_run, resume_run: a row of pgflow.run_restarts each); a resumed run reuses its source's completed tasks as
-- its steps start (start_ready_steps). Under the flow advisory lock in shared mode (no run starts while its flow is
-- being recompiled or deleted), set-based: one insert of the runs, one of their step states.
-- Then, per run in array order, what start_flow always did: run:started (when realtime.send
-- exists) and the run moves on. A flow without conditions or map steps (the common
-- case) only starts its root steps (start_ready_steps: one send per root step); any other flow
-- goes through _advance_run (conditions, empty-map cascades, ready steps, run completion).
-- Returns the runs in array order, as they are after starting.
CREATE OR REPLACE FUNCTION pgflow._start_runs(p_function text, p_flow_slug text, p_inputs jsonb, p_run_id uuid DEFAULT NULL,
                                              p_restart_of_run_id uuid DEFAULT NULL, p_restart_kind text DEFAULT NULL)
RETURNS SETOF pgflow.runs
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_prefix text := CASE WHEN p_function = 'start_flows' THEN 'start_flows(): ' ELSE '' END;
  v_steps integer;
  v_root_map boolean;
  v_simple boolean;
  v_bad bigint;
  v_type text;
  v_run_ids uuid[];
  v_inputs jsonb[];
  v_run pgflow.runs;
  v_realtime boolean := pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL;
  v_together boolean := false;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock_shared(1, pg_catalog.hashtext(p_flow_slug));

  SELECT pg_catalog.count(s.step_slug)::integer,
         coalesce(pg_catalog.bool_or(s.step_type = 'map' AND s.deps_count = 0), false),
         NOT coalesce(pg_catalog.bool_or(s.step_type = 'map'
                                         OR s.required_input_pattern IS NOT NULL OR s.forbidden_input_pattern IS NOT NULL), false)
  INTO v_steps, v_root_map, v_simple
  FROM pgflow.flows AS f
  LEFT JOIN pgflow.steps AS s ON s.flow_slug = f.flow_slug
  WHERE f.flow_slug = p_flow_slug
  GROUP BY f.flow_slug;
  IF NOT FOUND THEN
    RAISE EXCEPTION '%flow "%" does not exist', v_prefix, p_flow_slug
      USING ERRCODE = 'PF006', HINT = 'start a worker for the flow (startup compilation creates it) or create it with pgflow.create_flow()';
  END IF;
  IF p_inputs IS NULL AND p_function = 'start_flow' THEN
    RAISE EXCEPTION 'flow "%": the run input must not be NULL (use ''{}'' for no input)', p_flow_slug
      USING ERRCODE = '22004';
  END IF;
  IF pg_catalog.jsonb_typeof(p_inputs) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION '%flow "%": inputs must be a JSON array of run inputs (got %)', v_prefix, p_flow_slug,
      coalesce(pg_catalog.jsonb_typeof(p_inputs), 'NULL')
      USING ERRCODE = '22023';
  END IF;
  IF v_root_map THEN
    SELECT e.n - 1, pg_catalog.jsonb_typeof(e.input) INTO v_bad, v_type
    FROM pg_catalog.jsonb_array_elements(p_inputs) WITH ORDINALITY AS e (input, n)
    WHERE pg_catalog.jsonb_typeof(e.input) <> 'array'
    ORDER BY e.n
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
      RAISE EXCEPTION '%flow "%" has a root map step, so its input must be a JSON array (got %)',
        v_prefix || CASE WHEN v_prefix <> '' THEN 'element ' || v_bad || ': ' ELSE '' END, p_flow_slug, v_type
        USING ERRCODE = '22023';
    END IF;
  END IF;

  SELECT pg_catalog.array_agg(CASE WHEN e.n = 1 AND p_run_id IS NOT NULL THEN p_run_id ELSE pg_catalog.gen_random_uuid() END
                              ORDER BY e.n),
         pg_catalog.array_agg(e.input ORDER BY e.n)
  INTO v_run_ids, v_inputs
  FROM pg_catalog.jsonb_array_elements(p_inputs) WITH ORDINALITY AS e (input, n);
  IF v_run_ids IS NULL THEN
    RETURN;
  END IF;

  INSERT INTO pgflow.runs (run_id, flow_slug, input, remaining_steps)
  SELECT u.run_id, p_flow_slug, u.input, v_steps
  FROM ROWS FROM (pg_catalog.unnest(v_run_ids), pg_catalog.unnest(v_inputs)) WITH ORDINALITY AS u (run_id, input, n)
  ORDER BY u.n;
  -- the lineage before any step starts: start_ready_steps reads it to reuse a resumed run's work
  IF p_restart_of_run_id IS NOT NULL THEN
    INSERT INTO pgflow.run_restarts (run_id, restart_of_run_id, restart_kind)
    SELECT u.run_id, p_restart_of_run_id, p_restart_kind FROM pg_catalog.unnest(v_run_ids) AS u (run_id);
  END IF;

  INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  SELECT s.flow_slug, u.run_id, s.step_slug, s.deps_count,
         CASE WHEN s.step_type = 'map' AND s.deps_count = 0 THEN pg_catalog.jsonb_array_length(u.input)
              WHEN s.step_type = 'map' THEN NULL
              ELSE 1 END
  FROM ROWS FROM (pg_catalog.unnest(v_run_ids), pg_catalog.unnest(v_inputs)) WITH ORDINALITY AS u (run_id, input, n)
  CROSS JOIN pgflow.steps AS s
  WHERE s.flow_slug = p_flow_slug
  ORDER BY u.n, s.step_index;

  -- Per run, in array order: run:started, then what start_flow did after it. A flow without
  -- conditions, map steps or manual steps only starts its root steps (no cascade can apply and
  -- a run with steps cannot be complete yet); any other flow goes through _advance_run.
  -- Several runs of such a flow start their root steps together when those share a queue and a
  -- start delay (_start_ready_steps_of_runs: one send for all, the same messages in the same
  -- order), unless realtime.send exists (each run's events come before the next run's).
  IF v_simple AND v_steps > 0 AND NOT v_realtime AND pg_catalog.cardinality(v_run_ids) > 1 THEN
    v_together := pgflow._start_ready_steps_of_runs(v_run_ids);
  END IF;
  FOR v_i IN 1 .. pg_catalog.cardinality(v_run_ids) LOOP
    EXIT WHEN v_together;
    IF v_realtime THEN
      SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = v_run_ids[v_i];
      PERFORM pgflow._broadcast_run(v_run);
    END IF;
    IF v_simple AND v_steps > 0 THEN
      PERFORM pgflow.start_ready_steps(v_run_ids[v_i]);
    ELSE
      PERFORM pgflow._advance_run(v_run_ids[v_i]);
    END IF;
  END LOOP;

  RETURN QUERY
  SELECT r.*
  FROM pg_catalog.unnest(v_run_ids) WITH ORDINALITY AS u (run_id, n)
  CROSS JOIN LATERAL (
    SELECT x.* FROM pgflow.runs AS x WHERE x.run_id = u.run_id
    LIMIT 1  -- the primary key; one index probe per run, whatever the planner estimates
  ) AS r
  ORDER BY u.n;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._start_runs(text, text, jsonb, uuid, uuid, text) FROM PUBLIC;
