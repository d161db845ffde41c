-- Records a worker task's failure; error_message says why (NULL is allowed). Late, repeated and
-- unknown reports and manual tasks are handled as complete_task handles them (_lock_worker_task).
-- The handler may steer what happens next (both are recorded on the task row with the failure:
-- step_tasks.requested_retry_delay and step_tasks.failed_now):
--   retry_delay_seconds  seconds (fractions are rounded up: PGMQ's visibility is whole seconds)
--                        before the next attempt may run, used instead of the step's
--                        backoff while attempts remain; NULL: the backoff. Ignored once the attempts
--                        are used up: the task then fails as any exhausted task does;
--   fail_now             true: the task fails for good now, whatever attempts remain; its step's
--                        when_exhausted applies as for an exhausted task.
-- Neither changes how attempts are counted (the claim counts them).
-- With attempts left (attempts_count < effective max_attempts) and fail_now false the task is
-- queued again and its message becomes visible after retry_delay_seconds, or else after
-- calculate_retry_delay(effective base_delay, attempts_count) seconds. A task whose message no
-- longer exists (a permanently stalled task) cannot be retried and is treated as exhausted. An
-- exhausted or failed-now task fails for good through _fail_started_task (its step's
-- when_exhausted decides: fail, skip or skip-cascade), then its message is archived. Returns the
-- task row.
-- Raises PF013, before anything is locked or changed, for a retry_delay_seconds that is negative,
-- NaN, infinite or above 2147483647 (the largest visibility offset PGMQ's integer seconds carry),
-- and for a retry delay together with fail_now.
-- Locks: the run FOR UPDATE (a failure can end its step or the run and change sibling tasks, so
-- claims of the run take turns with it), then its step state and the task (docs/runtime.md).
CREATE OR REPLACE FUNCTION pgflow.fail_task(run_id uuid, step_slug text, task_index integer, error_message text,
                                            retry_delay_seconds double precision, fail_now boolean DEFAULT false)
RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_report record;
  v_task pgflow.step_tasks;
  v_max_attempts integer;
  v_base_delay integer;
  v_error text := fail_task.error_message;
  v_fail_now boolean := coalesce(fail_task.fail_now, false);
  v_delay integer;
BEGIN
  IF fail_task.retry_delay_seconds IS NOT NULL THEN
    IF fail_task.retry_delay_seconds = 'NaN'::double precision
       OR fail_task.retry_delay_seconds NOT BETWEEN 0 AND 2147483647 THEN
      RAISE EXCEPTION 'fail_task(): retry_delay_seconds must be a number of seconds from 0 to 2147483647, not %',
        fail_task.retry_delay_seconds
        USING ERRCODE = 'PF013',
              HINT = 'pass NULL for the step''s backoff; a handler that wants no retry at all fails now (fail_now => true)';
    END IF;
    IF v_fail_now THEN
      RAISE EXCEPTION 'fail_task(): a failure either sets a retry delay or fails now, not both'
        USING ERRCODE = 'PF013',
              HINT = 'pass retry_delay_seconds => NULL with fail_now => true';
    END IF;
    v_delay := pg_catalog.ceil(fail_task.retry_delay_seconds)::integer;
  END IF;

  PERFORM 1 FROM pgflow.runs AS r WHERE r.run_id = fail_task.run_id FOR UPDATE;
  v_report := pgflow._lock_worker_task('fail_task', fail_task.run_id, fail_task.step_slug, fail_task.task_index);
  v_task := v_report.task;
  IF v_task.run_id IS NULL THEN
    RETURN;
  END IF;
  IF NOT v_report.started THEN
    RETURN NEXT v_task;
    RETURN;
  END IF;

  SELECT coalesce(s.opt_max_attempts, f.opt_max_attempts), coalesce(s.opt_base_delay, f.opt_base_delay)
  INTO v_max_attempts, v_base_delay
  FROM pgflow.steps AS s
  JOIN pgflow.flows AS f ON f.flow_slug = s.flow_slug
  WHERE s.flow_slug = v_task.flow_slug AND s.step_slug = fail_task.step_slug;

  IF v_task.attempts_count < v_max_attempts AND NOT v_fail_now THEN
    UPDATE pgflow.step_tasks AS t
       SET status = 'queued', started_at = NULL, error_message = v_error,
           requested_retry_delay = v_delay, failed_now = false
     WHERE t.run_id = fail_task.run_id AND t.step_slug = fail_task.step_slug AND t.task_index = fail_task.task_index
    RETURNING t.* INTO v_task;
    IF pgflow._set_task_messages_vt(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index],
                                    ARRAY[coalesce(v_delay, pgflow.calculate_retry_delay(v_base_delay, v_task.attempts_count))]) > 0 THEN
      RETURN NEXT v_task;
      RETURN;
    END IF;
    v_error := v_error || ' (not retried: the task''s queue message no longer exists)';
  END IF;

  UPDATE pgflow.step_tasks AS t
     SET requested_retry_delay = v_delay, failed_now = v_fail_now
   WHERE t.run_id = fail_task.run_id AND t.step_slug = fail_task.step_slug AND t.task_index = fail_task.task_index;
  v_task := pgflow._fail_started_task(fail_task.run_id, fail_task.step_slug, fail_task.task_index, v_error, false, NULL);
  PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
  RETURN NEXT v_task;
END;
$$;
REVOKE ALL ON FUNCTION pgflow.fail_task(uuid, text, integer, text, double precision, boolean) FROM PUBLIC;

-- The released four-argument form: a failure without a retry delay or fail-now (the step's
-- backoff, then when_exhausted), exactly as the form above with retry_delay_seconds NULL. It keeps
-- its own signature (and so every grant on it) because a defaulted retry delay on the form above
-- would make every four-argument call ambiguous between the two.
CREATE OR REPLACE FUNCTION pgflow.fail_task(run_id uuid, step_slug text, task_index integer, error_message text)
RETURNS SETOF pgflow.step_tasks
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  SELECT * FROM pgflow.fail_task($1, $2, $3, $4, NULL::double precision, false)
$$;
