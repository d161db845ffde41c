-- pgflow.fence_restore(function_names): the second half of the rollout fence.
--
-- For each active fence of the named functions (NULL: every active fence), under the lock of
-- the function's worker_functions row (name order, as in fence_disable), then of the fence row:
--   * the row still holds what the fence wrote (pgflow._fence_holds): enabled is set back to
--     the recorded value ('restored'; enabled = true again) or left disabled when the function
--     was already disabled before the fence ('kept_disabled');
--   * the row was changed since (enabled changed value, even if changed back; the row was
--     deleted or recreated), or a fatal claim paused the function during the fence
--     (worker_functions.paused_reason: enabling would lift that pause, docs/claim-protocol.md):
--     the row is left exactly as it is ('conflict', with the reason in detail).
-- Every processed fence is closed (state restored or conflict) with who and when, and kept.
-- When a named function has no active fence, nothing is changed and 'not_fenced' rows are
-- returned for those names. No active fence at all (NULL): no rows.
--
-- Returns one row per fence (or unfenced name), in name order.
-- Errors: 22004 when function_names is empty or holds NULL.
CREATE OR REPLACE FUNCTION pgflow.fence_restore(function_names text[] DEFAULT NULL)
RETURNS TABLE (
  function_name     text,
  outcome           text,
  previous_enabled  boolean,
  enabled           boolean,
  fence_id          bigint,
  fenced_at         timestamptz,
  fenced_by         text,
  fence_reason      text,
  closed_at         timestamptz,
  detail            text
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
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'restore fences');
  IF fence_restore.function_names IS NULL THEN
    SELECT pg_catalog.array_agg(f.function_name ORDER BY f.function_name) INTO v_names
    FROM pgflow.fences AS f WHERE f.state = 'active';
    IF v_names IS NULL THEN
      RETURN;
    END IF;
  END IF;
  v_names := pgflow._fence_lock(coalesce(fence_restore.function_names, v_names), 'fence_restore');

  IF fence_restore.function_names IS NOT NULL THEN
    RETURN QUERY
    SELECT n.name, 'not_fenced', NULL::boolean, wf.enabled, NULL::bigint, NULL::timestamptz, NULL::text, NULL::text,
           NULL::timestamptz, 'no active fence is recorded for this function'
    FROM pg_catalog.unnest(v_names) AS n (name)
    LEFT JOIN pgflow.worker_functions AS wf ON wf.function_name = n.name
    WHERE NOT EXISTS (SELECT 1 FROM pgflow.fences AS f WHERE f.function_name = n.name AND f.state = 'active')
    ORDER BY n.name;
    IF FOUND THEN
      RETURN;
    END IF;
  END IF;

  v_origin := pgflow._fence_origin();
  FOR v_fence IN
    SELECT * FROM pgflow.fences AS f
    WHERE f.function_name = ANY (v_names) AND f.state = 'active'
    ORDER BY f.function_name
  LOOP
    v_wf := NULL;
    SELECT * INTO v_wf FROM pgflow.worker_functions AS wf WHERE wf.function_name = v_fence.function_name;
    detail := CASE
      WHEN v_wf.function_name IS NULL THEN 'the worker_functions row was deleted since the fence'
      WHEN v_wf.created_at <> v_fence.function_created_at THEN 'the worker_functions row was deleted and created again since the fence'
      WHEN NOT pgflow._fence_holds(v_fence, v_wf) THEN
        pg_catalog.format('enabled was changed since the fence (now %s, %s change(s) of value)',
                          v_wf.enabled::text, v_wf.enabled_changes - v_fence.enabled_changes)
      WHEN v_fence.previous_enabled AND v_wf.paused_reason IS NOT NULL THEN
        pg_catalog.format('a fatal claim paused the function during the fence (paused_reason: %s); '
                          'restoring would lift that pause, so it stays disabled',
                          pg_catalog.left(v_wf.paused_reason, 300))
    END;
    IF detail IS NOT NULL THEN
      outcome := 'conflict';
    ELSIF v_fence.previous_enabled THEN
      UPDATE pgflow.worker_functions AS wf SET enabled = true, updated_at = pg_catalog.clock_timestamp()
      WHERE wf.function_name = v_fence.function_name
      RETURNING * INTO v_wf;
      outcome := 'restored';
    ELSE
      outcome := 'kept_disabled';
      detail := 'the function was already disabled before the fence; it stays disabled';
    END IF;

    UPDATE pgflow.fences AS f
       SET state = CASE WHEN outcome = 'conflict' THEN 'conflict' ELSE 'restored' END,
           closed_at = pg_catalog.clock_timestamp(), closed_by = v_origin.who,
           closed_application = v_origin.application, closed_client = v_origin.client,
           outcome_detail = detail
     WHERE f.fence_id = v_fence.fence_id
    RETURNING f.closed_at INTO closed_at;

    function_name := v_fence.function_name;
    previous_enabled := v_fence.previous_enabled;
    -- the result row's columns from the function's worker_functions row and its fence
    enabled := v_wf.enabled;
    fence_id := v_fence.fence_id;
    fenced_at := v_fence.fenced_at;
    fenced_by := v_fence.fenced_by;
    fence_reason := v_fence.reason;
    RETURN NEXT;
  END LOOP;
END;
$$;

REVOKE ALL ON FUNCTION pgflow.fence_restore(text[]) FROM PUBLIC;
