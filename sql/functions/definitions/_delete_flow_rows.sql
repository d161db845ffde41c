-- pgflow._delete_flow_rows(flow_slug, tables): deletes the flow's rows from each of these pgflow
-- tables, in the order given, and returns {table: rows deleted}. Whole-flow deletion calls it twice:
--   ARRAY['step_tasks', 'step_states', 'runs'] right after pgflow._lock_flow_for_deletion (every run
--     is locked, so no worker holds one of these rows while waiting for this transaction), and
--   ARRAY['deps', 'steps', 'flows'] last, after the queues, so the flow stays visible to anyone
--     waiting until the whole deletion commits.
-- The order is the foreign keys' (children first). Touches no queue: messages go with their queue
-- tables, or the caller archives them first when a queue stays (delete_flow_and_data).
CREATE OR REPLACE FUNCTION pgflow._delete_flow_rows(flow_slug text, tables text[])
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_table text;
  v_count bigint;
  v_counts jsonb := '{}'::jsonb;
BEGIN
  FOREACH v_table IN ARRAY _delete_flow_rows.tables LOOP
    IF v_table <> ALL (ARRAY['step_tasks', 'step_states', 'runs', 'deps', 'steps', 'flows']) THEN
      RAISE EXCEPTION '_delete_flow_rows(): % is not a table of a flow', pg_catalog.quote_literal(v_table) USING ERRCODE = '22023';
    END IF;
    EXECUTE pg_catalog.format('DELETE FROM pgflow.%I AS x WHERE x.flow_slug = $1', v_table) USING _delete_flow_rows.flow_slug;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    v_counts := v_counts || pg_catalog.jsonb_build_object(v_table, v_count);
  END LOOP;
  RETURN v_counts;
END;
$$;

REVOKE ALL ON FUNCTION pgflow._delete_flow_rows(text, text[]) FROM PUBLIC;
