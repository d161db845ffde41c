"""Schema SHAPES of published pgflow releases, written by hand from the release fact sheet.

Only 0.8.1 can be built for real (tests/support/published.py). For the other releases these
scripts build what recognition looks at: the tables with their columns, defaults, constraints
and indexes, the composite type, and every function signature as a do-nothing stub. They are
written as DDL from ``upstream-releases.md`` §2 (the release's own migration files are not
used), so recognising them checks the fingerprint data against an independent reading of the
facts. Each release is the previous one plus the changes the sheet lists for it.
"""

from __future__ import annotations

import psycopg

from pgflow_cli import installer

_STUB = "LANGUAGE plpgsql AS $$BEGIN END$$"

RELEASE_0_8 = f"""
CREATE SCHEMA pgflow;

CREATE FUNCTION pgflow.is_valid_slug(slug text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN slug IS NOT NULL AND slug <> '' AND length(slug) <= 128 AND slug ~ '^[a-zA-Z_][a-zA-Z0-9_]*$' AND slug <> 'run';
END $$;

CREATE TABLE pgflow.flows (
  flow_slug text NOT NULL PRIMARY KEY,
  opt_max_attempts int NOT NULL DEFAULT 3,
  opt_base_delay int NOT NULL DEFAULT 1,
  opt_timeout int NOT NULL DEFAULT 60,
  created_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT slug_is_valid CHECK (pgflow.is_valid_slug(flow_slug)),
  CONSTRAINT opt_max_attempts_is_nonnegative CHECK (opt_max_attempts >= 0),
  CONSTRAINT opt_base_delay_is_nonnegative CHECK (opt_base_delay >= 0),
  CONSTRAINT opt_timeout_is_positive CHECK (opt_timeout > 0)
);

CREATE TABLE pgflow.steps (
  flow_slug text NOT NULL REFERENCES pgflow.flows (flow_slug),
  step_slug text NOT NULL CHECK (pgflow.is_valid_slug(step_slug)),
  step_type text NOT NULL DEFAULT 'single' CHECK (step_type IN ('single', 'map')),
  step_index int NOT NULL DEFAULT 0,
  deps_count int NOT NULL DEFAULT 0 CHECK (deps_count >= 0),
  opt_max_attempts int,
  opt_base_delay int,
  opt_timeout int,
  created_at timestamptz NOT NULL DEFAULT now(),
  opt_start_delay int,
  PRIMARY KEY (flow_slug, step_slug),
  UNIQUE (flow_slug, step_index),
  CONSTRAINT opt_max_attempts_is_nonnegative CHECK (opt_max_attempts IS NULL OR opt_max_attempts >= 0),
  CONSTRAINT opt_base_delay_is_nonnegative CHECK (opt_base_delay IS NULL OR opt_base_delay >= 0),
  CONSTRAINT opt_timeout_is_positive CHECK (opt_timeout IS NULL OR opt_timeout > 0),
  CONSTRAINT opt_start_delay_is_nonnegative CHECK (opt_start_delay IS NULL OR opt_start_delay >= 0)
);

CREATE TABLE pgflow.deps (
  flow_slug text NOT NULL REFERENCES pgflow.flows (flow_slug),
  dep_slug text NOT NULL,
  step_slug text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (flow_slug, dep_slug, step_slug),
  FOREIGN KEY (flow_slug, dep_slug) REFERENCES pgflow.steps (flow_slug, step_slug),
  FOREIGN KEY (flow_slug, step_slug) REFERENCES pgflow.steps (flow_slug, step_slug),
  CHECK (dep_slug != step_slug)
);

CREATE TABLE pgflow.runs (
  run_id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
  flow_slug text NOT NULL REFERENCES pgflow.flows (flow_slug),
  status text NOT NULL DEFAULT 'started',
  input jsonb NOT NULL,
  output jsonb,
  remaining_steps int NOT NULL DEFAULT 0 CHECK (remaining_steps >= 0),
  started_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz,
  failed_at timestamptz,
  CONSTRAINT status_is_valid CHECK (status IN ('started', 'failed', 'completed')),
  CONSTRAINT completed_at_or_failed_at CHECK (NOT (completed_at IS NOT NULL AND failed_at IS NOT NULL)),
  CONSTRAINT completed_at_is_after_started_at CHECK (completed_at IS NULL OR completed_at >= started_at),
  CONSTRAINT failed_at_is_after_started_at CHECK (failed_at IS NULL OR failed_at >= started_at)
);

CREATE TABLE pgflow.step_states (
  flow_slug text NOT NULL REFERENCES pgflow.flows (flow_slug),
  run_id uuid NOT NULL REFERENCES pgflow.runs (run_id),
  step_slug text NOT NULL,
  status text NOT NULL DEFAULT 'created',
  remaining_tasks int,
  remaining_deps int NOT NULL DEFAULT 0 CHECK (remaining_deps >= 0),
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  error_message text,
  initial_tasks int CHECK (initial_tasks IS NULL OR initial_tasks >= 0),
  PRIMARY KEY (run_id, step_slug),
  FOREIGN KEY (flow_slug, step_slug) REFERENCES pgflow.steps (flow_slug, step_slug),
  CONSTRAINT status_is_valid CHECK (status IN ('created', 'started', 'completed', 'failed')),
  CONSTRAINT status_and_remaining_tasks_match CHECK (status <> 'completed' OR remaining_tasks = 0),
  CONSTRAINT remaining_tasks_state_consistency CHECK (remaining_tasks IS NULL OR status <> 'created'),
  CONSTRAINT initial_tasks_known_when_started CHECK (status <> 'started' OR initial_tasks IS NOT NULL),
  CONSTRAINT completed_at_or_failed_at CHECK (NOT (completed_at IS NOT NULL AND failed_at IS NOT NULL)),
  CONSTRAINT started_at_is_after_created_at CHECK (started_at IS NULL OR started_at >= created_at),
  CONSTRAINT completed_at_is_after_started_at CHECK (completed_at IS NULL OR completed_at >= started_at),
  CONSTRAINT failed_at_is_after_started_at CHECK (failed_at IS NULL OR failed_at >= started_at)
);

CREATE TABLE pgflow.workers (
  worker_id uuid NOT NULL PRIMARY KEY,
  queue_name text NOT NULL,
  function_name text NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  deprecated_at timestamptz,
  last_heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pgflow.step_tasks (
  flow_slug text NOT NULL REFERENCES pgflow.flows (flow_slug),
  run_id uuid NOT NULL REFERENCES pgflow.runs (run_id),
  step_slug text NOT NULL,
  message_id bigint,
  task_index int NOT NULL DEFAULT 0,
  status text NOT NULL DEFAULT 'queued',
  attempts_count int NOT NULL DEFAULT 0,
  error_message text,
  output jsonb,
  queued_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz,
  failed_at timestamptz,
  started_at timestamptz,
  last_worker_id uuid REFERENCES pgflow.workers (worker_id) ON DELETE SET NULL,
  CONSTRAINT step_tasks_pkey PRIMARY KEY (run_id, step_slug, task_index),
  FOREIGN KEY (run_id, step_slug) REFERENCES pgflow.step_states (run_id, step_slug),
  CONSTRAINT valid_status CHECK (status IN ('queued', 'started', 'completed', 'failed')),
  CONSTRAINT output_valid_only_for_completed CHECK (output IS NULL OR status IN ('completed', 'failed')),
  CONSTRAINT attempts_count_nonnegative CHECK (attempts_count >= 0),
  CONSTRAINT completed_at_or_failed_at CHECK (NOT (completed_at IS NOT NULL AND failed_at IS NOT NULL)),
  CONSTRAINT started_at_is_after_queued_at CHECK (started_at IS NULL OR started_at >= queued_at),
  CONSTRAINT completed_at_is_after_queued_at CHECK (completed_at IS NULL OR completed_at >= queued_at),
  CONSTRAINT failed_at_is_after_queued_at CHECK (failed_at IS NULL OR failed_at >= queued_at),
  CONSTRAINT completed_at_is_after_started_at CHECK (completed_at IS NULL OR started_at IS NULL OR completed_at >= started_at),
  CONSTRAINT failed_at_is_after_started_at CHECK (failed_at IS NULL OR started_at IS NULL OR failed_at >= started_at)
);

CREATE INDEX idx_deps_by_flow_dep ON pgflow.deps (flow_slug, dep_slug);
CREATE INDEX idx_deps_by_flow_step ON pgflow.deps (flow_slug, step_slug);
CREATE INDEX idx_runs_flow_slug ON pgflow.runs (flow_slug);
CREATE INDEX idx_runs_status ON pgflow.runs (status);
CREATE INDEX idx_step_states_failed ON pgflow.step_states (run_id, step_slug) WHERE status = 'failed';
CREATE INDEX idx_step_states_flow_slug ON pgflow.step_states (flow_slug);
CREATE INDEX idx_step_states_ready ON pgflow.step_states (run_id, status, remaining_deps)
  WHERE status = 'created' AND remaining_deps = 0;
CREATE INDEX idx_step_states_run_id ON pgflow.step_states (run_id);
CREATE INDEX idx_step_tasks_completed ON pgflow.step_tasks (run_id, step_slug) WHERE status = 'completed';
CREATE INDEX idx_step_tasks_failed ON pgflow.step_tasks (run_id, step_slug) WHERE status = 'failed';
CREATE INDEX idx_step_tasks_flow_run_step ON pgflow.step_tasks (flow_slug, run_id, step_slug);
CREATE INDEX idx_step_tasks_last_worker ON pgflow.step_tasks (last_worker_id) WHERE status = 'started';
CREATE INDEX idx_step_tasks_message_id ON pgflow.step_tasks (message_id);
CREATE INDEX idx_step_tasks_queued ON pgflow.step_tasks (run_id, step_slug) WHERE status = 'queued';
CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks (message_id) WHERE status = 'queued';
CREATE INDEX idx_step_tasks_started ON pgflow.step_tasks (started_at) WHERE status = 'started';
CREATE INDEX idx_workers_heartbeat ON pgflow.workers (last_heartbeat_at);
CREATE INDEX idx_workers_queue_name ON pgflow.workers (queue_name);

CREATE TYPE pgflow.step_task_record AS (
  flow_slug text, run_id uuid, step_slug text, input jsonb, msg_id bigint, task_index int
);

CREATE FUNCTION pgflow.add_step(flow_slug text, step_slug text, deps_slugs text[] DEFAULT '{{}}',
  max_attempts int DEFAULT NULL, base_delay int DEFAULT NULL, timeout int DEFAULT NULL,
  start_delay int DEFAULT NULL, step_type text DEFAULT 'single') RETURNS pgflow.steps {_STUB};
CREATE FUNCTION pgflow.calculate_retry_delay(base_delay numeric, attempts_count int) RETURNS int {_STUB};
CREATE FUNCTION pgflow.cascade_complete_taskless_steps(run_id uuid) RETURNS int {_STUB};
CREATE FUNCTION pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb)
  RETURNS SETOF pgflow.step_tasks {_STUB};
CREATE FUNCTION pgflow.create_flow(flow_slug text, max_attempts int DEFAULT 3, base_delay int DEFAULT 5,
  timeout int DEFAULT 60) RETURNS pgflow.flows {_STUB};
CREATE FUNCTION pgflow.fail_task(run_id uuid, step_slug text, task_index int, error_message text)
  RETURNS SETOF pgflow.step_tasks {_STUB};
CREATE FUNCTION pgflow.get_run_with_states(run_id uuid) RETURNS jsonb SECURITY DEFINER {_STUB};
CREATE FUNCTION pgflow.maybe_complete_run(run_id uuid) RETURNS void {_STUB};
CREATE FUNCTION pgflow.poll_for_tasks(queue_name text, vt int, qty int, max_poll_seconds int DEFAULT 5,
  poll_interval_ms int DEFAULT 100) RETURNS SETOF pgflow.step_task_record {_STUB};
CREATE FUNCTION pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
  RETURNS TABLE(msg_id bigint, read_ct int, enqueued_at timestamptz, vt timestamptz, message jsonb, headers jsonb)
  {_STUB};
CREATE FUNCTION pgflow.start_flow(flow_slug text, input jsonb, run_id uuid DEFAULT NULL)
  RETURNS SETOF pgflow.runs {_STUB};
CREATE FUNCTION pgflow.start_flow_with_states(flow_slug text, input jsonb, run_id uuid DEFAULT NULL)
  RETURNS jsonb SECURITY DEFINER {_STUB};
CREATE FUNCTION pgflow.start_ready_steps(run_id uuid) RETURNS void {_STUB};
CREATE FUNCTION pgflow.start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid)
  RETURNS SETOF pgflow.step_task_record {_STUB};
"""

