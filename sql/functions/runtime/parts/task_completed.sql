  UPDATE pgflow.step_tasks AS t
     SET status = 'completed', completed_at = GREATEST(pg_catalog.now(), t.started_at), output = p_output
   WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.task_index = p_task_index
  RETURNING t.* INTO v_task;
