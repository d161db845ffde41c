-- Records a worker task's success. A late call (run or step no longer started, task terminal)
-- changes nothing and archives the task's message idempotently; a queued task (requeued by stalled
-- recovery) is left alone with its message; a manual task is refused (PF010). Otherwise the
-- worker progression _complete_worker_progress runs (0013; task and step completion, map aggregation in
-- task_index order, children released, the run moves on; [TYPE_VIOLATION] for a non-array feeding
-- a map step) and the task's message is archived.
CREATE OR REPLACE FUNCTION pgflow.complete_task(run_id uuid, step_slug text, task_index integer, output jsonb)
--@include functions/runtime/parts/task_call_header.sql
BEGIN
  --@include functions/runtime/parts/lock_and_load_task.sql fn=complete_task

  v_task := pgflow._complete_worker_progress(complete_task.run_id, complete_task.step_slug, complete_task.task_index,
                                             complete_task.output);

  PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
  RETURN NEXT v_task;
END;
$$;
