-- Protocol-2 startup compilation. Validates the complete definition and derives its routes
-- before any change; then, under the flow locks: a missing flow is created ('compiled'); an
-- identical definition with identical routes is verified ('verified'); a different one is
-- recompiled only when is_local() ('recompiled'), otherwise refused ('mismatch', with
-- mismatchKind 'shape' or 'routing'). Production never deletes anything here.
CREATE OR REPLACE FUNCTION pgflow.ensure_flow_compiled(
  flow_slug text,
  shape jsonb,
  protocol_version integer,
  queue_mode text DEFAULT 'flow',
  route_map jsonb DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_queue text;
  v_problems text[];
  v_routes jsonb;
  v_stored jsonb;
  v_flow pgflow.flows;
  v_diffs text[];
  v_kind text;
BEGIN
  IF ensure_flow_compiled.protocol_version IS DISTINCT FROM 2 THEN
    RAISE EXCEPTION 'worker speaks pgflow protocol %, database speaks protocol 2: startup of flow "%" refused',
      coalesce(ensure_flow_compiled.protocol_version::text, 'NULL'), ensure_flow_compiled.flow_slug
      USING ERRCODE = 'PF002',
            HINT = 'deploy workers and database from one release (coordinated package-and-database upgrade)';
  END IF;
  IF ensure_flow_compiled.queue_mode IS DISTINCT FROM 'flow' THEN
    RAISE EXCEPTION 'flow "%": queue mode % is not available in this database (schema 0003 supports plain flows only)',
      ensure_flow_compiled.flow_slug, coalesce(pg_catalog.quote_literal(ensure_flow_compiled.queue_mode), 'NULL')
      USING ERRCODE = 'PF003', HINT = 'private per-step queues need a later pgflow-cli migration';
  END IF;
  IF ensure_flow_compiled.shape IS NULL OR pg_catalog.jsonb_typeof(ensure_flow_compiled.shape) <> 'object'
     OR pg_catalog.jsonb_typeof(ensure_flow_compiled.shape -> 'steps') IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'flow "%": the shape must be a JSON object with a "steps" array', ensure_flow_compiled.flow_slug
      USING ERRCODE = 'PF003';
  END IF;

  v_queue := pgflow.default_queue_name(ensure_flow_compiled.flow_slug);
  v_problems := pgflow._shape_problems(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
  IF pg_catalog.cardinality(v_problems) > 0 THEN
    RAISE EXCEPTION 'flow "%": % problem(s) in the definition; nothing was changed',
      ensure_flow_compiled.flow_slug, pg_catalog.cardinality(v_problems)
      USING ERRCODE = 'PF003', DETAIL = pg_catalog.array_to_string(v_problems, E'\n'),
            HINT = 'slugs use ASCII letters, digits and single inner underscores, start with a letter, and are unique ignoring case';
  END IF;
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', x.e ->> 'slug', 'queueName',
                   CASE WHEN x.e ->> 'executionMode' = 'manual' THEN NULL ELSE v_queue END) ORDER BY x.n), '[]'::jsonb)
  INTO v_routes
  FROM pg_catalog.jsonb_array_elements(ensure_flow_compiled.shape -> 'steps') WITH ORDINALITY AS x (e, n);
  IF ensure_flow_compiled.route_map IS NOT NULL AND ensure_flow_compiled.route_map IS DISTINCT FROM v_routes THEN
    RAISE EXCEPTION 'flow "%": the worker''s route map differs from the routes the database derives', ensure_flow_compiled.flow_slug
      USING ERRCODE = 'PF003',
            DETAIL = pg_catalog.format('worker: %s; database: %s', ensure_flow_compiled.route_map, v_routes),
            HINT = 'worker and database must run the same naming rules: upgrade them together';
  END IF;

  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(v_queue));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(ensure_flow_compiled.flow_slug));

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = ensure_flow_compiled.flow_slug;
  IF NOT FOUND THEN
    PERFORM pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
    RETURN pg_catalog.jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb, 'mismatchKind', NULL,
                                         'queueMode', 'flow', 'routes', v_routes);
  END IF;

  v_diffs := pgflow._compare_flow_shapes(ensure_flow_compiled.shape, pgflow._get_flow_shape(ensure_flow_compiled.flow_slug));
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', s.step_slug, 'queueName',
                   CASE WHEN s.execution_mode = 'manual' THEN NULL ELSE s.queue_name END)
                                       ORDER BY s.step_index), '[]'::jsonb)
  INTO v_stored
  FROM pgflow.steps AS s WHERE s.flow_slug = ensure_flow_compiled.flow_slug;

  IF coalesce(pg_catalog.cardinality(v_diffs), 0) = 0 AND v_flow.queue_mode = 'flow' AND v_stored = v_routes THEN
    IF NOT pgflow._queue_exists(v_queue) THEN
      RAISE EXCEPTION 'queue "%" of flow "%" is missing from PGMQ', v_queue, ensure_flow_compiled.flow_slug
        USING ERRCODE = 'PF004',
              HINT = pg_catalog.format('recreate it with SELECT pgmq.create(%L) if the flow should keep running', v_queue);
    END IF;
    RETURN pg_catalog.jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb, 'mismatchKind', NULL,
                                         'queueMode', 'flow', 'routes', v_routes);
  END IF;

  v_kind := CASE WHEN coalesce(pg_catalog.cardinality(v_diffs), 0) > 0 THEN 'shape' ELSE 'routing' END;
  IF v_kind = 'routing' THEN
    v_diffs := ARRAY[pg_catalog.format('routes: database has %s (queue mode %s), worker derives %s (queue mode flow)',
                                       v_stored, v_flow.queue_mode, v_routes)];
  END IF;
  IF pgflow.is_local() THEN
    PERFORM pgflow.delete_flow_and_data(ensure_flow_compiled.flow_slug);
    PERFORM pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
    RETURN pg_catalog.jsonb_build_object('status', 'recompiled', 'differences', pg_catalog.to_jsonb(v_diffs),
                                         'mismatchKind', v_kind, 'queueMode', 'flow', 'routes', v_routes);
  END IF;
  RETURN pg_catalog.jsonb_build_object('status', 'mismatch', 'differences', pg_catalog.to_jsonb(v_diffs),
                                       'mismatchKind', v_kind, 'queueMode', v_flow.queue_mode, 'routes', v_stored);
END;
$$;
