--@note Protocol-1 baseline: pgflow.start_ready_steps as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/runtime/start_ready_steps.sql.
-- Starts every ready step of a started run: status created, all dependencies done, at least one
-- task. One PGMQ message per task ({flow_slug, run_id, step_slug, task_index}) goes to the
-- flow's queue in one send_batch per step, delayed by the step's start_delay; message ids are
-- paired with task indexes by ordinality; one queued step_tasks row per task.
--@include functions/runtime/start_ready_steps.sql lines=1-13
  v_state pgflow.step_states;
--@include functions/runtime/start_ready_steps.sql lines=18-24
  WITH ready AS (
    SELECT ss.step_slug
    FROM pgflow.step_states AS ss
    WHERE ss.run_id = start_ready_steps.run_id
      AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks > 0
    ORDER BY ss.step_slug
    FOR UPDATE
  ), started AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'started', started_at = pg_catalog.now(), remaining_tasks = ss.initial_tasks
      FROM ready
     WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = ready.step_slug
--@include functions/runtime/start_ready_steps.sql lines=32-40
    SELECT ss.initial_tasks, coalesce(s.opt_start_delay, 0)
    INTO v_tasks, v_delay
--@include functions/runtime/start_ready_steps.sql lines=43-45

    INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id)
    SELECT v_flow, start_ready_steps.run_id, v_step, (m.n - 1)::integer, m.msg_id
    FROM pgmq.send_batch(
           v_flow,
--@include functions/runtime/start_ready_steps.sql lines=56-63
    SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
    WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;
    PERFORM pgflow._broadcast_step(v_state);
--@include functions/runtime/start_ready_steps.sql lines=69-71