RELEASE_0_10 = f"""
CREATE TABLE pgflow.worker_functions (
  function_name text NOT NULL PRIMARY KEY,
  enabled boolean NOT NULL DEFAULT true,
  debounce interval NOT NULL DEFAULT '6 seconds' CHECK (debounce >= '1 second'),
  last_invoked_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgflow.worker_functions IS 'registry of edge functions the cron pings';
COMMENT ON COLUMN pgflow.worker_functions.debounce IS 'minimum time between pings';
ALTER TABLE pgflow.workers ADD COLUMN stopped_at timestamptz;
CREATE FUNCTION pgflow._compare_flow_shapes(p_local jsonb, p_db jsonb) RETURNS text[] {_STUB};
CREATE FUNCTION pgflow._create_flow_from_shape(p_flow_slug text, p_shape jsonb) RETURNS void {_STUB};
CREATE FUNCTION pgflow._get_flow_shape(p_flow_slug text) RETURNS jsonb {_STUB};
CREATE FUNCTION pgflow.delete_flow_and_data(p_flow_slug text) RETURNS void {_STUB};
CREATE FUNCTION pgflow.ensure_flow_compiled(flow_slug text, shape jsonb) RETURNS jsonb {_STUB};
CREATE FUNCTION pgflow.is_local() RETURNS boolean {_STUB};
CREATE FUNCTION pgflow.ensure_workers() RETURNS TABLE(function_name text, invoked boolean, request_id bigint) {_STUB};
CREATE FUNCTION pgflow.track_worker_function(function_name text) RETURNS void {_STUB};
CREATE FUNCTION pgflow.mark_worker_stopped(worker_id uuid) RETURNS void {_STUB};
CREATE FUNCTION pgflow.cleanup_ensure_workers_logs(retention_hours int DEFAULT 24)
  RETURNS TABLE(cron_deleted bigint) SECURITY DEFINER {_STUB};
CREATE FUNCTION pgflow.setup_ensure_workers_cron(cron_interval text DEFAULT '1 second') RETURNS text
  SECURITY DEFINER {_STUB};
"""

