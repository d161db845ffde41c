-- Worker completion and failure (complete_task, fail_task) refuse a manual task: no worker ever
-- claimed it, so a worker report for it is a bug or a forgery. Raises PF010 (execution mode does
-- not match the entry point) naming the task and the manual entry points; never returns.
CREATE OR REPLACE FUNCTION pgflow._refuse_worker_report_of_manual_task(p_function text, p_task pgflow.step_tasks)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  RAISE EXCEPTION '%(): task %/%/% is a manual task (no queue, no worker); a worker cannot report it',
    p_function, p_task.run_id, p_task.step_slug, p_task.task_index
    USING ERRCODE = 'PF010',
          HINT = 'trusted server code completes it with pgflow.complete_manual_task() or pgflow.fail_manual_task()';
END;
$$;
REVOKE ALL ON FUNCTION pgflow._refuse_worker_report_of_manual_task(text, pgflow.step_tasks) FROM PUBLIC;
