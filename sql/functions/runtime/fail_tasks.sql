-- Fails many worker tasks in one call (0010). tasks: a JSON array of {"run_id", "step_slug",
-- "task_index", "error_message"} objects (error_message a string or null). Each element is one
-- fail_task call, in array order, in the caller's transaction: retry with backoff, or exhaustion
-- (when_exhausted decides), each archiving or deferring its own message as fail_task does. Checks,
-- run lock order and errors as complete_tasks ("fail_tasks(): element <index>: ..."); nothing of
-- the batch is applied when one element fails. Returns the task rows in array order.
CREATE OR REPLACE FUNCTION pgflow.fail_tasks(tasks jsonb)
--@include functions/runtime/parts/report_worker_tasks.sql kind=fail
REVOKE ALL ON FUNCTION pgflow.fail_tasks(jsonb) FROM PUBLIC;
