-- 0009 manual tasks (issue 12): a step with no queue whose tasks trusted server code completes or
-- fails through pgflow.complete_manual_task / pgflow.fail_manual_task (docs/manual-tasks.md).
--
-- Representation: an explicit execution mode on steps and tasks.
--   * steps.execution_mode 'queue' (every existing step) or 'manual'; it is part of the flow
--     shape ("executionMode": "manual"), so switching a step is a shape change. A manual step's
--     queue_name keeps the flow's default queue (the route namespace the flow owns); no task of
--     the step is ever sent there, and the startup route map lists the step with queueName null.
--   * step_tasks.execution_mode: the task's immutable snapshot (a trigger refuses changes, like
--     queue_name). queue_name becomes nullable, and a check keeps the old rule for queue-backed
--     tasks: 'queue' tasks have a queue_name; 'manual' tasks have no queue_name, no message_id,
--     no worker, no requeue or stall marks, and are never 'queued'.
-- Existing rows are all queue-backed: both columns get the constant default (no rewrite).
--
-- Phases (pgflow_cli.installer.PhasedMigration, the convention of 0003). Below the
-- --@online-threshold task rows everything runs in one transaction (the notx phase skipped; main
-- builds the index itself): all or nothing. Above it, each phase commits on its own, and the only
-- locks that block workers are held for metadata-only changes (issue 14):
--   prepare   steps then step_tasks ACCESS EXCLUSIVE, no scan of step_tasks: the two columns
--             (constant default), DROP NOT NULL, both task checks NOT VALID (they hold for every
--             new or changed row from here on), the immutability trigger;
--   validate  VALIDATE both checks (SHARE UPDATE EXCLUSIVE: reads, claims and reports go on);
--   index     the manual-waiting partial index, built CONCURRENTLY (an invalid leftover of a
--             failed build is dropped first; the phase is recorded only with a valid index);
--   main      the functions and grants, ledger row; no table lock.
-- Until main commits the level-8 runtime keeps working (it only creates queue tasks, which the
-- defaults and checks accept). `pgflow migrate apply` resumes an interrupted run;
-- `pgflow migrate abort 9` undoes the committed phases.
-- The end state is the same on both paths (validated checks, valid index, same functions).
--
-- This text replaced the one-transaction text first shipped as 0009; a ledger holding that
-- text's checksum is accepted (installer.PREVIOUS_CHECKSUMS, docs/architecture.md).
--@online-threshold pgflow.step_tasks 100000

--@phase prepare
-- The installer takes these locks first, all or none (docs/architecture.md "Locks a migration
-- takes"), in the order the runtime reaches definitions and tasks.
--@lock pgflow.steps ACCESS EXCLUSIVE
--@lock pgflow.step_tasks ACCESS EXCLUSIVE
LOCK TABLE pgflow.steps, pgflow.step_tasks IN ACCESS EXCLUSIVE MODE;

-- steps holds definitions only (small): its check is validated right away
ALTER TABLE pgflow.steps ADD COLUMN execution_mode text NOT NULL DEFAULT 'queue';
ALTER TABLE pgflow.steps ADD CONSTRAINT execution_mode_is_valid CHECK (execution_mode IN ('queue', 'manual'));
COMMENT ON COLUMN pgflow.steps.execution_mode IS
  'queue: tasks are PGMQ messages for workers; manual: tasks have no queue and no worker, trusted code completes them (complete_manual_task)';

ALTER TABLE pgflow.step_tasks ADD COLUMN execution_mode text NOT NULL DEFAULT 'queue';
ALTER TABLE pgflow.step_tasks ALTER COLUMN queue_name DROP NOT NULL;
ALTER TABLE pgflow.step_tasks ADD CONSTRAINT step_tasks_execution_mode_is_valid
  CHECK (execution_mode IN ('queue', 'manual')) NOT VALID;
ALTER TABLE pgflow.step_tasks ADD CONSTRAINT queue_identity_matches_execution_mode CHECK (
  CASE execution_mode
    WHEN 'queue' THEN queue_name IS NOT NULL
    ELSE queue_name IS NULL AND message_id IS NULL AND last_worker_id IS NULL AND status <> 'queued'
         AND requeued_count = 0 AND last_requeued_at IS NULL AND permanently_stalled_at IS NULL
  END) NOT VALID;
COMMENT ON COLUMN pgflow.step_tasks.execution_mode IS
  'immutable snapshot of the step''s execution mode when the task was created; manual tasks have no queue_name and no message';
COMMENT ON COLUMN pgflow.step_tasks.queue_name IS
  'immutable snapshot of the PGMQ queue holding this task''s message; with message_id it is the message identity (NULL only for manual tasks)';
-- the snapshot is immutable from the moment the column exists (its trigger takes a table lock)
--@apply functions/runtime/_forbid_execution_mode_change.sql sha256=f93273a50373d15aed3a2d3f29e1ad93be5dd07171f754b1fdd382545acf915f

--@phase validate
--@lock pgflow.step_tasks SHARE UPDATE EXCLUSIVE
-- SHARE UPDATE EXCLUSIVE: workers keep reading, claiming and reporting while the table is scanned.
ALTER TABLE pgflow.step_tasks VALIDATE CONSTRAINT step_tasks_execution_mode_is_valid;
ALTER TABLE pgflow.step_tasks VALIDATE CONSTRAINT queue_identity_matches_execution_mode;

-- waiting manual tasks, oldest first (pgflow task list --older-than)
--@phase index notx
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_step_tasks_manual_waiting ON pgflow.step_tasks (started_at)
  WHERE execution_mode = 'manual' AND status = 'started'

--@phase main
-- One transaction: the index phase did not run, so the index is built here, under prepare's
-- locks. Phased: the index phase left a valid index, and nothing here locks a table.
DO $index$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i
                 WHERE i.indexrelid = pg_catalog.to_regclass('pgflow.idx_step_tasks_manual_waiting')
                   AND i.indisvalid) THEN
    DROP INDEX IF EXISTS pgflow.idx_step_tasks_manual_waiting;
    CREATE INDEX idx_step_tasks_manual_waiting ON pgflow.step_tasks (started_at)
      WHERE execution_mode = 'manual' AND status = 'started';
  END IF;