RELEASE_0_11 = f"""
DROP FUNCTION pgflow.ensure_flow_compiled(text, jsonb);
CREATE FUNCTION pgflow.ensure_flow_compiled(flow_slug text, shape jsonb, allow_data_loss boolean DEFAULT false)
  RETURNS jsonb {_STUB};
"""

RELEASE_0_12 = "ALTER TYPE pgflow.step_task_record ADD ATTRIBUTE flow_input jsonb;"

RELEASE_0_13 = """
ALTER TABLE pgflow.step_states ADD COLUMN output jsonb,
  ADD CONSTRAINT output_only_for_completed_or_null CHECK (output IS NULL OR status = 'completed');
"""

RELEASE_0_13_2 = f"""
ALTER TABLE pgflow.step_tasks ADD COLUMN requeued_count int NOT NULL DEFAULT 0,
  ADD COLUMN last_requeued_at timestamptz, ADD COLUMN permanently_stalled_at timestamptz;
CREATE FUNCTION pgflow.requeue_stalled_tasks() RETURNS int SECURITY DEFINER {_STUB};
CREATE FUNCTION pgflow.setup_requeue_stalled_tasks_cron(cron_interval text DEFAULT '15 seconds') RETURNS text
  SECURITY DEFINER {_STUB};
"""

