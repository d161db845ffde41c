-- Completes many worker tasks in one call (0010). tasks: a JSON array of {"run_id": uuid text,
-- "step_slug": text, "task_index": integer, "output": any JSON} objects. The same per-task
-- semantics, checks and errors as one complete_task per element in array order, in the caller's
-- transaction (docs/runtime.md "Batch reports"):
--   * every element is checked first; a malformed one raises 22023 naming its 0-based index;
--   * every named run is locked FOR UPDATE in run_id order before any element is applied, so two
--     batch callers (and a batch and a claim, which locks its runs in the same order) never
--     deadlock; each element then locks its step state and task as the single call does;
--   * an element's error (PF010 for a manual task, ...) is raised with the single call's SQLSTATE,
--     detail and hint, the message prefixed "complete_tasks(): element <index>: "; the whole call
--     rolls back and nothing of the batch is applied;
--   * the messages of the tasks it finishes are archived at the end, in one helper call (one
--     pgmq.archive per queue); a late report's message is archived as complete_task does.
-- Returns the task rows in array order (an unknown run or task returns nothing, as the single call).
CREATE OR REPLACE FUNCTION pgflow.complete_tasks(tasks jsonb)
--@include functions/runtime/parts/report_worker_tasks.sql kind=complete
REVOKE ALL ON FUNCTION pgflow.complete_tasks(jsonb) FROM PUBLIC;
