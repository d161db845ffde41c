-- Tables and trigger of the rollout fence (moves into sql/migrations/0007_fence.sql).

-- How often worker_functions.enabled changed value. The fence records it after its own write;
-- a restore writes back only when the count is still the one it recorded (compare-and-set), so
-- an out-of-band change, even one undone since (enabled, then disabled again), is a conflict.
ALTER TABLE pgflow.worker_functions ADD COLUMN enabled_changes bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN pgflow.worker_functions.enabled_changes IS
  'times enabled changed value (kept by a trigger); the rollout fence restores a row only if it is unchanged since the fence';

--@include functions/workers/_count_enabled_change.sql

CREATE TRIGGER worker_functions_count_enabled_changes
  BEFORE UPDATE OF enabled ON pgflow.worker_functions
  FOR EACH ROW WHEN (NEW.enabled IS DISTINCT FROM OLD.enabled)
  EXECUTE FUNCTION pgflow._count_enabled_change();

-- One row per fenced worker function and fence: what the fence found, what it wrote, why, who,
-- when, and how it ended. At most one active fence per function. Closed rows are kept as history.
CREATE TABLE pgflow.fences (
  fence_id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  function_name        text        NOT NULL,
  previous_enabled     boolean     NOT NULL,
  written_enabled      boolean     NOT NULL,
  function_created_at  timestamptz NOT NULL,
  enabled_changes      bigint      NOT NULL,
  reason               text        NOT NULL,
  fenced_at            timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
  fenced_by            text        NOT NULL DEFAULT CURRENT_USER,
  fenced_application   text,
  fenced_client        text,
  workers_deprecated   integer     NOT NULL DEFAULT 0,
  state                text        NOT NULL DEFAULT 'active',
  closed_at            timestamptz,
  closed_by            text,
  closed_application   text,
  closed_client        text,
  outcome_detail       text,
  CONSTRAINT fences_state_check CHECK (state IN ('active', 'restored', 'conflict')),
  CONSTRAINT fences_closed_when_not_active CHECK ((state = 'active') = (closed_at IS NULL)),
  CONSTRAINT fences_reason_check CHECK (pg_catalog.char_length(pg_catalog.btrim(reason)) BETWEEN 1 AND 1000)
);
CREATE UNIQUE INDEX idx_fences_one_active_per_function ON pgflow.fences (function_name) WHERE state = 'active';
CREATE INDEX idx_workers_function_name ON pgflow.workers (function_name);
COMMENT ON TABLE pgflow.fences IS
  'rollout fences (pgflow fence disable/restore): per worker function, the enabled value found and written, reason, who, when, outcome';
COMMENT ON COLUMN pgflow.fences.function_created_at IS 'worker_functions.created_at when fenced: a deleted and recreated row is a conflict';
COMMENT ON COLUMN pgflow.fences.enabled_changes IS 'worker_functions.enabled_changes right after the fence wrote enabled';

--@include functions/workers/_fence_origin.sql
--@include functions/workers/_fence_holds.sql
--@include functions/workers/_fence_lock.sql
--@include functions/workers/fence_disable.sql
--@include functions/workers/fence_restore.sql

REVOKE ALL ON pgflow.fences FROM PUBLIC;
