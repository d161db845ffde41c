-- 0003 queue identity: shared slug rules, persisted queue identity on steps and tasks, worker protocol 2 with the classifying claim.
--
-- What changes (spec "Stage 1 — database queue identity"):
--   * slug rules: no leading or trailing _, no __ (one SQL fragment, also used by the audit);
--     flow slugs unique ignoring case, step slugs unique ignoring case within a flow;
--   * steps.queue_name: each step's canonical lowercase queue (plain flows: lower(flow_slug));
--     flows.queue_mode ('flow' for every existing and plain flow);
--   * step_tasks.queue_name: every task's immutable queue snapshot (the database rejects any
--     change), (queue_name, message_id) unique; existing tasks, in-flight ones included, get
--     lower(flow_slug), which is where their messages already are (PGMQ lowercases table names);
--   * every send, claim, visibility change, archive, retry, skip, cancel, recovery, pruning and
--     deletion path uses (queue_name, message_id): the two queue helpers, start_ready_steps,
--     the claim and deletion are replaced; the flow slug never stands in for a queue name;
--   * protocol_version() = 2: the protocol-1 startup and claim functions now refuse with
--     SQLSTATE PF002; workers of this release call ensure_flow_compiled(..., protocol_version => 2)
--     and pgflow.claim_tasks(...), which classifies every message before changing anything.
-- Nothing is renamed or deleted. Existing mixed-case PGMQ queues keep working; their exact
-- pgmq.meta spelling is looked up only before pgmq.drop_queue().
--
-- Recheck: the blocking rules of `pgflow audit` (sql/audit/findings.sql, included below) run
-- again under this migration's locks, in the first and in the last transaction. Any blocking
-- finding raises PF005 with every offending flow/step in the detail, and the transaction
-- rolls back: the database stays as it was.
--
-- Lock order (same in every phase): pgflow.flows -> pgflow.steps -> pgflow.step_tasks ->
-- pgflow.worker_functions. PGMQ tables are not touched.
--
-- Phases (pgflow_cli.installer.PhasedMigration). Below --@online-threshold task rows, all run
-- in one transaction (notx phases skipped): all or nothing. Above it, each phase commits on its
-- own so no lock that blocks workers is held for long:
--   prepare   recheck (definitions frozen, tasks only read); add the nullable
--             step_tasks.queue_name, a NOT VALID not-null check and a transitional fill
--             trigger (old code keeps working unchanged);
--   backfill  lower(flow_slug) into queue_name, a range of heap pages per transaction;
--   validate  VALIDATE the not-null check (SHARE UPDATE EXCLUSIVE: reads and claims go on);
--   index     the unique (queue_name, message_id) index, built CONCURRENTLY;
--   main      recheck again, SET NOT NULL (no scan: proven by the validated check), new
--             constraints, functions and protocol 2, ledger row.
-- Until main commits the old runtime and protocol 1 keep working. `pgflow migrate apply`
-- resumes an interrupted run; `pgflow migrate abort 3` undoes the committed phases.
--@online-threshold pgflow.step_tasks 100000
--@preflight audit
--@worker-protocol 2

--@phase prepare
SET LOCAL jit = off;
-- Definitions are frozen for the recheck (SHARE ROW EXCLUSIVE: no flow or step can be added or
-- changed; reads, runs and claims go on). The recheck reads the task table (duplicate message
-- ids) with ordinary read locks, so workers are not blocked while it scans; the task table is
-- locked exclusively only for the DDL that follows, in the documented order.
LOCK TABLE pgflow.flows, pgflow.steps IN SHARE ROW EXCLUSIVE MODE;

--@include migrations/0003/recheck.sql

LOCK TABLE pgflow.step_tasks, pgflow.worker_functions IN ACCESS EXCLUSIVE MODE;

--@include functions/definitions/is_valid_queue_name.sql as-create

ALTER TABLE pgflow.step_tasks ADD COLUMN queue_name text;
ALTER TABLE pgflow.step_tasks ADD CONSTRAINT step_tasks_queue_name_present CHECK (queue_name IS NOT NULL) NOT VALID;
COMMENT ON COLUMN pgflow.step_tasks.queue_name IS
  'immutable snapshot of the PGMQ queue holding this task''s message; with message_id it is the message identity';
-- No per-row name check here: a task's queue is copied from steps.queue_name (checked by
-- queue_name_is_valid there) when the task is created, and can never change afterwards.

-- Transitional, dropped in main: while the phases run, the released runtime still inserts and
-- updates tasks without knowing the column; a task of the released runtime lives in its flow's
-- lowercase queue, so that is what it gets.
CREATE FUNCTION pgflow._fill_task_queue_name()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = ''
AS $$
BEGIN
  NEW.queue_name := pg_catalog.lower(NEW.flow_slug COLLATE "C");
  RETURN NEW;
END;
$$;
CREATE TRIGGER step_tasks_fill_queue_name
  BEFORE INSERT OR UPDATE ON pgflow.step_tasks
  FOR EACH ROW WHEN (NEW.queue_name IS NULL)
  EXECUTE FUNCTION pgflow._fill_task_queue_name();

--@phase backfill batch
-- One range of heap pages per call: %(first_page)s .. %(first_page)s + %(pages)s - 1 (bigint: the
-- client may send small numbers as smallint, which would overflow past page 32767).
-- Returns (rows updated, current heap size in pages) so the installer knows when to stop.
WITH filled AS (
  UPDATE pgflow.step_tasks AS t
     SET queue_name = pg_catalog.lower(t.flow_slug COLLATE "C")
   WHERE t.ctid >= ('(' || %(first_page)s::bigint || ',0)')::tid
     AND t.ctid < ('(' || (%(first_page)s::bigint + %(pages)s::bigint) || ',0)')::tid
     AND t.queue_name IS NULL
  RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM filled) AS rows_updated,
       pg_catalog.pg_relation_size('pgflow.step_tasks') / pg_catalog.current_setting('block_size')::bigint AS relation_pages

