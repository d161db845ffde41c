-- 0001 baseline schema: the definition and runtime tables the queue-identity upgrade starts from.
--
-- Table and column names and constraints follow upstream pgflow (released 0.16.0 line, with
-- the 0.15.1 terminal-state fixes: task statuses 'skipped' and 'cancelled', stalled-recovery
-- columns). Additions of ours, all nullable: workers.flow_slug and workers.step_slug, so a
-- worker row names the route it serves.
--
-- Slug rule at this stage: the released rule (letters, digits, underscore; no leading digit;
-- at most 128 characters; 'run' reserved). The stricter shared rules arrive with the
-- queue-identity migration, which rechecks existing rows under its locks.

CREATE SCHEMA IF NOT EXISTS pgflow;
REVOKE ALL ON SCHEMA pgflow FROM PUBLIC;

COMMENT ON SCHEMA pgflow IS 'pgflow workflow engine (installed by pgflow-cli; see pgflow.schema_migrations)';

-- Released slug rule. Replaced (not weakened) by the queue-identity migration.
CREATE FUNCTION pgflow.is_valid_slug(slug text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$
  SELECT slug IS NOT NULL
     AND slug <> ''
     AND length(slug) <= 128
     AND (slug COLLATE "C") ~ '^[A-Za-z_][A-Za-z0-9_]*$'
     AND slug <> 'run'
$$;

-- The worker/database protocol this schema speaks. A worker states the version it speaks at
-- startup; any mismatch is refused before registration or polling (DESIGN.md "protocol version").
--   1 = released baseline: startup compile ensure_flow_compiled(flow_slug, shape),
--       claim start_tasks(flow_slug, msg_ids, worker_id); the queue is the flow slug.
CREATE FUNCTION pgflow.protocol_version()
RETURNS integer
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$ SELECT 1 $$;

------------------------------------------------------------------------------------------------
-- Definitions
------------------------------------------------------------------------------------------------

CREATE TABLE pgflow.flows (
  flow_slug         text        NOT NULL PRIMARY KEY,
  opt_max_attempts  integer     NOT NULL DEFAULT 3,
  opt_base_delay    integer     NOT NULL DEFAULT 1,
  opt_timeout       integer     NOT NULL DEFAULT 60,
  created_at        timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT slug_is_valid CHECK (pgflow.is_valid_slug(flow_slug)),
  CONSTRAINT opt_max_attempts_is_nonnegative CHECK (opt_max_attempts >= 0),
  CONSTRAINT opt_base_delay_is_nonnegative CHECK (opt_base_delay >= 0),
  CONSTRAINT opt_timeout_is_positive CHECK (opt_timeout > 0)
);

CREATE TABLE pgflow.steps (
  flow_slug                text        NOT NULL REFERENCES pgflow.flows (flow_slug),
  step_slug                text        NOT NULL,
  step_type                text        NOT NULL DEFAULT 'single',
  step_index               integer     NOT NULL DEFAULT 0,
  deps_count               integer     NOT NULL DEFAULT 0,
  opt_max_attempts         integer,
  opt_base_delay           integer,
  opt_timeout              integer,
  opt_start_delay          integer,
  required_input_pattern   jsonb,
  forbidden_input_pattern  jsonb,
  when_unmet               text        NOT NULL DEFAULT 'skip',
  when_exhausted           text        NOT NULL DEFAULT 'fail',
  created_at               timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (flow_slug, step_slug),
  CONSTRAINT steps_flow_slug_step_index_key UNIQUE (flow_slug, step_index),
  CONSTRAINT steps_step_slug_check CHECK (pgflow.is_valid_slug(step_slug)),
  CONSTRAINT steps_step_type_check CHECK (step_type IN ('single', 'map')),
  CONSTRAINT steps_deps_count_check CHECK (deps_count >= 0),
  CONSTRAINT opt_max_attempts_is_nonnegative CHECK (opt_max_attempts IS NULL OR opt_max_attempts >= 0),
  CONSTRAINT opt_base_delay_is_nonnegative CHECK (opt_base_delay IS NULL OR opt_base_delay >= 0),
  CONSTRAINT opt_timeout_is_positive CHECK (opt_timeout IS NULL OR opt_timeout > 0),
  CONSTRAINT opt_start_delay_is_nonnegative CHECK (opt_start_delay IS NULL OR opt_start_delay >= 0),
  CONSTRAINT required_input_pattern_is_object CHECK (
    required_input_pattern IS NULL OR jsonb_typeof(required_input_pattern) = 'object'),
  CONSTRAINT forbidden_input_pattern_is_object CHECK (
    forbidden_input_pattern IS NULL OR jsonb_typeof(forbidden_input_pattern) = 'object'),
  CONSTRAINT when_unmet_is_valid CHECK (when_unmet IN ('fail', 'skip', 'skip-cascade')),
  CONSTRAINT when_exhausted_is_valid CHECK (when_exhausted IN ('fail', 'skip', 'skip-cascade'))
);

CREATE TABLE pgflow.deps (
  flow_slug   text        NOT NULL REFERENCES pgflow.flows (flow_slug),
  dep_slug    text        NOT NULL,
  step_slug   text        NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (flow_slug, dep_slug, step_slug),
  FOREIGN KEY (flow_slug, dep_slug) REFERENCES pgflow.steps (flow_slug, step_slug),
  FOREIGN KEY (flow_slug, step_slug) REFERENCES pgflow.steps (flow_slug, step_slug),
  CONSTRAINT deps_not_self CHECK (dep_slug <> step_slug)
);
CREATE INDEX idx_deps_by_flow_step ON pgflow.deps (flow_slug, step_slug);
CREATE INDEX idx_deps_by_flow_dep ON pgflow.deps (flow_slug, dep_slug);

------------------------------------------------------------------------------------------------
-- Workers
------------------------------------------------------------------------------------------------

CREATE TABLE pgflow.workers (
  worker_id          uuid        NOT NULL PRIMARY KEY,
  queue_name         text        NOT NULL,
  function_name      text        NOT NULL,
  flow_slug          text,
  step_slug          text,
  started_at         timestamptz NOT NULL DEFAULT now(),
  deprecated_at      timestamptz,
  stopped_at         timestamptz,
  last_heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_workers_queue_name ON pgflow.workers (queue_name);
CREATE INDEX idx_workers_heartbeat ON pgflow.workers (last_heartbeat_at);
COMMENT ON COLUMN pgflow.workers.flow_slug IS 'concrete flow the worker serves (NULL for workers that register without one)';
COMMENT ON COLUMN pgflow.workers.step_slug IS 'step of a private step worker; NULL for a whole-flow worker';

CREATE TABLE pgflow.worker_functions (
  function_name    text        NOT NULL PRIMARY KEY,
  enabled          boolean     NOT NULL DEFAULT true,
  debounce         interval    NOT NULL DEFAULT '6 seconds',
  last_invoked_at  timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT worker_functions_debounce_check CHECK (debounce >= interval '1 second')
);
COMMENT ON TABLE pgflow.worker_functions IS
  'registry of worker functions; enabled = false is the rollout fence: the HTTP starter skips the function and its workers refuse to register';

------------------------------------------------------------------------------------------------
-- Runtime
------------------------------------------------------------------------------------------------

CREATE TABLE pgflow.runs (
  run_id           uuid        NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
  flow_slug        text        NOT NULL REFERENCES pgflow.flows (flow_slug),
  status           text        NOT NULL DEFAULT 'started',
  input            jsonb       NOT NULL,
  output           jsonb,
  remaining_steps  integer     NOT NULL DEFAULT 0,
  started_at       timestamptz NOT NULL DEFAULT now(),
  completed_at     timestamptz,
  failed_at        timestamptz,
  CONSTRAINT runs_status_check CHECK (status IN ('started', 'failed', 'completed')),
  CONSTRAINT remaining_steps_valid CHECK (remaining_steps >= 0),
  CONSTRAINT completed_at_or_failed_at CHECK (NOT (completed_at IS NOT NULL AND failed_at IS NOT NULL)),
  CONSTRAINT completed_at_is_after_started_at CHECK (completed_at IS NULL OR completed_at >= started_at),
  CONSTRAINT failed_at_is_after_started_at CHECK (failed_at IS NULL OR failed_at >= started_at)
);
CREATE INDEX idx_runs_flow_slug ON pgflow.runs (flow_slug);
CREATE INDEX idx_runs_status ON pgflow.runs (status);

CREATE TABLE pgflow.step_states (
  flow_slug        text        NOT NULL REFERENCES pgflow.flows (flow_slug),
  run_id           uuid        NOT NULL REFERENCES pgflow.runs (run_id),
  step_slug        text        NOT NULL,
  status           text        NOT NULL DEFAULT 'created',
  remaining_tasks  integer,
  initial_tasks    integer,
  remaining_deps   integer     NOT NULL DEFAULT 0,
  output           jsonb,
  error_message    text,
  skip_reason      text,
  created_at       timestamptz NOT NULL DEFAULT now(),
  started_at       timestamptz,
  completed_at     timestamptz,
  failed_at        timestamptz,
  skipped_at       timestamptz,
  PRIMARY KEY (run_id, step_slug),
  FOREIGN KEY (flow_slug, step_slug) REFERENCES pgflow.steps (flow_slug, step_slug),
  CONSTRAINT status_is_valid CHECK (status IN ('created', 'started', 'completed', 'failed', 'skipped')),
  CONSTRAINT status_and_remaining_tasks_match CHECK (status <> 'completed' OR remaining_tasks = 0),
  CONSTRAINT remaining_tasks_state_consistency CHECK (
    remaining_tasks IS NULL OR status NOT IN ('created', 'skipped')),
  CONSTRAINT initial_tasks_known_when_started CHECK (status <> 'started' OR initial_tasks IS NOT NULL),
  CONSTRAINT initial_tasks_nonnegative CHECK (initial_tasks IS NULL OR initial_tasks >= 0),
  CONSTRAINT remaining_deps_valid CHECK (remaining_deps >= 0),
  CONSTRAINT output_only_for_completed CHECK (output IS NULL OR status = 'completed'),
  CONSTRAINT skip_reason_matches_status CHECK ((status = 'skipped') = (skip_reason IS NOT NULL)),
  CONSTRAINT at_most_one_terminal_timestamp CHECK (
    (completed_at IS NOT NULL)::int + (failed_at IS NOT NULL)::int + (skipped_at IS NOT NULL)::int <= 1),
  CONSTRAINT started_at_is_after_created_at CHECK (started_at IS NULL OR started_at >= created_at),
  CONSTRAINT completed_at_is_after_started_at CHECK (completed_at IS NULL OR completed_at >= started_at),
  CONSTRAINT failed_at_is_after_started_at CHECK (failed_at IS NULL OR failed_at >= started_at),
  CONSTRAINT skipped_at_is_after_created_at CHECK (skipped_at IS NULL OR skipped_at >= created_at)
);
CREATE INDEX idx_step_states_ready ON pgflow.step_states (run_id, status, remaining_deps)
  WHERE status = 'created' AND remaining_deps = 0;
CREATE INDEX idx_step_states_failed ON pgflow.step_states (run_id, step_slug) WHERE status = 'failed';
CREATE INDEX idx_step_states_skipped ON pgflow.step_states (run_id, step_slug) WHERE status = 'skipped';
CREATE INDEX idx_step_states_flow_slug ON pgflow.step_states (flow_slug);
CREATE INDEX idx_step_states_run_id ON pgflow.step_states (run_id);

CREATE TABLE pgflow.step_tasks (
  flow_slug               text        NOT NULL REFERENCES pgflow.flows (flow_slug),
  run_id                  uuid        NOT NULL REFERENCES pgflow.runs (run_id),
  step_slug               text        NOT NULL,
  message_id              bigint,
  task_index              integer     NOT NULL DEFAULT 0,
  status                  text        NOT NULL DEFAULT 'queued',
  attempts_count          integer     NOT NULL DEFAULT 0,
  error_message           text,
  output                  jsonb,
  queued_at               timestamptz NOT NULL DEFAULT now(),
  started_at              timestamptz,
  completed_at            timestamptz,
  failed_at               timestamptz,
  last_worker_id          uuid        REFERENCES pgflow.workers (worker_id) ON DELETE SET NULL,
  requeued_count          integer     NOT NULL DEFAULT 0,
  last_requeued_at        timestamptz,
  permanently_stalled_at  timestamptz,
  CONSTRAINT step_tasks_pkey PRIMARY KEY (run_id, step_slug, task_index),
  FOREIGN KEY (run_id, step_slug) REFERENCES pgflow.step_states (run_id, step_slug),
  CONSTRAINT valid_status CHECK (
    status IN ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')),
  CONSTRAINT output_valid_only_for_completed CHECK (output IS NULL OR status IN ('completed', 'failed')),
  CONSTRAINT attempts_count_nonnegative CHECK (attempts_count >= 0),
  CONSTRAINT requeued_count_nonnegative CHECK (requeued_count >= 0),
  CONSTRAINT completed_at_or_failed_at CHECK (NOT (completed_at IS NOT NULL AND failed_at IS NOT NULL)),
  CONSTRAINT started_at_is_after_queued_at CHECK (started_at IS NULL OR started_at >= queued_at),
  CONSTRAINT completed_at_is_after_started_at CHECK (completed_at IS NULL OR completed_at >= started_at),
  CONSTRAINT failed_at_is_after_started_at CHECK (failed_at IS NULL OR failed_at >= started_at)
);
CREATE INDEX idx_step_tasks_message_id ON pgflow.step_tasks (message_id);
CREATE INDEX idx_step_tasks_queued ON pgflow.step_tasks (run_id, step_slug) WHERE status = 'queued';
CREATE INDEX idx_step_tasks_completed ON pgflow.step_tasks (run_id, step_slug) WHERE status = 'completed';
CREATE INDEX idx_step_tasks_failed ON pgflow.step_tasks (run_id, step_slug) WHERE status = 'failed';
CREATE INDEX idx_step_tasks_flow_run_step ON pgflow.step_tasks (flow_slug, run_id, step_slug);
CREATE INDEX idx_step_tasks_started ON pgflow.step_tasks (started_at) WHERE status = 'started';
CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks (message_id) WHERE status = 'queued';
CREATE INDEX idx_step_tasks_last_worker ON pgflow.step_tasks (last_worker_id) WHERE status = 'started';

-- What a claim hands to a worker (upstream-compatible field order).
CREATE TYPE pgflow.step_task_record AS (
  flow_slug   text,
  run_id      uuid,
  step_slug   text,
  input       jsonb,
  msg_id      bigint,
  task_index  integer,
  flow_input  jsonb
);

-- Nothing in pgflow is reachable by PUBLIC; operators grant to their own roles
-- (docs/permissions.md).
REVOKE ALL ON ALL TABLES IN SCHEMA pgflow FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgflow FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgflow REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
