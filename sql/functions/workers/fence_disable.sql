-- pgflow.fence_disable(function_names, reason): the first half of the rollout fence.
--
-- For each named worker function, under the lock of its worker_functions row (taken in name
-- order, the order register_worker and fence_restore use too):
--   * records a fence (pgflow.fences): the enabled value found, the value written (false), the
--     row's change count after the write, reason, who, when;
--   * disables the function (enabled = false), so register_worker refuses its workers (PF001)
--     and the HTTP starter (ensure_workers) no longer pings it;
--   * deprecates its workers that have not stopped, so each stops polling at its next heartbeat
--     and finishes the tasks it holds.
-- A function that already has an active, untouched fence is left as it is ('already_fenced');
-- its workers are deprecated again if any appeared. Nothing is changed at all when a name is
-- unknown ('unknown' rows) or when a function's active fence no longer matches its row
-- ('stale_fence' rows: someone changed enabled since; restore that fence first, which reports
-- the conflict and closes it).
--
-- Returns one row per distinct name, in name order. action: fenced | already_fenced | unknown
-- | stale_fence. workers_deprecated: workers deprecated by this call.
-- Errors: 22004 when function_names is empty or holds NULL; 22023 for an empty reason.
CREATE OR REPLACE FUNCTION pgflow.fence_disable(function_names text[], reason text)
RETURNS TABLE (
  function_name       text,
  action              text,
  previous_enabled    boolean,
  enabled             boolean,
  fence_id            bigint,
  fenced_at           timestamptz,
  fenced_by           text,
  fence_reason        text,
  paused_reason       text,
  workers_deprecated  integer
)
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  -- the names it locks (in name order), who runs the call (_fence_origin), and the
  -- worker_functions and fences rows of the function the loop is at
  v_names text[];
  v_origin record;
  v_wf pgflow.worker_functions;
  v_fence pgflow.fences;
  v_count integer;
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'fence worker functions');
  IF fence_disable.reason IS NULL OR pg_catalog.btrim(fence_disable.reason) = ''
     OR pg_catalog.char_length(pg_catalog.btrim(fence_disable.reason)) > 1000 THEN
    RAISE EXCEPTION 'fence_disable(): a reason of 1 to 1000 characters is required (why the functions are fenced)'
      USING ERRCODE = '22023';
  END IF;
  v_names := pgflow._fence_lock(fence_disable.function_names, 'fence_disable');

  -- Refusals first: nothing changes unless every name can be fenced.
  RETURN QUERY
  SELECT n.name,
         CASE WHEN wf.function_name IS NULL THEN 'unknown' ELSE 'stale_fence' END,
         f.previous_enabled, wf.enabled, f.fence_id, f.fenced_at, f.fenced_by, f.reason, wf.paused_reason, 0
  FROM pg_catalog.unnest(v_names) AS n (name)
  LEFT JOIN pgflow.worker_functions AS wf ON wf.function_name = n.name
  LEFT JOIN pgflow.fences AS f ON f.function_name = n.name AND f.state = 'active'
  WHERE wf.function_name IS NULL OR (f.fence_id IS NOT NULL AND NOT pgflow._fence_holds(f, wf))
  ORDER BY n.name;
  IF FOUND THEN
    RETURN;
  END IF;

  v_origin := pgflow._fence_origin();
  FOR i IN 1 .. pg_catalog.cardinality(v_names) LOOP
    SELECT * INTO v_wf FROM pgflow.worker_functions AS wf WHERE wf.function_name = v_names[i];
    SELECT * INTO v_fence FROM pgflow.fences AS f WHERE f.function_name = v_names[i] AND f.state = 'active';
    IF v_fence.fence_id IS NULL THEN
      action := 'fenced';
      previous_enabled := v_wf.enabled;
      IF v_wf.enabled THEN
        UPDATE pgflow.worker_functions AS wf SET enabled = false, updated_at = pg_catalog.clock_timestamp()
        WHERE wf.function_name = v_names[i]
        RETURNING * INTO v_wf;
      END IF;
      INSERT INTO pgflow.fences AS f (function_name, previous_enabled, written_enabled, function_created_at,
                                      enabled_changes, reason, fenced_by, fenced_application, fenced_client)
      VALUES (v_names[i], previous_enabled, false, v_wf.created_at, v_wf.enabled_changes,
              pg_catalog.btrim(fence_disable.reason), v_origin.who, v_origin.application, v_origin.client)
      RETURNING * INTO v_fence;
    ELSE
      action := 'already_fenced';
      previous_enabled := v_fence.previous_enabled;
    END IF;

    UPDATE pgflow.workers AS w SET deprecated_at = pg_catalog.clock_timestamp()
    WHERE w.function_name = v_names[i] AND w.stopped_at IS NULL AND w.deprecated_at IS NULL;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
      UPDATE pgflow.fences AS f SET workers_deprecated = f.workers_deprecated + v_count
      WHERE f.fence_id = v_fence.fence_id;
    END IF;

    function_name := v_names[i];
    -- the result row's columns from the function's worker_functions row and its fence
    enabled := v_wf.enabled;
    fence_id := v_fence.fence_id;
    fenced_at := v_fence.fenced_at;
    fenced_by := v_fence.fenced_by;
    fence_reason := v_fence.reason;
    paused_reason := v_wf.paused_reason;
    workers_deprecated := v_count;
    RETURN NEXT;
  END LOOP;
END;
$$;

-- Operators get EXECUTE with the grants in docs/permissions.md ("`pgflow fence`: rollout operators").
REVOKE ALL ON FUNCTION pgflow.fence_disable(text[], text) FROM PUBLIC;