--@phase validate
-- SHARE UPDATE EXCLUSIVE: workers keep reading and claiming while the table is scanned.
ALTER TABLE pgflow.step_tasks VALIDATE CONSTRAINT step_tasks_queue_name_present;

--@phase index notx
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idx_step_tasks_queue_message
  ON pgflow.step_tasks (queue_name, message_id) WHERE message_id IS NOT NULL

--@phase main
SET LOCAL jit = off;
LOCK TABLE pgflow.flows, pgflow.steps, pgflow.step_tasks, pgflow.worker_functions IN ACCESS EXCLUSIVE MODE;

--@include migrations/0003/recheck.sql

------------------------------------------------------------------------------------------------
-- Task queue snapshot: not null, immutable, unique with the message id
------------------------------------------------------------------------------------------------

-- The validated check proves no NULL exists, so this does not scan the table.
ALTER TABLE pgflow.step_tasks ALTER COLUMN queue_name SET NOT NULL;
ALTER TABLE pgflow.step_tasks DROP CONSTRAINT step_tasks_queue_name_present;
DROP TRIGGER step_tasks_fill_queue_name ON pgflow.step_tasks;
DROP FUNCTION pgflow._fill_task_queue_name();

--@include functions/runtime/_forbid_queue_name_change.sql as-create

-- A concurrent build that failed leaves an invalid index behind: rebuild it here.
DO $index$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i
             WHERE i.indexrelid = pg_catalog.to_regclass('pgflow.idx_step_tasks_queue_message')
               AND NOT i.indisvalid) THEN
    DROP INDEX pgflow.idx_step_tasks_queue_message;
  END IF;
END
$index$;
CREATE UNIQUE INDEX IF NOT EXISTS idx_step_tasks_queue_message
  ON pgflow.step_tasks (queue_name, message_id) WHERE message_id IS NOT NULL;
-- Message ids are only unique within a queue: the old lookups by message_id alone go.
DROP INDEX pgflow.idx_step_tasks_message_id;
DROP INDEX pgflow.idx_step_tasks_queued_msg;

------------------------------------------------------------------------------------------------
-- Definitions: queue mode, persisted routes, the shared slug rules
------------------------------------------------------------------------------------------------

ALTER TABLE pgflow.flows ADD COLUMN queue_mode text NOT NULL DEFAULT 'flow';
ALTER TABLE pgflow.flows ADD CONSTRAINT queue_mode_is_valid CHECK (queue_mode IN ('flow', 'step'));
COMMENT ON COLUMN pgflow.flows.queue_mode IS
  'flow: every step uses the flow''s default queue lower(flow_slug); step: one private generated queue per step';

ALTER TABLE pgflow.steps ADD COLUMN queue_name text;
UPDATE pgflow.steps AS s SET queue_name = pg_catalog.lower(s.flow_slug COLLATE "C");
ALTER TABLE pgflow.steps ALTER COLUMN queue_name SET NOT NULL;
ALTER TABLE pgflow.steps ADD CONSTRAINT queue_name_is_valid CHECK (pgflow.is_valid_queue_name(queue_name));
COMMENT ON COLUMN pgflow.steps.queue_name IS
  'the step''s persisted route: the queue its future tasks are sent to (ownership evidence; no queue registry)';
CREATE INDEX idx_steps_queue_name ON pgflow.steps (queue_name);

--@include functions/definitions/slug_violations.sql as-create

--@include functions/definitions/is_valid_slug.sql

-- Re-add the slug checks so every existing row is checked against the new rules.
ALTER TABLE pgflow.flows DROP CONSTRAINT slug_is_valid;
ALTER TABLE pgflow.flows ADD CONSTRAINT slug_is_valid CHECK (pgflow.is_valid_slug(flow_slug));
ALTER TABLE pgflow.steps DROP CONSTRAINT steps_step_slug_check;
ALTER TABLE pgflow.steps ADD CONSTRAINT steps_step_slug_check CHECK (pgflow.is_valid_slug(step_slug));
CREATE UNIQUE INDEX idx_flows_normalized_slug ON pgflow.flows (pg_catalog.lower(flow_slug COLLATE "C"));
CREATE UNIQUE INDEX idx_steps_normalized_slug ON pgflow.steps (flow_slug, pg_catalog.lower(step_slug COLLATE "C"));

ALTER TABLE pgflow.worker_functions ADD COLUMN paused_at timestamptz;
ALTER TABLE pgflow.worker_functions ADD COLUMN paused_reason text;
COMMENT ON COLUMN pgflow.worker_functions.paused_reason IS
  'why a worker''s claim disabled this function (fatal unsupported work); cleared when it is enabled again';

--@include migrations/0003/functions.sql

--@phase abort
-- Undo the committed phases of an unfinished run (the main phase never committed).
DROP INDEX IF EXISTS pgflow.idx_step_tasks_queue_message;
DROP TRIGGER IF EXISTS step_tasks_fill_queue_name ON pgflow.step_tasks;
DROP FUNCTION IF EXISTS pgflow._fill_task_queue_name();
ALTER TABLE pgflow.step_tasks DROP CONSTRAINT IF EXISTS step_tasks_queue_name_present;
ALTER TABLE pgflow.step_tasks DROP COLUMN IF EXISTS queue_name;
DROP FUNCTION IF EXISTS pgflow.is_valid_queue_name(text);
