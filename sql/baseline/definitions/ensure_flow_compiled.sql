--@note Protocol-1 baseline: pgflow.ensure_flow_compiled as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/definitions/ensure_flow_compiled.sql.
-- Worker startup compilation (the only compiler since 0.16.0). Under the flow lock:
--   missing flow            -> create it from the shape            -> {"status": "compiled"}
--   same shape              -> nothing                             -> {"status": "verified"}
--   different, is_local()   -> delete_flow_and_data + recreate     -> {"status": "recompiled"}
--   different, production   -> nothing (never deletes)             -> {"status": "mismatch"}
-- Every result has a "differences" array (worker vs database).
CREATE OR REPLACE FUNCTION pgflow.ensure_flow_compiled(flow_slug text, shape jsonb)
--@include functions/definitions/ensure_flow_compiled.sql lines=19-25
  v_diffs text[];
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(ensure_flow_compiled.flow_slug));

  IF NOT EXISTS (SELECT 1 FROM pgflow.flows AS f WHERE f.flow_slug = ensure_flow_compiled.flow_slug) THEN
    PERFORM pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
    RETURN pg_catalog.jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb);
  END IF;

  v_diffs := pgflow._compare_flow_shapes(ensure_flow_compiled.shape,
                                         pgflow._get_flow_shape(ensure_flow_compiled.flow_slug));
  IF coalesce(pg_catalog.cardinality(v_diffs), 0) = 0 THEN
    RETURN pg_catalog.jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb);
  END IF;

  IF pgflow.is_local() THEN
    PERFORM pgflow.delete_flow_and_data(ensure_flow_compiled.flow_slug);
    PERFORM pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
    RETURN pg_catalog.jsonb_build_object('status', 'recompiled', 'differences', pg_catalog.to_jsonb(v_diffs));
  END IF;

  RETURN pg_catalog.jsonb_build_object('status', 'mismatch', 'differences', pg_catalog.to_jsonb(v_diffs));
END;
$$;
