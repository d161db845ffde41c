-- step_tasks.execution_mode is an immutable snapshot, like queue_name: a manual task never becomes
-- queue-backed (or the reverse), so the manual entry points can trust the task row rather than the
-- current step definition.
CREATE OR REPLACE FUNCTION pgflow._forbid_execution_mode_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = ''
AS $$
BEGIN
  RAISE EXCEPTION 'step_tasks.execution_mode is an immutable snapshot: task %/%/% stays %',
    OLD.run_id, OLD.step_slug, OLD.task_index, OLD.execution_mode
    USING ERRCODE = '55000';
END;
$$;
REVOKE ALL ON FUNCTION pgflow._forbid_execution_mode_change() FROM PUBLIC;
CREATE OR REPLACE TRIGGER step_tasks_execution_mode_immutable
  BEFORE UPDATE OF execution_mode ON pgflow.step_tasks
  FOR EACH ROW WHEN (OLD.execution_mode IS DISTINCT FROM NEW.execution_mode)
  EXECUTE FUNCTION pgflow._forbid_execution_mode_change();
