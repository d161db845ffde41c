-- A private step queue name (spec "Generated per-step names"): lower(flow__step) if it fits 47
-- characters, else lower(flow__index), else PF003. Never truncated or hashed.
CREATE OR REPLACE FUNCTION pgflow.step_queue_name(flow_slug text, step_slug text, step_index integer)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_name text;
  v_reason text;
BEGIN
  PERFORM pgflow.default_queue_name(step_queue_name.flow_slug);
  IF pg_catalog.cardinality(pgflow.slug_violations(step_queue_name.step_slug)) > 0 THEN
    RAISE EXCEPTION 'invalid step slug % in flow "%": %', coalesce(pg_catalog.quote_literal(step_queue_name.step_slug), 'NULL'),
      step_queue_name.flow_slug, pg_catalog.array_to_string(pgflow.slug_violations(step_queue_name.step_slug), ', ')
      USING ERRCODE = 'PF003';
  END IF;
  IF step_queue_name.step_index IS NULL OR step_queue_name.step_index < 0 THEN
    RAISE EXCEPTION 'step "%" of flow "%": step_index must be zero or more', step_queue_name.step_slug, step_queue_name.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  WITH route_input AS (
    SELECT step_queue_name.flow_slug AS flow_slug, step_queue_name.step_slug AS step_slug,
           step_queue_name.step_index AS step_index
  ), named AS (
--@include fragments/step_queue_names.sql
  )
  SELECT named.queue_name, named.reason INTO v_name, v_reason FROM named;
  IF v_name IS NULL THEN
    RAISE EXCEPTION 'step "%" (index %) of flow "%" cannot get a private queue: "%" and "%" are both longer than 47 characters',
      step_queue_name.step_slug, step_queue_name.step_index, step_queue_name.flow_slug,
      pg_catalog.lower((step_queue_name.flow_slug || '__' || step_queue_name.step_slug) COLLATE "C"),
      pg_catalog.lower((step_queue_name.flow_slug || '__' || step_queue_name.step_index) COLLATE "C")
      USING ERRCODE = 'PF003', HINT = 'choose a shorter flow slug for a new concrete flow';
  END IF;
  RETURN v_name;
END;
$$;
