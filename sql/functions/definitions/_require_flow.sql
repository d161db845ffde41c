-- pgflow._require_flow(flow_slug): the queue mode of the flow with exactly this slug, or PF006.
-- Slugs are compared exactly: "MyFlow" is not "myflow". When only a case variant exists, the
-- error names it, so an operator never drops a flow by a slug they did not type.
CREATE OR REPLACE FUNCTION pgflow._require_flow(flow_slug text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_mode text;
  v_variant text;
BEGIN
  SELECT f.queue_mode INTO v_mode FROM pgflow.flows AS f WHERE f.flow_slug = _require_flow.flow_slug;
  IF FOUND THEN
    RETURN v_mode;
  END IF;
  SELECT f.flow_slug INTO v_variant FROM pgflow.flows AS f
  WHERE pg_catalog.lower(f.flow_slug COLLATE "C") = pg_catalog.lower(_require_flow.flow_slug COLLATE "C");
  IF v_variant IS NOT NULL THEN
    RAISE EXCEPTION 'flow "%" does not exist (flow "%" differs only in letter case and is a different flow)',
      _require_flow.flow_slug, v_variant
      USING ERRCODE = 'PF006', HINT = pg_catalog.format('slugs are exact; to act on that flow, name it as "%s"', v_variant);
  END IF;
  RAISE EXCEPTION 'flow "%" does not exist', _require_flow.flow_slug
    USING ERRCODE = 'PF006', HINT = 'list the flows with SELECT flow_slug FROM pgflow.flows';
END;
$$;

REVOKE ALL ON FUNCTION pgflow._require_flow(text) FROM PUBLIC;
