-- 0007 rollout fence: the durable record and the SQL of `pgflow fence disable | restore`.
--
-- What changes (spec "Required rollout documentation", "Production rollout"; docs/rollout.md):
--   * worker_functions.enabled_changes: a trigger counts every change of enabled's value; with the
--     row's created_at it is the compare-and-set key a fence restore checks, so a row changed
--     out of band since the fence (even one changed back) is a conflict and left alone;
--   * pgflow.fences: one row per fenced worker function and fence (value found, value written,
--     reason, who, when, how it ended); at most one active fence per function;
--   * pgflow.fence_disable(text[], text) records, disables and deprecates under the function
--     rows' locks; pgflow.fence_restore(text[]) writes back exactly the recorded values where the
--     rows are unchanged, never lifts a fatal claim's pause, and closes each fence;
--   * an index on workers.function_name (the drain view and deprecation look workers up by it).
-- Nothing is granted to PUBLIC; docs/permissions.md has the operator grants. Existing rows keep
-- their values (enabled_changes starts at 0). Locks: ACCESS EXCLUSIVE on pgflow.worker_functions
-- for the new column (no rewrite: a constant default), SHARE on pgflow.workers for the index
-- (small tables; heartbeats wait for milliseconds).
-- The installer takes these locks first, all or none (docs/architecture.md "Locks a migration takes").
--@lock pgflow.workers SHARE
--@lock pgflow.worker_functions ACCESS EXCLUSIVE

ALTER TABLE pgflow.worker_functions ADD COLUMN enabled_changes bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN pgflow.worker_functions.enabled_changes IS
  'times enabled changed value (kept by a trigger); the rollout fence restores a row only if it is unchanged since the fence';

--@apply functions/workers/_count_enabled_change.sql sha256=9487a1f7bcb919f1810be4c882511d7b1027c1f6aa96d62c853bc78f25fdb21e

CREATE TRIGGER worker_functions_count_enabled_changes
  BEFORE UPDATE OF enabled ON pgflow.worker_functions
  FOR EACH ROW WHEN (NEW.enabled IS DISTINCT FROM OLD.enabled)
  EXECUTE FUNCTION pgflow._count_enabled_change();

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
COMMENT ON TABLE pgflow.fences IS
  'rollout fences (pgflow fence disable/restore): per worker function, the enabled value found and written, reason, who, when, outcome';
COMMENT ON COLUMN pgflow.fences.function_created_at IS 'worker_functions.created_at when fenced: a deleted and recreated row is a conflict';
COMMENT ON COLUMN pgflow.fences.enabled_changes IS 'worker_functions.enabled_changes right after the fence wrote enabled';
REVOKE ALL ON pgflow.fences FROM PUBLIC;

CREATE INDEX idx_workers_function_name ON pgflow.workers (function_name);

--@apply functions/workers/_fence_origin.sql sha256=7e0bf0136b5f1629dc5bf544361f3b510368dadff2b95a2d578fccef1a2b573d
--@apply functions/workers/_fence_holds.sql sha256=e4ba8fce16063ba845cd5c46b4f14e332e8491a6912e769bd3c1ee3eb873e535
--@apply functions/workers/_fence_lock.sql sha256=e157cc741004f13a5f56310e4df4c3ef9f93192707e2f22d5474b4577d2b1038
--@apply functions/workers/fence_disable.sql sha256=8ef56dc667f1f3848d8d17e8a38bc345018a505a59dacbff3281d6c1317fea83
--@apply functions/workers/fence_restore.sql sha256=0d304155651edacf30f1920865ba201b7b5b157a989e1d08623e2a61406f59e7
