  SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = {{fn}}.run_id FOR UPDATE;
  IF v_run.run_id IS NULL THEN
    RETURN;
  END IF;
  SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
  WHERE ss.run_id = {{fn}}.run_id AND ss.step_slug = {{fn}}.step_slug FOR UPDATE;
  SELECT t.* INTO v_task FROM pgflow.step_tasks AS t
  WHERE t.run_id = {{fn}}.run_id AND t.step_slug = {{fn}}.step_slug
    AND t.task_index = {{fn}}.task_index FOR UPDATE;
  IF v_task.run_id IS NULL THEN
    RETURN;
  END IF;
  IF v_task.execution_mode = 'manual' THEN
    PERFORM pgflow._refuse_worker_report_of_manual_task('{{fn}}', v_task);
  END IF;

  IF v_run.status <> 'started' OR v_state.status <> 'started' OR v_task.status <> 'started' THEN
    IF NOT (v_task.status = 'queued' AND v_run.status = 'started' AND v_state.status = 'started') THEN
      PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
    END IF;
    RETURN NEXT v_task;
    RETURN;
  END IF;
