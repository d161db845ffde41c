CREATE OR REPLACE FUNCTION pgflow._forbid_queue_name_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = ''
AS $$
BEGIN
  RAISE EXCEPTION 'step_tasks.queue_name is an immutable snapshot: task %/%/% stays in queue "%"',
    OLD.run_id, OLD.step_slug, OLD.task_index, OLD.queue_name
    USING ERRCODE = '55000',
          HINT = 'a task never moves to another queue; start a new run on the flow that owns the other queue';
END;
$$;
CREATE OR REPLACE TRIGGER step_tasks_queue_name_immutable
  BEFORE UPDATE OF queue_name ON pgflow.step_tasks
  FOR EACH ROW WHEN (OLD.queue_name IS DISTINCT FROM NEW.queue_name)
  EXECUTE FUNCTION pgflow._forbid_queue_name_change();