RELEASE_0_14 = f"""
ALTER TABLE pgflow.steps
  ADD COLUMN required_input_pattern jsonb, ADD COLUMN forbidden_input_pattern jsonb,
  ADD COLUMN when_unmet text NOT NULL DEFAULT 'skip', ADD COLUMN when_exhausted text NOT NULL DEFAULT 'fail',
  ADD CONSTRAINT required_input_pattern_is_object CHECK (
    required_input_pattern IS NULL OR jsonb_typeof(required_input_pattern) = 'object'),
  ADD CONSTRAINT forbidden_input_pattern_is_object CHECK (
    forbidden_input_pattern IS NULL OR jsonb_typeof(forbidden_input_pattern) = 'object'),
  ADD CONSTRAINT when_unmet_is_valid CHECK (when_unmet IN ('fail', 'skip', 'skip-cascade')),
  ADD CONSTRAINT when_exhausted_is_valid CHECK (when_exhausted IN ('fail', 'skip', 'skip-cascade'));
ALTER TABLE pgflow.step_states
  ADD COLUMN skip_reason text, ADD COLUMN skipped_at timestamptz,
  DROP CONSTRAINT completed_at_or_failed_at,
  DROP CONSTRAINT status_is_valid,
  DROP CONSTRAINT remaining_tasks_state_consistency,
  ADD CONSTRAINT completed_at_or_failed_at_or_skipped_at CHECK (
    (completed_at IS NULL OR failed_at IS NULL) AND (completed_at IS NULL OR skipped_at IS NULL)
    AND (failed_at IS NULL OR skipped_at IS NULL)),
  ADD CONSTRAINT status_is_valid CHECK (status IN ('created', 'started', 'completed', 'failed', 'skipped')),
  ADD CONSTRAINT remaining_tasks_state_consistency CHECK (remaining_tasks IS NULL OR status NOT IN ('created', 'skipped')),
  ADD CONSTRAINT skip_reason_matches_status CHECK (
    (status = 'skipped' AND skip_reason IS NOT NULL) OR (status <> 'skipped' AND skip_reason IS NULL)),
  ADD CONSTRAINT skipped_at_is_after_created_at CHECK (skipped_at IS NULL OR skipped_at >= created_at);
CREATE INDEX idx_step_states_skipped ON pgflow.step_states (run_id, step_slug) WHERE status = 'skipped';
DROP FUNCTION pgflow.add_step(text, text, text[], int, int, int, int, text);
CREATE FUNCTION pgflow.add_step(flow_slug text, step_slug text, deps_slugs text[] DEFAULT '{{}}',
  max_attempts int DEFAULT NULL, base_delay int DEFAULT NULL, timeout int DEFAULT NULL,
  start_delay int DEFAULT NULL, step_type text DEFAULT 'single', required_input_pattern jsonb DEFAULT NULL,
  forbidden_input_pattern jsonb DEFAULT NULL, when_unmet text DEFAULT 'skip', when_exhausted text DEFAULT 'fail')
  RETURNS pgflow.steps {_STUB};
CREATE FUNCTION pgflow.cascade_resolve_conditions(run_id uuid) RETURNS boolean {_STUB};
CREATE FUNCTION pgflow._cascade_force_skip_steps(run_id uuid, step_slug text, skip_reason text) RETURNS int {_STUB};
CREATE FUNCTION pgflow._archive_task_message(p_run_id uuid, p_step_slug text, p_task_index int) RETURNS void {_STUB};
"""

