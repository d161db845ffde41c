--@note Protocol-1 baseline: pgflow.create_flow as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/definitions/create_flow.sql.
-- Creates a flow (idempotent: an existing flow keeps its options) and its PGMQ queue, named
-- exactly like the flow, unless pgmq.meta already lists that exact name.
--@include functions/definitions/create_flow.sql lines=4-17
BEGIN
  IF NOT coalesce(pgflow.is_valid_slug(create_flow.flow_slug), false) THEN
    RAISE EXCEPTION 'invalid flow slug %: use letters, digits and underscores, not starting with a digit, at most 128 characters, not "run"',
      coalesce(pg_catalog.quote_literal(create_flow.flow_slug), 'NULL')
      USING ERRCODE = 'PF003';
  END IF;
  IF pg_catalog.length(create_flow.flow_slug) > 47 THEN
    RAISE EXCEPTION 'flow slug "%" is % characters long; its PGMQ queue name may have at most 47',
      create_flow.flow_slug, pg_catalog.length(create_flow.flow_slug)
      USING ERRCODE = 'PF003', HINT = 'choose a shorter flow slug';
  END IF;
--@include functions/definitions/create_flow.sql lines=21-26
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(create_flow.flow_slug));

  INSERT INTO pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout)
--@include functions/definitions/create_flow.sql lines=53-55
          coalesce(create_flow.timeout, 60))
  ON CONFLICT (flow_slug) DO NOTHING;

  IF NOT EXISTS (SELECT 1 FROM pgmq.meta AS m WHERE m.queue_name = create_flow.flow_slug) THEN
    PERFORM pgmq.create(create_flow.flow_slug);
  END IF;

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = create_flow.flow_slug;
--@include functions/definitions/create_flow.sql lines=67-69
