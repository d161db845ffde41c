-- Completes many worker tasks in one call. tasks: a JSON array of {"run_id": uuid text,
-- "step_slug": text, "task_index": integer, "output": any JSON} objects. The same per-task
-- semantics, checks and errors as one complete_task per element in array order, in the caller's
-- transaction (docs/runtime.md "Batch reports"):
--   * every element is checked first; a malformed one raises 22023 naming its 0-based index;
--   * every named run is locked in run_id order before any element is applied, FOR UPDATE where
--     the batch may end a step, else FOR NO KEY UPDATE (_task_report_elements), so two batch
--     callers (and a batch and a claim, which locks its runs in the same order) never deadlock;
--     then the step states, and every task it names in key order (the claims' order: a claim runs
--     beside a batch that only counts down, and may name the same tasks);
--   * an element's error (PF010 for a manual task, ...) is raised with the single call's SQLSTATE,
--     detail and hint, the message prefixed "complete_tasks(): element <index>: "; the whole call
--     rolls back and nothing of the batch is applied;
--   * a batch of completions that cannot see each other (different tasks, one step per run, so
--     several tasks of one map step; all started, no [TYPE_VIOLATION], no realtime.send:
--     _complete_started_tasks decides) is applied set-wise, one statement per table;
--     any other batch goes element by element, each element as complete_task applies it; so does a
--     batch whose set-wise pass raised (the pass is undone and the element raises its error again,
--     naming itself), except a deadlock or lock timeout, which is the caller's to retry;
--   * the messages of the tasks it finishes are archived at the end, in one helper call (one
--     pgmq.archive per queue); a late report's message is archived as complete_task does.
-- Returns the task rows in array order (an unknown run or task returns nothing, as the single call).
CREATE OR REPLACE FUNCTION pgflow.complete_tasks(tasks jsonb)
RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_runs uuid[];
  v_steps text[];
  v_indexes integer[];
  v_outputs jsonb[];
  v_tasks pgflow.step_tasks[];
  v_at integer;  -- the element being applied (a FOR loop's own variable is not visible in the handler)
  v_report record;
  v_task pgflow.step_tasks;
  v_archive_runs uuid[] := '{}';
  v_archive_steps text[] := '{}';
  v_archive_indexes integer[] := '{}';
  v_sqlstate text;
  v_message text;
  v_detail text;
  v_hint text;
BEGIN
  SELECT e.run_ids, e.step_slugs, e.task_indexes, e.reported INTO v_runs, v_steps, v_indexes, v_outputs
  FROM pgflow._task_report_elements('complete_tasks', complete_tasks.tasks, 'output') AS e;
  IF v_runs IS NULL THEN
    RETURN;
  END IF;

  BEGIN
    v_tasks := pgflow._complete_started_tasks(v_runs, v_steps, v_indexes, v_outputs, 'queue');
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_sqlstate = RETURNED_SQLSTATE;
    IF v_sqlstate IN ('40001', '40P01', '55P03') THEN
      RAISE;  -- a deadlock or lock timeout is the caller's to retry, as in the element path
    END IF;
    -- anything else is undone; the element path below raises it again, naming its element
    v_tasks := NULL;
  END;

  BEGIN
    IF v_tasks IS NOT NULL THEN
      RETURN QUERY SELECT * FROM pg_catalog.unnest(v_tasks);
      v_archive_runs := v_runs;
      v_archive_steps := v_steps;
      v_archive_indexes := v_indexes;
    ELSE
      FOR v_i IN 1 .. pg_catalog.cardinality(v_runs) LOOP
        v_at := v_i;
        -- as complete_task: a started task completes, any other report goes to _lock_worker_task
        v_task := (pgflow._complete_started_tasks(ARRAY[v_runs[v_i]], ARRAY[v_steps[v_i]], ARRAY[v_indexes[v_i]],
                                                  ARRAY[v_outputs[v_i]], 'queue'))[1];
        IF v_task.run_id IS NULL THEN
          v_report := pgflow._lock_worker_task('complete_task', v_runs[v_i], v_steps[v_i], v_indexes[v_i]);
          v_task := v_report.task;
          CONTINUE WHEN v_task.run_id IS NULL;
        END IF;
        RETURN NEXT v_task;
        -- a finished (or late) completion's message; a queued task keeps its message
        IF v_task.status <> 'queued' THEN
          v_archive_runs := v_archive_runs || v_task.run_id;
          v_archive_steps := v_archive_steps || v_task.step_slug;
          v_archive_indexes := v_archive_indexes || v_task.task_index;
        END IF;
      END LOOP;
    END IF;
    v_at := NULL;
    IF pg_catalog.cardinality(v_archive_runs) > 0 THEN
      PERFORM pgflow._archive_task_messages(v_archive_runs, v_archive_steps, v_archive_indexes);
    END IF;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_sqlstate = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                            v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    PERFORM pgflow._raise_task_report_error('complete_tasks', v_at - 1, v_sqlstate, v_message, v_detail, v_hint);
  END;
END;
$$;
REVOKE ALL ON FUNCTION pgflow.complete_tasks(jsonb) FROM PUBLIC;
