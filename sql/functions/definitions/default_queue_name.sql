-- The default queue of a plain flow: lower(flow_slug), at most 47 characters. Raises PF003 with
-- every broken slug rule otherwise.
CREATE OR REPLACE FUNCTION pgflow.default_queue_name(flow_slug text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_reasons text[] := pgflow.slug_violations(default_queue_name.flow_slug);
  v_name text;
BEGIN
  IF pg_catalog.cardinality(v_reasons) > 0 THEN
    RAISE EXCEPTION 'invalid flow slug %: %', coalesce(pg_catalog.quote_literal(default_queue_name.flow_slug), 'NULL'),
      pg_catalog.array_to_string(v_reasons, ', ')
      USING ERRCODE = 'PF003',
            HINT = 'flow and step slugs use ASCII letters, digits and single inner underscores, start with a letter, at most 128 characters';
  END IF;
  v_name := pg_catalog.lower(default_queue_name.flow_slug COLLATE "C");
  IF pg_catalog.length(v_name) > 47 THEN
    RAISE EXCEPTION 'flow slug "%" is % characters long; its queue name may have at most 47',
      default_queue_name.flow_slug, pg_catalog.length(v_name)
      USING ERRCODE = 'PF003', HINT = 'choose a shorter flow slug';
  END IF;
  RETURN v_name;
END;
$$;
