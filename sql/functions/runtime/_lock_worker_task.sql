-- What every worker report (complete_task, fail_task, each element of complete_tasks) does before
-- it records anything: it locks the run row FOR NO KEY UPDATE, then the step state, then the task
-- (the runtime's lock order: a report takes turns with the other reports of the run), and decides
-- whether the report still counts. A caller whose report can end the step or the run, or change
-- other tasks (a failure), holds the run FOR UPDATE already, so claims of the run wait for it; the
-- run lock here is never stronger than that, because a caller may hold its task row by now and a
-- stronger run lock would then wait for a claim that waits for that task. A worker report may arrive late or twice, so only a
-- task that is started in a started step of a started run takes it.
-- p_function names the entry point in the error it raises.
-- Returns (task, started):
--   task NULL                  no such run or task: the caller returns nothing;
--   started false              a late report (the run or step is no longer started, or the task is
--                              not started): nothing changes (but the refusal count of a cancelled
--                              task, refused_reports) and the task's message is archived
--                              here, idempotently, unless stalled recovery queued the task again in
--                              a run and step that go on (the next claim needs that message); the
--                              caller returns the task as it is;
--   started true               the caller records the report.
-- Raises PF010 for a manual task, whatever its state: no worker ever claimed it, so a worker report
-- of it is a bug or a forgery.
CREATE OR REPLACE FUNCTION pgflow._lock_worker_task(p_function text, p_run_id uuid, p_step_slug text, p_task_index integer,
                                                    OUT task pgflow.step_tasks, OUT started boolean)
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_run pgflow.runs;
  v_state pgflow.step_states;
BEGIN
  started := false;
  SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = p_run_id FOR NO KEY UPDATE;
  IF v_run.run_id IS NULL THEN
    RETURN;
  END IF;
  SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
  WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug FOR UPDATE;
  SELECT t.* INTO task FROM pgflow.step_tasks AS t
  WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.task_index = p_task_index FOR UPDATE;
  IF task.run_id IS NULL THEN
    RETURN;
  END IF;
  IF task.execution_mode = 'manual' THEN
    RAISE EXCEPTION '%(): task %/%/% is a manual task (no queue, no worker); a worker cannot report it',
      p_function, task.run_id, task.step_slug, task.task_index
      USING ERRCODE = 'PF010',
            HINT = 'trusted server code completes it with pgflow.complete_manual_task() or pgflow.fail_manual_task()';
  END IF;

  started := v_run.status = 'started' AND v_state.status = 'started' AND task.status = 'started';
  IF task.status = 'cancelled' THEN
    -- the handler's result came after its run was cancelled (or failed): refused, and counted, so
    -- an operator can see that work went on after the cancel; the caller returns the task as it
    -- is, status cancelled, which tells the worker apart from a recorded report
    UPDATE pgflow.step_tasks AS t
       SET refused_reports = t.refused_reports + 1, last_refused_report_at = pg_catalog.clock_timestamp()
     WHERE t.run_id = task.run_id AND t.step_slug = task.step_slug AND t.task_index = task.task_index
    RETURNING t.* INTO task;
  END IF;
  -- (the task row first, its message after: the helpers' rule)
  IF NOT started AND NOT (task.status = 'queued' AND v_run.status = 'started' AND v_state.status = 'started') THEN
    PERFORM pgflow._archive_task_messages(ARRAY[task.run_id], ARRAY[task.step_slug], ARRAY[task.task_index]);
  END IF;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._lock_worker_task(text, uuid, text, integer) FROM PUBLIC;