END
$index$;

-- the progression cores shared by worker and manual completion/failure, and the worker paths'
-- refusal of manual tasks
--@apply functions/runtime/_complete_task_progress.sql sha256=d0da119c37ab2193d65bfce48aebf2323fab3b7637dcf0ec1ff896a69cf5a636
--@apply functions/runtime/_fail_task_exhausted.sql sha256=6b15b64fde750336e571dfbaa5cbc437a0673ff8c1e68effd9de8571545b4eb4
--@apply functions/runtime/_refuse_worker_report_of_manual_task.sql sha256=11f6d6f962f0add8e751095135492f5abcdf2066632e7da6b52577fbb14b5fbb
--@apply functions/runtime/complete_task.sql sha256=733309dd7ae1d257e3dbfcd7d36a20d4500b30883f57d732263d1b79872f4ebc
--@apply functions/runtime/fail_task.sql sha256=acd1d2718dc18af78f179377eb389c3b4faa711ddc885cf3e8ddb9e79dd43af1
-- ready manual steps create their tasks without PGMQ; stalled recovery ignores them
--@apply functions/runtime/_start_manual_tasks.sql sha256=42a74beb3f355ba177fce97b83866c8f934ace17da8d4109ae83f483a8bc4623
--@apply functions/runtime/start_ready_steps.sql sha256=20e2a3ef1947dd5cc54aa39b684c610179e99583adc70426392fd36c215fbadd
--@apply functions/maintenance/requeue_stalled_tasks.sql sha256=f541b04f6d87435c105e080050fc4d8a640ee54344a995920da1db93240d3e62
-- the shape carries executionMode; startup compilation validates, compares and persists it (a
-- manual step of a step-queued flow gets no private queue and routes nowhere)
--@apply functions/definitions/_set_step_manual.sql sha256=167c61e88a4505f1c5c57c5731df2c1f751835009bf28c76bac557d4ca85980c
--@apply functions/definitions/_shape_problems.sql sha256=a30da2bdc9b6f5f7cfa19f1f4447f6d3ac316742188b129e19a4f1cdf14d0bf2
--@apply functions/definitions/_get_flow_shape.sql sha256=64db0fe32250d9123a5eb6d7675c2c782fb568330756b8d3d136874f4d41b95e
--@apply functions/definitions/_compare_flow_shapes.sql sha256=34060be478bef32119c67c8d5cc7941f4d725f3c3d9ae511aa8e2b997d92b51f
--@apply functions/queues/_reserve_private_queues.sql sha256=a891d87f7f098ae6014a864afe3ca4ca8ca551b46995db9802e08c45f863a954
--@apply functions/definitions/_step_queue_routes.sql sha256=6767826ad066dc20ab8e0d40dea9e188ad9552d4dac0d542c544835736efad74
--@apply functions/definitions/_create_flow_from_shape.sql sha256=3da9791f4eb63c1aab59e73ba0c736a64c7fc5426714ba7051f6a57d5a81f46c
--@apply functions/definitions/ensure_flow_compiled.sql sha256=da0c457633f7884ab2c6b651dbc09eee8c8de45414336196af84ce74fe8eb3c7
-- the two server-side entry points (SECURITY INVOKER, revoked from PUBLIC in their files)
--@apply functions/runtime/_lock_manual_task.sql sha256=5328a697e2332adf9324356fdd80853c9ba16f0504eec13a63642926ecdef259
--@apply functions/runtime/complete_manual_task.sql sha256=d2860875f8f5c83a327606325a9b76616fcc5792882c9002cf9c9e2134d85ec1
--@apply functions/runtime/fail_manual_task.sql sha256=03eed89b93b736ab66a203dbf8e67cea7aa3233c04f2f7a67e1a2bc1b0d60c3a

