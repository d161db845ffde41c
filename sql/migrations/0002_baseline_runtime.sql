-- 0002 baseline runtime: the released pgflow runtime (0.16.0 semantics, with the 0.15.1
-- correctness fixes) on top of the 0001 tables. This is the state an upgrade starts from.
--
-- In this baseline a task's PGMQ queue is its flow slug. Every message mutation after the
-- initial send goes through two helpers, _archive_task_messages and _set_task_messages_vt
-- (docs/architecture.md "Queue operations go through two helpers"); the queue-identity
-- migration replaces the helpers, start_ready_steps, start_tasks and the definition
-- functions, and nothing else needs a second copy.
--
-- Conventions:
--   * every function runs with search_path = '' and qualifies every name;
--   * plpgsql functions whose parameters share a name with a column use
--     "#variable_conflict use_column" and refer to a parameter as <function>.<parameter>;
--   * errors use the PF SQLSTATEs of docs/architecture.md;
--   * realtime, pg_net, vault and pg_cron are optional: they are reached only after a catalog
--     check, so nothing in the core needs them.
--
-- Lock order (the same everywhere, so workers, recovery, definition changes and deletion
-- cannot deadlock; docs/runtime.md explains it):
--   flow advisory lock (1, hashtext(flow_slug))   definition changes, start_flow (shared), deletion
--   -> runs row                                    complete_task, fail_task (FOR UPDATE), start_tasks
--                                                  (FOR SHARE), deletion, pruning
--   -> step_states rows                            by (run_id, step_slug)
--   -> step_tasks rows                             UPDATE ... RETURNING, or FOR UPDATE [SKIP LOCKED]
--                                                  (recovery never waits: SKIP LOCKED)
--   -> PGMQ queue rows / tables                    only through the two helpers (or drop_queue)

------------------------------------------------------------------------------------------------
-- Utilities
------------------------------------------------------------------------------------------------

--@include released/0002/functions/supabase/is_local.sql as-create

--@include functions/runtime/calculate_retry_delay.sql as-create

--@include functions/supabase/_broadcast.sql as-create

--@include functions/supabase/_broadcast_run.sql as-create

--@include functions/supabase/_broadcast_step.sql as-create

------------------------------------------------------------------------------------------------
-- Queue helpers: the only place where the runtime changes an existing message.
-- Baseline rule: a task's queue is its flow slug (step_tasks.flow_slug = runs.flow_slug).
-- Callers update step_tasks first and call a helper afterwards (task rows before queue rows).
------------------------------------------------------------------------------------------------

--@include baseline/queues/_archive_task_messages.sql as-create

--@include baseline/queues/_set_task_messages_vt.sql as-create

--@include functions/queues/set_vt_batch.sql as-create

------------------------------------------------------------------------------------------------
-- Definitions
------------------------------------------------------------------------------------------------

--@include baseline/definitions/create_flow.sql as-create

--@include baseline/definitions/add_step.sql as-create

--@include released/0002/functions/definitions/_get_flow_shape.sql as-create

--@include functions/definitions/_normalize_shape_pattern.sql as-create

--@include released/0002/functions/definitions/_compare_flow_shapes.sql as-create

--@include released/0002/functions/definitions/_create_flow_from_shape.sql as-create

--@include baseline/definitions/delete_flow_and_data.sql as-create

--@include baseline/definitions/ensure_flow_compiled.sql as-create

------------------------------------------------------------------------------------------------
-- Runtime: internal transitions (callers hold the run row lock)
------------------------------------------------------------------------------------------------

--@include functions/runtime/_fail_run.sql as-create

--@include functions/runtime/_release_children_of_skipped.sql as-create

--@include functions/runtime/_skip_step.sql as-create

--@include functions/runtime/_cascade_force_skip_steps.sql as-create

--@include functions/runtime/cascade_resolve_conditions.sql as-create

--@include functions/runtime/cascade_complete_taskless_steps.sql as-create

--@include functions/runtime/maybe_complete_run.sql as-create

--@include baseline/runtime/start_ready_steps.sql as-create

--@include released/0002/functions/runtime/_advance_run.sql as-create

------------------------------------------------------------------------------------------------
-- Runtime: public entry points
------------------------------------------------------------------------------------------------

--@include released/0002/functions/runtime/start_flow.sql as-create

--@include baseline/claim/start_tasks.sql as-create

--@include released/0002/functions/runtime/complete_task.sql as-create

--@include released/0002/functions/runtime/fail_task.sql as-create

--@include released/0002/functions/maintenance/requeue_stalled_tasks.sql as-create

--@include released/0002/functions/runtime/get_run_with_states.sql as-create

--@include functions/runtime/start_flow_with_states.sql as-create

--@include baseline/claim/poll_for_tasks.sql as-create

------------------------------------------------------------------------------------------------
-- Workers
------------------------------------------------------------------------------------------------

--@include functions/workers/track_worker_function.sql as-create

--@include baseline/workers/register_worker.sql as-create

--@include released/0002/functions/workers/send_heartbeat.sql as-create

--@include functions/workers/mark_worker_stopped.sql as-create

--@include functions/supabase/ensure_workers.sql as-create

--@include functions/supabase/_require_pg_cron.sql as-create

--@include functions/supabase/setup_ensure_workers_cron.sql as-create

--@include functions/supabase/setup_requeue_stalled_tasks_cron.sql as-create

--@include released/0002/functions/supabase/cleanup_ensure_workers_logs.sql as-create

------------------------------------------------------------------------------------------------
-- Privileges: nothing is executable by PUBLIC; operators grant to their own roles.
------------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgflow FROM PUBLIC;
