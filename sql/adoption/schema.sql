-- Adoption, part 1 of 3: bring the tables and types of a schema that a published pgflow release
-- (0.8.0 .. 0.14.1) installed to pgflow-cli's baseline (migrations 0001 + 0002), in place.
--
-- Runs in one transaction with part 2 (pgflow-cli's own baseline function files, unchanged)
-- and part 3 (adoption/finish.sql), driven by pgflow_cli.upstream.adopt. Every statement is
-- written for every release in that range: columns are added only when missing, constraints
-- are renamed where only the name differs and re-added where the rule differs. No row is
-- deleted; existing values are never rewritten except by the one data migration a later
-- release would have done (the 0.13.0 step output backfill, below).
--
-- Before this file runs, the driver has filled pg_temp.pgflow_adopt_replaced with the names of
-- the functions pgflow-cli's baseline defines (plus the upstream names they replace); those
-- functions are dropped here and created again by part 2. Functions of any other name stay.
--
-- Lock order: the runtime's (flows -> steps -> deps -> runs -> step_states -> step_tasks ->
-- workers -> worker_functions), all ACCESS EXCLUSIVE until the transaction commits.

SET LOCAL jit = off;
SET LOCAL client_min_messages = warning;
LOCK TABLE pgflow.flows, pgflow.steps, pgflow.deps, pgflow.runs, pgflow.step_states, pgflow.step_tasks,
           pgflow.workers IN ACCESS EXCLUSIVE MODE;
DO $lock$
BEGIN
  IF pg_catalog.to_regclass('pgflow.worker_functions') IS NOT NULL THEN
    LOCK TABLE pgflow.worker_functions IN ACCESS EXCLUSIVE MODE;
  END IF;
END
$lock$;

------------------------------------------------------------------------------------------------
-- Functions that pgflow-cli's baseline replaces: remember their grants to named roles, drop them
------------------------------------------------------------------------------------------------

-- Grants to roles other than the owner and PUBLIC, by function name; part 3 gives the same
-- privileges on pgflow-cli's functions of that name (nothing else is granted).
CREATE TEMP TABLE pgflow_adopt_grants ON COMMIT DROP AS
SELECT DISTINCT COALESCE(r.replaced_by, p.proname::text) AS function_name, a.grantee, a.privilege_type, a.is_grantable
FROM pg_catalog.pg_proc AS p
JOIN pg_temp.pgflow_adopt_replaced AS r ON r.name = p.proname::text
CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
WHERE p.pronamespace = 'pgflow'::regnamespace
  AND a.grantee <> 0 AND a.grantee <> p.proowner;

-- The slug checks call is_valid_slug; they are added again in part 3, after it is replaced.
ALTER TABLE pgflow.flows DROP CONSTRAINT IF EXISTS slug_is_valid;
ALTER TABLE pgflow.steps DROP CONSTRAINT IF EXISTS steps_step_slug_check;

DO $drop$
DECLARE
  v_function regprocedure;
BEGIN
  FOR v_function IN
    SELECT p.oid::regprocedure
    FROM pg_catalog.pg_proc AS p
    JOIN pg_temp.pgflow_adopt_replaced AS r ON r.name = p.proname::text
    WHERE p.pronamespace = 'pgflow'::regnamespace
    ORDER BY p.oid
  LOOP
    EXECUTE pg_catalog.format('DROP FUNCTION %s', v_function);
  END LOOP;
END
$drop$;

------------------------------------------------------------------------------------------------
-- Types and columns: add what is missing, with the baseline's names, types and defaults
------------------------------------------------------------------------------------------------

DO $type$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                 WHERE attrelid = 'pgflow.step_task_record'::regclass AND attname = 'flow_input' AND NOT attisdropped) THEN
    ALTER TYPE pgflow.step_task_record ADD ATTRIBUTE flow_input jsonb;
  END IF;
END
$type$;

-- Releases before 0.13.0 do not store step outputs; readers of the baseline do. The column
-- is added here (catalog only); the driver then backfills it as 0.13.0 did (the statement
-- step_output_backfill of sql/queries/adopt.sql): in this transaction for the runs in flight,
-- and for every other run either here too (small databases) or after commit in batches.
ALTER TABLE pgflow.step_states ADD COLUMN IF NOT EXISTS output jsonb;

