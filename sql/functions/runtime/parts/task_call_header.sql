RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_task pgflow.step_tasks;