-- The internal functions the worker paths now call get granted to the roles that can already
-- call those paths, so an upgrade takes no right away from an existing worker role (the recipe of
-- docs/permissions.md grants EXECUTE on the schema's functions once, before the upgrade). In an
-- upgrade from below 0005, 0005 also left its step-queue provisioning functions to this migration
-- (each file runs once, in the last pending migration that applies it): the same rule grants them.
-- Re-granting what a role already has changes nothing. PUBLIC gets nothing; the manual entry
-- points are granted by nobody here (docs/manual-tasks.md: a trusted role, on purpose).
DO $grants$
DECLARE
  v_grant record;
BEGIN
  FOR v_grant IN
    SELECT r.rolname::text AS rolname, g.fn
    FROM (VALUES
      ('pgflow.complete_task(uuid, text, integer, jsonb)', 'pgflow._complete_task_progress(uuid, text, integer, jsonb)'),
      ('pgflow.complete_task(uuid, text, integer, jsonb)', 'pgflow._refuse_worker_report_of_manual_task(text, pgflow.step_tasks)'),
      ('pgflow.fail_task(uuid, text, integer, text)', 'pgflow._fail_task_exhausted(uuid, text, integer, text)'),
      ('pgflow.fail_task(uuid, text, integer, text)', 'pgflow._refuse_worker_report_of_manual_task(text, pgflow.step_tasks)'),
      ('pgflow.start_ready_steps(uuid)', 'pgflow._start_manual_tasks(uuid, text)'),
      ('pgflow.ensure_flow_compiled(text, jsonb, integer, text, jsonb)', 'pgflow._set_step_manual(text, text)'),
      ('pgflow.ensure_flow_compiled(text, jsonb, integer, text, jsonb)', 'pgflow._create_flow_from_shape(text, jsonb, jsonb)'),
      ('pgflow.ensure_flow_compiled(text, jsonb, integer, text, jsonb)', 'pgflow._reserve_private_queues(text, jsonb)'),
      ('pgflow.ensure_flow_compiled(text, jsonb, integer, text, jsonb)', 'pgflow._step_queue_routes(text, jsonb)'),
      ('pgflow.register_worker(uuid, text, text, text, text, text)', 'pgflow._create_flow_from_shape(text, jsonb, jsonb)'),
      ('pgflow.register_worker(uuid, text, text, text, text, text)', 'pgflow._reserve_private_queues(text, jsonb)'),
      ('pgflow.register_worker(uuid, text, text, text, text, text)', 'pgflow._step_queue_routes(text, jsonb)')
    ) AS g (anchor, fn)
    JOIN pg_catalog.pg_roles AS r
      ON NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_'
     AND pg_catalog.has_function_privilege(r.oid, g.anchor, 'EXECUTE')
    ORDER BY 1, 2
  LOOP
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', v_grant.fn, v_grant.rolname);
  END LOOP;
END
$grants$;

-- Server-only: never reachable by Supabase's client roles, whatever default privileges say.
DO $revoke$
DECLARE
  v_role text;
BEGIN
  FOR v_role IN SELECT r.rolname FROM pg_catalog.pg_roles AS r WHERE r.rolname IN ('anon', 'authenticated') ORDER BY 1 LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION pgflow.complete_manual_task(uuid, text, integer, jsonb) FROM %I', v_role);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION pgflow.fail_manual_task(uuid, text, integer, text) FROM %I', v_role);
  END LOOP;
END
$revoke$;

--@phase abort
-- `pgflow migrate abort 9`, before main committed: back to level 8 (no manual step or task can
-- exist yet: the functions that create them come with main). SET NOT NULL scans the task table
-- under the lock; an abort is rare and short next to a failed upgrade.
--@lock pgflow.steps ACCESS EXCLUSIVE
--@lock pgflow.step_tasks ACCESS EXCLUSIVE
LOCK TABLE pgflow.steps, pgflow.step_tasks IN ACCESS EXCLUSIVE MODE;
DROP INDEX IF EXISTS pgflow.idx_step_tasks_manual_waiting;
DROP TRIGGER IF EXISTS step_tasks_execution_mode_immutable ON pgflow.step_tasks;
DROP FUNCTION IF EXISTS pgflow._forbid_execution_mode_change();
ALTER TABLE pgflow.step_tasks DROP CONSTRAINT queue_identity_matches_execution_mode;
ALTER TABLE pgflow.step_tasks DROP CONSTRAINT step_tasks_execution_mode_is_valid;
ALTER TABLE pgflow.step_tasks ALTER COLUMN queue_name SET NOT NULL;
ALTER TABLE pgflow.step_tasks DROP COLUMN execution_mode;
ALTER TABLE pgflow.steps DROP COLUMN execution_mode;
COMMENT ON COLUMN pgflow.step_tasks.queue_name IS
  'immutable snapshot of the PGMQ queue holding this task''s message; with message_id it is the message identity';