-- Constraints whose rule is the baseline's under another name are renamed (no scan).
DO $rename$
DECLARE
  v record;
BEGIN
  FOR v IN
    SELECT * FROM (VALUES
      ('deps', 'deps_check', 'deps_not_self'),
      ('runs', 'status_is_valid', 'runs_status_check'),
      ('runs', 'runs_remaining_steps_check', 'remaining_steps_valid'),
      ('step_states', 'step_states_initial_tasks_check', 'initial_tasks_nonnegative'),
      ('step_states', 'step_states_remaining_deps_check', 'remaining_deps_valid')
    ) AS r (table_name, old_name, new_name)
  LOOP
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
               WHERE conrelid = pg_catalog.format('pgflow.%I', v.table_name)::regclass AND conname = v.old_name)
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                       WHERE conrelid = pg_catalog.format('pgflow.%I', v.table_name)::regclass AND conname = v.new_name) THEN
      EXECUTE pg_catalog.format('ALTER TABLE pgflow.%I RENAME CONSTRAINT %I TO %I', v.table_name, v.old_name, v.new_name);
    END IF;
  END LOOP;
END
$rename$;

-- One ALTER TABLE per table: new columns, then every check whose rule differs, added again
-- NOT VALID: no table is scanned while the locks are held. New rows are checked at once;
-- existing rows are checked by VALIDATE CONSTRAINT, in this transaction on small databases
-- (sql/adoption/complete.sql) or after commit on large ones (pgflow_cli.upstream.adopt).
ALTER TABLE pgflow.steps
  ADD COLUMN IF NOT EXISTS required_input_pattern jsonb,
  ADD COLUMN IF NOT EXISTS forbidden_input_pattern jsonb,
  ADD COLUMN IF NOT EXISTS when_unmet text NOT NULL DEFAULT 'skip',
  ADD COLUMN IF NOT EXISTS when_exhausted text NOT NULL DEFAULT 'fail',
  DROP CONSTRAINT IF EXISTS required_input_pattern_is_object,
  DROP CONSTRAINT IF EXISTS forbidden_input_pattern_is_object,
  DROP CONSTRAINT IF EXISTS when_unmet_is_valid,
  DROP CONSTRAINT IF EXISTS when_exhausted_is_valid,
  ADD CONSTRAINT required_input_pattern_is_object
    CHECK (required_input_pattern IS NULL OR jsonb_typeof(required_input_pattern) = 'object') NOT VALID,
  ADD CONSTRAINT forbidden_input_pattern_is_object
    CHECK (forbidden_input_pattern IS NULL OR jsonb_typeof(forbidden_input_pattern) = 'object') NOT VALID,
  ADD CONSTRAINT when_unmet_is_valid CHECK (when_unmet IN ('fail', 'skip', 'skip-cascade')) NOT VALID,
  ADD CONSTRAINT when_exhausted_is_valid CHECK (when_exhausted IN ('fail', 'skip', 'skip-cascade')) NOT VALID;

ALTER TABLE pgflow.step_states
  ADD COLUMN IF NOT EXISTS skip_reason text,
  ADD COLUMN IF NOT EXISTS skipped_at timestamptz,
  DROP CONSTRAINT IF EXISTS completed_at_or_failed_at,
  DROP CONSTRAINT IF EXISTS completed_at_or_failed_at_or_skipped_at,
  DROP CONSTRAINT IF EXISTS output_only_for_completed_or_null,
  DROP CONSTRAINT IF EXISTS status_is_valid,
  DROP CONSTRAINT IF EXISTS remaining_tasks_state_consistency,
  DROP CONSTRAINT IF EXISTS output_only_for_completed,
  DROP CONSTRAINT IF EXISTS skip_reason_matches_status,
  DROP CONSTRAINT IF EXISTS at_most_one_terminal_timestamp,
  DROP CONSTRAINT IF EXISTS skipped_at_is_after_created_at,
  ADD CONSTRAINT status_is_valid CHECK (status IN ('created', 'started', 'completed', 'failed', 'skipped')) NOT VALID,
  ADD CONSTRAINT remaining_tasks_state_consistency CHECK (
    remaining_tasks IS NULL OR status NOT IN ('created', 'skipped')) NOT VALID,
  ADD CONSTRAINT output_only_for_completed CHECK (output IS NULL OR status = 'completed') NOT VALID,
  ADD CONSTRAINT skip_reason_matches_status CHECK ((status = 'skipped') = (skip_reason IS NOT NULL)) NOT VALID,
  ADD CONSTRAINT at_most_one_terminal_timestamp CHECK (
    (completed_at IS NOT NULL)::int + (failed_at IS NOT NULL)::int + (skipped_at IS NOT NULL)::int <= 1) NOT VALID,
  ADD CONSTRAINT skipped_at_is_after_created_at CHECK (skipped_at IS NULL OR skipped_at >= created_at) NOT VALID;

