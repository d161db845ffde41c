-- Whether a fence still holds on its worker function row: the row exists, is the same row (not
-- deleted and recreated), has the enabled value the fence wrote, and enabled has not changed
-- value since (compare-and-set key of fence_restore, also shown by `pgflow fence status`).
CREATE OR REPLACE FUNCTION pgflow._fence_holds(fence pgflow.fences, fn pgflow.worker_functions)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$
  SELECT coalesce(fn.function_name IS NOT NULL
                  AND fn.created_at = fence.function_created_at
                  AND fn.enabled = fence.written_enabled
                  AND fn.enabled_changes = fence.enabled_changes, false)
$$;

REVOKE ALL ON FUNCTION pgflow._fence_holds(pgflow.fences, pgflow.worker_functions) FROM PUBLIC;
