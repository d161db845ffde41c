-- Fails many worker tasks in one call. tasks: a JSON array of {"run_id", "step_slug",
-- "task_index", "error_message"} objects (error_message a string or null), each optionally with
-- "retry_delay_seconds" (a number or null) and "fail_now" (true, false or null): fail_task's
-- arguments of those names; a missing key is NULL, as in fail_task's four-argument form. Each
-- element is one fail_task call, in array order, in the caller's transaction: retry after the
-- element's delay or the step's backoff, or exhaustion or fail-now (when_exhausted decides), each
-- archiving or deferring its own message as fail_task does. Checks, run lock order and errors as
-- complete_tasks ("fail_tasks(): element <index>: ..."), fail_task's PF013 for an element's
-- retry directive included; nothing of the batch is applied when one element fails. Returns the
-- task rows in array order.
CREATE OR REPLACE FUNCTION pgflow.fail_tasks(tasks jsonb)
RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_runs uuid[];
  v_steps text[];
  v_indexes integer[];
  v_errors jsonb[];
  v_element jsonb;
  v_seconds numeric;
  v_delay double precision;
  v_at integer;  -- the element being applied (a FOR loop's own variable is not visible in the handler)
  v_task pgflow.step_tasks;
  v_sqlstate text;
  v_message text;
  v_detail text;
  v_hint text;
BEGIN
  SELECT e.run_ids, e.step_slugs, e.task_indexes, e.reported INTO v_runs, v_steps, v_indexes, v_errors
  FROM pgflow._task_report_elements('fail_tasks', fail_tasks.tasks, 'error_message') AS e;
  IF v_runs IS NULL THEN
    RETURN;
  END IF;

  BEGIN
    FOR v_i IN 1 .. pg_catalog.cardinality(v_runs) LOOP
      v_at := v_i;
      v_element := fail_tasks.tasks -> (v_i - 1);
      v_seconds := (v_element ->> 'retry_delay_seconds')::numeric;
      -- JSON numbers have no range; beyond double precision's they are infinite (and refused as such)
      -- or, below its smallest magnitude, zero
      v_delay := CASE WHEN pg_catalog.abs(v_seconds) > 1e300 THEN pg_catalog.sign(v_seconds)::double precision * 'Infinity'
                      WHEN pg_catalog.abs(v_seconds) < 1e-300 THEN 0
                      ELSE v_seconds::double precision END;
      SELECT * INTO v_task
      FROM pgflow.fail_task(v_runs[v_i], v_steps[v_i], v_indexes[v_i], v_errors[v_i] #>> '{}', v_delay,
                            (v_element ->> 'fail_now')::boolean);
      CONTINUE WHEN NOT FOUND;
      RETURN NEXT v_task;
    END LOOP;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_sqlstate = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                            v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    PERFORM pgflow._raise_task_report_error('fail_tasks', v_at - 1, v_sqlstate, v_message, v_detail, v_hint);
  END;
END;
$$;
REVOKE ALL ON FUNCTION pgflow.fail_tasks(jsonb) FROM PUBLIC;
