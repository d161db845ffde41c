--@note Protocol-1 baseline: pgflow.add_step as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/definitions/add_step.sql.
-- Adds a step to a flow (idempotent: an existing step is returned unchanged).
--@include functions/definitions/add_step.sql lines=3-24
--@include functions/definitions/add_step.sql lines=26-28
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(add_step.flow_slug));

  IF NOT EXISTS (SELECT 1 FROM pgflow.flows AS f WHERE f.flow_slug = add_step.flow_slug) THEN
--@include functions/definitions/add_step.sql lines=37-46
  IF NOT coalesce(pgflow.is_valid_slug(add_step.step_slug), false) THEN
    RAISE EXCEPTION 'invalid step slug % in flow "%": use letters, digits and underscores, not starting with a digit, at most 128 characters, not "run"',
      coalesce(pg_catalog.quote_literal(add_step.step_slug), 'NULL'), add_step.flow_slug
      USING ERRCODE = 'PF003';
--@include functions/definitions/add_step.sql lines=65-90

--@include functions/definitions/add_step.sql lines=91-94

--@include functions/definitions/add_step.sql lines=95-102

--@include functions/definitions/add_step.sql lines=103-114
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted)
--@include functions/definitions/add_step.sql lines=116-118
    add_step.required_input_pattern, add_step.forbidden_input_pattern, add_step.when_unmet, add_step.when_exhausted)
--@include functions/definitions/add_step.sql lines=121-129