-- requeued_count NOT NULL DEFAULT 0 is a catalog-only change (no table rewrite).
ALTER TABLE pgflow.step_tasks
  ADD COLUMN IF NOT EXISTS requeued_count integer NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS last_requeued_at timestamptz,
  ADD COLUMN IF NOT EXISTS permanently_stalled_at timestamptz,
  DROP CONSTRAINT IF EXISTS completed_at_is_after_queued_at,
  DROP CONSTRAINT IF EXISTS failed_at_is_after_queued_at,
  DROP CONSTRAINT IF EXISTS valid_status,
  DROP CONSTRAINT IF EXISTS completed_at_is_after_started_at,
  DROP CONSTRAINT IF EXISTS failed_at_is_after_started_at,
  DROP CONSTRAINT IF EXISTS requeued_count_nonnegative,
  ADD CONSTRAINT valid_status CHECK (
    status IN ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')) NOT VALID,
  ADD CONSTRAINT requeued_count_nonnegative CHECK (requeued_count >= 0) NOT VALID,
  ADD CONSTRAINT completed_at_is_after_started_at CHECK (completed_at IS NULL OR completed_at >= started_at) NOT VALID,
  ADD CONSTRAINT failed_at_is_after_started_at CHECK (failed_at IS NULL OR failed_at >= started_at) NOT VALID;

ALTER TABLE pgflow.workers
  ADD COLUMN IF NOT EXISTS flow_slug text,
  ADD COLUMN IF NOT EXISTS step_slug text,
  ADD COLUMN IF NOT EXISTS stopped_at timestamptz;
COMMENT ON COLUMN pgflow.workers.flow_slug IS 'concrete flow the worker serves (NULL for workers that register without one)';
COMMENT ON COLUMN pgflow.workers.step_slug IS 'step of a private step worker; NULL for a whole-flow worker';

-- The worker function registry arrived in 0.10.0 with the baseline's columns and checks.
CREATE TEMP TABLE pgflow_adopt_new_tables ON COMMIT DROP AS
SELECT 'worker_functions'::text AS table_name WHERE pg_catalog.to_regclass('pgflow.worker_functions') IS NULL;
CREATE TABLE IF NOT EXISTS pgflow.worker_functions (function_name text NOT NULL PRIMARY KEY);
ALTER TABLE pgflow.worker_functions
  ADD COLUMN IF NOT EXISTS enabled boolean NOT NULL DEFAULT true,
  ADD COLUMN IF NOT EXISTS debounce interval NOT NULL DEFAULT '6 seconds',
  ADD COLUMN IF NOT EXISTS last_invoked_at timestamptz,
  ADD COLUMN IF NOT EXISTS created_at timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN IF NOT EXISTS updated_at timestamptz NOT NULL DEFAULT now(),
  DROP CONSTRAINT IF EXISTS worker_functions_debounce_check,
  ADD CONSTRAINT worker_functions_debounce_check CHECK (debounce >= interval '1 second') NOT VALID;
COMMENT ON TABLE pgflow.worker_functions IS
  'registry of worker functions; enabled = false is the rollout fence: the HTTP starter skips the function and its workers refuse to register';
COMMENT ON COLUMN pgflow.worker_functions.function_name IS NULL;
COMMENT ON COLUMN pgflow.worker_functions.enabled IS NULL;
COMMENT ON COLUMN pgflow.worker_functions.debounce IS NULL;
COMMENT ON COLUMN pgflow.worker_functions.last_invoked_at IS NULL;