STEPS: tuple[tuple[str, str], ...] = (
    ("0.8.1", RELEASE_0_8), ("0.10.0", RELEASE_0_10), ("0.11.0", RELEASE_0_11), ("0.12.0", RELEASE_0_12),
    ("0.13.1", RELEASE_0_13), ("0.13.2", RELEASE_0_13_2), ("0.14.1", RELEASE_0_14),
)
"""Each release's DDL, in release order; a shape of release R runs every script up to R's."""

SHAPES = tuple(release for release, _ in STEPS)


def build(conninfo: str, release: str) -> None:
    """Build the shape of ``release`` (one of :data:`SHAPES`) in the empty database at ``conninfo``.

    PGMQ is installed first (SQL-only, as the tool bundles it): pgflow-cli's functions, which
    adoption creates, refer to it.
    """
    if release not in SHAPES:
        raise ValueError(f"no shape for {release}; known: {SHAPES}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        installer.ensure_pgmq(conn)
        with conn.transaction():
            for name, ddl in STEPS:
                conn.execute(ddl)  # type: ignore[arg-type]  # test DDL
                if name == release:
                    break


LOAD_FLOWS = 20
LOAD_STEPS = 10


def load_finished_runs(conninfo: str, runs: int) -> None:
    """``runs`` completed runs of 20 ten-step flows, bulk-loaded into a 0.8.1 schema (real or shape):
    ``runs * 10`` step states and tasks, every task with an output; then VACUUM ANALYZE. Used by the
    adoption benchmark and the interruption test (large enough for the adoption to take a while)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        sizes = {"flows": LOAD_FLOWS, "steps": LOAD_STEPS}
        conn.execute("INSERT INTO pgflow.flows (flow_slug) SELECT 'flow' || f FROM generate_series(0, %(flows)s - 1) AS f",
                     sizes)
        conn.execute("INSERT INTO pgflow.steps (flow_slug, step_slug, step_index, deps_count) "
                     "SELECT 'flow' || f, 'step' || s, s, least(s, 1) "
                     "FROM generate_series(0, %(flows)s - 1) AS f, generate_series(0, %(steps)s - 1) AS s", sizes)
        conn.execute("INSERT INTO pgflow.deps (flow_slug, dep_slug, step_slug) "
                     "SELECT 'flow' || f, 'step' || (s - 1), 'step' || s "
                     "FROM generate_series(0, %(flows)s - 1) AS f, generate_series(1, %(steps)s - 1) AS s", sizes)
        conn.execute("SELECT pgmq.create('flow' || f) FROM generate_series(0, %(flows)s - 1) AS f", sizes)
        conn.execute("SET session_replication_role = replica")  # bulk load: skip foreign-key triggers
        conn.execute(
            """
            CREATE TEMP TABLE bench_runs AS
            SELECT gen_random_uuid() AS run_id, 'flow' || (i %% %(flows)s) AS flow_slug,
                   now() - interval '2 days' AS started_at, now() - interval '1 day' AS finished_at
            FROM generate_series(1, %(runs)s) AS i
            """, {"runs": runs, "flows": LOAD_FLOWS})
        conn.execute(
            """
            INSERT INTO pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps, started_at, completed_at)
            SELECT run_id, flow_slug, 'completed', '{}', '{"step9": {"n": 9}}', 0, started_at, finished_at
            FROM bench_runs
            """)
        conn.execute(
            """
            INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks,
                                            remaining_deps, created_at, started_at, completed_at)
            SELECT r.flow_slug, r.run_id, 'step' || s, 'completed', 0, 1, 0, r.started_at, r.started_at, r.finished_at
            FROM bench_runs AS r, generate_series(0, %(steps)s - 1) AS s
            """, {"steps": LOAD_STEPS})
        conn.execute(
            """
            INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id, status, attempts_count,
                                           output, queued_at, started_at, completed_at)
            SELECT r.flow_slug, r.run_id, 'step' || s, 0, row_number() OVER (), 'completed', 1,
                   jsonb_build_object('n', s), r.started_at, r.started_at, r.finished_at
            FROM bench_runs AS r, generate_series(0, %(steps)s - 1) AS s
            """, {"steps": LOAD_STEPS})
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE")
