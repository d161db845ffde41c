  v_count integer;
  v_total integer := 0;
BEGIN
  IF coalesce(pg_catalog.cardinality(p_run_ids), 0) = 0 THEN
    RETURN 0;
  END IF;
  IF pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_step_slugs)
