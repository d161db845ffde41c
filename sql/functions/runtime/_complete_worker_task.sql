-- One element of complete_tasks: complete_task without its own archive. Locks run
-- (FOR UPDATE), step state and task, handles a late report as complete_task does (the late
-- task's message is archived here, idempotently; a task stalled recovery queued again keeps it),
-- refuses a manual task (PF010), and otherwise runs _complete_worker_progress. Returns the task row
-- (nothing for an unknown run or task); the caller archives the messages of every returned task
-- that is not queued, in one helper call for the whole batch.
CREATE OR REPLACE FUNCTION pgflow._complete_worker_task(run_id uuid, step_slug text, task_index integer, output jsonb)
--@include functions/runtime/parts/task_call_header.sql
BEGIN
  --@include functions/runtime/parts/lock_and_load_task.sql fn=_complete_worker_task

  RETURN NEXT pgflow._complete_worker_progress(_complete_worker_task.run_id, _complete_worker_task.step_slug,
                                               _complete_worker_task.task_index, _complete_worker_task.output);
END;
$$;
REVOKE ALL ON FUNCTION pgflow._complete_worker_task(uuid, text, integer, jsonb) FROM PUBLIC;
