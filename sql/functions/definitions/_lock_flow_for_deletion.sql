-- pgflow._lock_flow_for_deletion(flow_slug): the locks whole-flow deletion holds, in the runtime's
-- order (docs/runtime.md "Lock order"), for the rest of the transaction.
--
--   1. the flow advisory locks, exclusive: (1, hashtext(lower(slug))) then (1, hashtext(slug)),
--      the keys definitions and start_flow (shared) take, so no run starts and no definition of
--      this flow or a case alias changes until the transaction ends;
--   2. every run of the flow FOR UPDATE, in run_id order: claims take runs FOR SHARE in the same
--      order, completions and failures take their run FOR UPDATE first, so a worker inside
--      claim_tasks/complete_task/fail_task finishes first and any later one waits and then finds
--      nothing. Step states, tasks and queue rows are only touched after this.
--
-- Returns the number of runs locked. A second call in the same transaction is cheap and harmless
-- (the CLI locks first, exports the run history unchanged, then calls pgflow.drop_flow).
CREATE OR REPLACE FUNCTION pgflow._lock_flow_for_deletion(flow_slug text)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_runs bigint;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(_lock_flow_for_deletion.flow_slug COLLATE "C")));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(_lock_flow_for_deletion.flow_slug));
  WITH locked AS (
    SELECT 1 FROM pgflow.runs AS r WHERE r.flow_slug = _lock_flow_for_deletion.flow_slug
    ORDER BY r.run_id
    FOR UPDATE
  )
  SELECT pg_catalog.count(*) INTO v_runs FROM locked;
  RETURN v_runs;
END;
$$;

REVOKE ALL ON FUNCTION pgflow._lock_flow_for_deletion(text) FROM PUBLIC;
