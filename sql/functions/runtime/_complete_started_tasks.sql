-- The one way started tasks complete, whoever reports them: complete_task and complete_manual_task
-- with one element, complete_tasks with a whole batch of independent completions (one statement per
-- table instead of a chain of calls per element), and each element of a batch it cannot take.
-- The arrays are the elements in order; p_execution_mode is the mode the entry point reports
-- ('queue': a worker's report, 'manual': trusted code's). The caller holds every element's run row
-- lock: FOR UPDATE where the element may end its step (so a run update here never waits for a claim's
-- FOR KEY SHARE), else at least FOR NO KEY UPDATE; this function locks each element's step state and then its task FOR UPDATE,
-- element after element in array order (a caller that locked them already holds them).
-- It applies the elements only when that gives exactly what one call per element, in array order,
-- gives: every element names a different task and each run one step (no element can see another's
-- effects but the count of its step, which several tasks of one map step take down together, and
-- the step completes at the last of them as it would element by element); every
-- element's run, step and task are started and the task has p_execution_mode; and with several
-- elements, none can raise a [TYPE_VIOLATION] and realtime.send does not exist (a call per element
-- fails its run, or sends its events, between the other elements). Otherwise it changes nothing and
-- returns NULL; complete_tasks then goes element by element.
-- Applying:
--   * a single step whose output is not an array but feeds a map step fails its task and run
--     through _fail_started_task with a [TYPE_VIOLATION] error (no later step could use it);
--   * every other task completes, no earlier than it started (a report that waited behind a newer
--     claim of its task ends it no earlier than that claim); its step counts down and, on its last
--     task, completes in the same UPDATE (a map step's output: its tasks' outputs in task_index
--     order, [] for none; one row version per step state, as PostgreSQL checks a row's foreign
--     keys again on every further update of a row the transaction already changed); the children
--     of a step that completed are released (a map child learns its size) and the run has one
--     step less. One element, the usual report, does this here with one statement per row, each
--     by primary key; several go through _write_task_completions, one statement per table (a
--     batch's statements need planner settings that cost every call that carries them);
--   * the step:completed event goes out when realtime.send exists, and each run whose step
--     completed moves on as _advance_run moves it. When several runs move on and no flow of them
--     has a condition or a map step (no cascade can run), the runs with no step left complete and
--     the others start their ready steps together (_start_ready_steps_of_runs: one UPDATE, one
--     send, one INSERT) when their steps share a queue and a start delay.
-- Returns the task rows in array order. Its only PGMQ calls are those of the runs moving on and of
-- a failed run; the caller archives the reported tasks' messages (a manual task has none).
CREATE OR REPLACE FUNCTION pgflow._complete_started_tasks(p_run_ids uuid[], p_step_slugs text[], p_task_indexes integer[],
                                                          p_outputs jsonb[], p_execution_mode text)
RETURNS pgflow.step_tasks[]
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_run_status text;
  v_flow text;
  v_state_status text;
  v_task_status text;
  v_task_mode text;
  v_step_type text;
  v_violation text;
  v_task pgflow.step_tasks;
  v_state pgflow.step_states;
  v_run pgflow.runs;
  v_child_tasks integer;
  v_written record;
  v_done pgflow.step_states[];
  v_cascades boolean;
  v_going uuid[];
BEGIN
  IF pg_catalog.cardinality(p_run_ids) = 1 THEN
    SELECT ss.status INTO v_state_status FROM pgflow.step_states AS ss
    WHERE ss.run_id = p_run_ids[1] AND ss.step_slug = p_step_slugs[1] FOR UPDATE;
    SELECT t.status, t.execution_mode INTO v_task_status, v_task_mode FROM pgflow.step_tasks AS t
    WHERE t.run_id = p_run_ids[1] AND t.step_slug = p_step_slugs[1] AND t.task_index = p_task_indexes[1] FOR UPDATE;
    SELECT r.status, r.flow_slug, s.step_type INTO v_run_status, v_flow, v_step_type
    FROM pgflow.runs AS r
    LEFT JOIN pgflow.steps AS s ON s.flow_slug = r.flow_slug AND s.step_slug = p_step_slugs[1]
    WHERE r.run_id = p_run_ids[1];
    IF NOT coalesce(v_run_status = 'started' AND v_state_status = 'started' AND v_task_status = 'started'
                    AND v_task_mode = p_execution_mode, false) THEN
      RETURN NULL;
    END IF;
    IF v_step_type = 'single' AND pg_catalog.jsonb_typeof(p_outputs[1]) IS DISTINCT FROM 'array' THEN
      SELECT pg_catalog.format('[TYPE_VIOLATION] step "%s" returned %s, but map step(s) %s need a JSON array from it',
                               p_step_slugs[1],
                               coalesce(pg_catalog.jsonb_typeof(p_outputs[1]), 'no output'),
                               pg_catalog.string_agg('"' || d.step_slug || '"', ', ' ORDER BY d.step_slug))
      INTO v_violation
      FROM pgflow.deps AS d
      JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
      WHERE d.flow_slug = v_flow AND d.dep_slug = p_step_slugs[1] AND c.step_type = 'map'
      HAVING pg_catalog.count(*) > 0;
      IF v_violation IS NOT NULL THEN
        RETURN ARRAY[pgflow._fail_started_task(p_run_ids[1], p_step_slugs[1], p_task_indexes[1], v_violation, true,
                                               p_outputs[1])];
      END IF;
    END IF;

    UPDATE pgflow.step_tasks AS t
       SET status = 'completed', completed_at = GREATEST(pg_catalog.now(), t.started_at), output = p_outputs[1]
     WHERE t.run_id = p_run_ids[1] AND t.step_slug = p_step_slugs[1] AND t.task_index = p_task_indexes[1]
    RETURNING t.* INTO v_task;
    UPDATE pgflow.step_states AS ss
       SET remaining_tasks = ss.remaining_tasks - 1,
           status = CASE WHEN ss.remaining_tasks = 1 THEN 'completed' ELSE ss.status END,
           completed_at = CASE WHEN ss.remaining_tasks = 1 THEN pg_catalog.now() ELSE ss.completed_at END,
           output = CASE WHEN ss.remaining_tasks <> 1 THEN ss.output
                         WHEN v_step_type = 'map' THEN
                           coalesce((SELECT pg_catalog.jsonb_agg(t.output ORDER BY t.task_index)
                                     FROM pgflow.step_tasks AS t
                                     WHERE t.run_id = ss.run_id AND t.step_slug = ss.step_slug AND t.status = 'completed'),
                                    '[]'::jsonb)
                         ELSE p_outputs[1] END
     WHERE ss.run_id = p_run_ids[1] AND ss.step_slug = p_step_slugs[1]
    RETURNING ss.* INTO v_state;
    IF v_state.remaining_tasks = 0 THEN
      IF pg_catalog.jsonb_typeof(v_state.output) = 'array' THEN
        v_child_tasks := pg_catalog.jsonb_array_length(v_state.output);
      END IF;
      UPDATE pgflow.step_states AS cs
         SET remaining_deps = cs.remaining_deps - 1,
             initial_tasks = CASE WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN v_child_tasks
                                  ELSE cs.initial_tasks END
        FROM pgflow.deps AS d
        JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
       WHERE d.flow_slug = v_flow AND d.dep_slug = p_step_slugs[1]
         AND cs.run_id = p_run_ids[1] AND cs.step_slug = d.step_slug AND cs.status = 'created';
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
       WHERE r.run_id = p_run_ids[1]
      RETURNING r.* INTO v_run;
      IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL THEN
        PERFORM pgflow._broadcast_step(v_state);
        IF v_run.status = 'completed' THEN
          PERFORM pgflow._broadcast_run(v_run);
        END IF;
      END IF;
      IF v_run.status <> 'completed' THEN
        PERFORM pgflow._advance_run(p_run_ids[1]);
      END IF;
    END IF;
    RETURN ARRAY[v_task];
  END IF;

  -- several elements
  -- a task twice (the second is a late report) or two steps of one run (the first step's
  -- completion moves the run on between them) must go element by element
  IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL
     OR (SELECT pg_catalog.count(DISTINCT (u.run_id, u.step_slug, u.task_index)) <> pg_catalog.count(*)
                OR pg_catalog.count(DISTINCT (u.run_id, u.step_slug)) <> pg_catalog.count(DISTINCT u.run_id)
         FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs),
                         pg_catalog.unnest(p_task_indexes)) AS u (run_id, step_slug, task_index)) THEN
    RETURN NULL;
  END IF;

  v_written := pgflow._write_task_completions(p_run_ids, p_step_slugs, p_task_indexes, p_outputs, p_execution_mode);
  IF v_written.tasks IS NULL THEN
    RETURN NULL;
  END IF;
  v_done := v_written.completed_steps;
  IF v_done IS NULL THEN
    RETURN v_written.tasks;
  END IF;
  -- Moving the runs on (realtime.send does not exist here: several elements need its absence). A
  -- run whose last step completed was completed by _write_task_completions (which sends nothing,
  -- so the others' messages keep their order); the others move on in array order. One run goes
  -- through _advance_run; several too, each by itself, when a flow of them has a condition or a map
  -- step. Otherwise _advance_run would only start their ready steps, which can start together.
  SELECT pg_catalog.array_agg(d.run_id ORDER BY d.n), pg_catalog.bool_or(d.cascades)
  INTO v_going, v_cascades
  FROM (SELECT u.run_id, u.ordinality AS n,
               EXISTS (SELECT 1 FROM pgflow.steps AS s
                       WHERE s.flow_slug = r.flow_slug
                         AND (s.required_input_pattern IS NOT NULL OR s.forbidden_input_pattern IS NOT NULL
                              OR s.step_type = 'map')) AS cascades
        FROM pg_catalog.unnest(v_done) WITH ORDINALITY AS u
        JOIN pgflow.runs AS r ON r.run_id = u.run_id
        WHERE r.status = 'started') AS d;
  IF v_going IS NULL THEN
    RETURN v_written.tasks;
  END IF;
  IF v_cascades OR pg_catalog.cardinality(v_going) = 1 THEN
    FOR v_i IN 1 .. pg_catalog.cardinality(v_going) LOOP
      PERFORM pgflow._advance_run(v_going[v_i]);
    END LOOP;
  ELSIF NOT pgflow._start_ready_steps_of_runs(v_going) THEN
    FOR v_i IN 1 .. pg_catalog.cardinality(v_going) LOOP
      PERFORM pgflow.start_ready_steps(v_going[v_i]);
    END LOOP;
  END IF;
  RETURN v_written.tasks;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._complete_started_tasks(uuid[], text[], integer[], jsonb[], text) FROM PUBLIC;
