-- Protocol-2 startup compilation (spec "Startup compilation", "Generated private ownership").
-- The worker sends its complete ordered definition, its queue mode ('flow' or 'step') and the
-- route map it derived. Before any change, Postgres validates the shape, derives the routes
-- itself (plain: every step on lower(flow_slug); step: each step on its generated private queue,
-- the whole flow rejected when any name cannot fit 47 characters), checks every generated name
-- with pgmq.validate_queue_name() and compares the worker's route map. Then, under the flow locks:
-- a missing flow is created with its queues ('compiled', collisions refused before any change);
-- an identical definition with the same mode and routes is verified and its queues reused
-- ('verified'); anything else is recompiled only when is_local() ('recompiled'), otherwise
-- refused ('mismatch', mismatchKind 'shape' or 'routing': a changed mode or route is routing).
-- Production never deletes anything here.
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
  v_key text;
  v_problems text[];
  v_routes jsonb;
  v_stored jsonb;
  v_flow pgflow.flows;
  v_diffs text[];
  v_kind text;
  v_opts jsonb;
  v_queue text;
BEGIN
  IF ensure_flow_compiled.protocol_version IS DISTINCT FROM 2 THEN
    RAISE EXCEPTION 'worker speaks pgflow protocol %, database speaks protocol 2: startup of flow "%" refused',
      coalesce(ensure_flow_compiled.protocol_version::text, 'NULL'), ensure_flow_compiled.flow_slug
      USING ERRCODE = 'PF002',
            HINT = 'deploy workers and database from one release (coordinated package-and-database upgrade)';
  END IF;
  IF ensure_flow_compiled.queue_mode IS NULL OR ensure_flow_compiled.queue_mode NOT IN ('flow', 'step') THEN
    RAISE EXCEPTION 'flow "%": queue mode must be ''flow'' or ''step'', not %',
      ensure_flow_compiled.flow_slug, coalesce(pg_catalog.quote_literal(ensure_flow_compiled.queue_mode), 'NULL')
      USING ERRCODE = 'PF003';
  END IF;
  IF ensure_flow_compiled.shape IS NULL OR pg_catalog.jsonb_typeof(ensure_flow_compiled.shape) <> 'object'
     OR pg_catalog.jsonb_typeof(ensure_flow_compiled.shape -> 'steps') IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'flow "%": the shape must be a JSON object with a "steps" array', ensure_flow_compiled.flow_slug
      USING ERRCODE = 'PF003';
  END IF;

  -- the normalized flow key (the flow lock) is the plain flow's default queue name
  v_key := pgflow.default_queue_name(ensure_flow_compiled.flow_slug);
  v_problems := pgflow._shape_problems(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
  IF pg_catalog.cardinality(v_problems) > 0 THEN
    RAISE EXCEPTION 'flow "%": % problem(s) in the definition; nothing was changed',
      ensure_flow_compiled.flow_slug, pg_catalog.cardinality(v_problems)
      USING ERRCODE = 'PF003', DETAIL = pg_catalog.array_to_string(v_problems, E'\n'),
            HINT = 'slugs use ASCII letters, digits and single inner underscores, start with a letter, and are unique ignoring case';
  END IF;
  IF ensure_flow_compiled.queue_mode = 'flow' THEN
    SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', x.e ->> 'slug', 'queueName', v_key) ORDER BY x.n), '[]'::jsonb)
    INTO v_routes
    FROM pg_catalog.jsonb_array_elements(ensure_flow_compiled.shape -> 'steps') WITH ORDINALITY AS x (e, n);
  ELSE
    v_opts := coalesce(ensure_flow_compiled.shape -> 'options', '{}'::jsonb);
    IF (v_opts ->> 'maxAttempts')::integer < 0 OR (v_opts ->> 'baseDelay')::integer < 0 OR (v_opts ->> 'timeout')::integer <= 0 THEN
      RAISE EXCEPTION 'invalid options for flow "%": max_attempts and base_delay must be >= 0, timeout > 0',
        ensure_flow_compiled.flow_slug
        USING ERRCODE = 'PF003';
    END IF;
    v_routes := pgflow._step_queue_routes(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
  END IF;
  IF ensure_flow_compiled.route_map IS NOT NULL AND ensure_flow_compiled.route_map IS DISTINCT FROM v_routes THEN
    RAISE EXCEPTION 'flow "%": the worker''s route map differs from the routes the database derives', ensure_flow_compiled.flow_slug
      USING ERRCODE = 'PF003',
            DETAIL = pg_catalog.format('worker: %s; database: %s', ensure_flow_compiled.route_map, v_routes),
            HINT = 'worker and database must run the same naming rules: upgrade them together';
  END IF;

  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(v_key));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(ensure_flow_compiled.flow_slug));

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = ensure_flow_compiled.flow_slug;
  IF NOT FOUND THEN
    PERFORM pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape,
                                           CASE WHEN ensure_flow_compiled.queue_mode = 'step' THEN v_routes END);
    RETURN pg_catalog.jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb, 'mismatchKind', NULL,
                                         'queueMode', ensure_flow_compiled.queue_mode, 'routes', v_routes);
  END IF;

  v_diffs := pgflow._compare_flow_shapes(ensure_flow_compiled.shape, pgflow._get_flow_shape(ensure_flow_compiled.flow_slug));
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', s.step_slug, 'queueName', s.queue_name)
                                       ORDER BY s.step_index), '[]'::jsonb)
  INTO v_stored
  FROM pgflow.steps AS s WHERE s.flow_slug = ensure_flow_compiled.flow_slug;

  IF coalesce(pg_catalog.cardinality(v_diffs), 0) = 0 AND v_flow.queue_mode = ensure_flow_compiled.queue_mode
     AND v_stored = v_routes THEN
    -- the exact definition: reuse its queues, which must all still exist
    FOR v_queue IN
      SELECT DISTINCT r ->> 'queueName' FROM pg_catalog.jsonb_array_elements(v_routes) AS r
      UNION SELECT v_key WHERE ensure_flow_compiled.queue_mode = 'flow'
      ORDER BY 1
    LOOP
      IF NOT pgflow._queue_exists(v_queue) THEN
        RAISE EXCEPTION 'queue "%" of flow "%" is missing from PGMQ', v_queue, ensure_flow_compiled.flow_slug
          USING ERRCODE = 'PF004',
                HINT = pg_catalog.format('recreate it with SELECT pgmq.create(%L) if the flow should keep running', v_queue);
      END IF;
    END LOOP;
    RETURN pg_catalog.jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb, 'mismatchKind', NULL,
                                         'queueMode', ensure_flow_compiled.queue_mode, 'routes', v_routes);
  END IF;

  v_kind := CASE WHEN coalesce(pg_catalog.cardinality(v_diffs), 0) > 0 THEN 'shape' ELSE 'routing' END;
  IF v_kind = 'routing' THEN
    v_diffs := ARRAY[pg_catalog.format('routes: database has %s (queue mode %s), worker derives %s (queue mode %s)',
                                       v_stored, v_flow.queue_mode, v_routes, ensure_flow_compiled.queue_mode)];
  END IF;
  IF pgflow.is_local() THEN
    PERFORM pgflow.delete_flow_and_data(ensure_flow_compiled.flow_slug);
    PERFORM pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape,
                                           CASE WHEN ensure_flow_compiled.queue_mode = 'step' THEN v_routes END);
    RETURN pg_catalog.jsonb_build_object('status', 'recompiled', 'differences', pg_catalog.to_jsonb(v_diffs),
                                         'mismatchKind', v_kind, 'queueMode', ensure_flow_compiled.queue_mode,
                                         'routes', v_routes);
  END IF;
  RETURN pg_catalog.jsonb_build_object('status', 'mismatch', 'differences', pg_catalog.to_jsonb(v_diffs),
                                       'mismatchKind', v_kind, 'queueMode', v_flow.queue_mode, 'routes', v_stored);
END;
$$;
