-- 0003 queue identity, part 2: functions. Included by 0003_queue_identity.sql (main phase);
-- its text counts toward that migration's checksum, so it is as immutable as the migration.
--
-- Conventions as in 0002: search_path = '', everything schema-qualified, PF SQLSTATEs
-- (docs/architecture.md), "#variable_conflict use_column" where parameters share column names.
-- Flow advisory locks: (1, hashtext(lower(flow_slug))) first, then (1, hashtext(flow_slug)):
-- the normalized key serializes case aliases at definition time; the exact key is the one
-- start_flow (shared) and deletion already use, so runs never start during a deletion.

------------------------------------------------------------------------------------------------
-- Protocol and names
------------------------------------------------------------------------------------------------

-- 2 = queue identity: startup ensure_flow_compiled(flow_slug, shape, protocol_version => 2, ...),
-- claim pgflow.claim_tasks(queue_name, msg_ids, worker_id, flow_slug, step_slug).
CREATE OR REPLACE FUNCTION pgflow.protocol_version()
RETURNS integer
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$ SELECT 2 $$;

-- The default queue of a plain flow: lower(flow_slug), at most 47 characters. Raises PF003 with
-- every broken slug rule otherwise.
CREATE FUNCTION pgflow.default_queue_name(flow_slug text)
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

-- A private step queue name (spec "Generated per-step names"): lower(flow__step) if it fits 47
-- characters, else lower(flow__index), else PF003. Never truncated or hashed.
CREATE FUNCTION pgflow.step_queue_name(flow_slug text, step_slug text, step_index integer)
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

-- The spelling pgmq.meta lists for a queue (case-insensitive match), for operations that need it
-- exactly (pgmq.drop_queue). Returns the argument when nothing is listed; PF004 when several
-- spellings map to the same tables.
CREATE FUNCTION pgflow._listed_queue_name(p_queue_name text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_spellings text[];
BEGIN
  SELECT pg_catalog.array_agg(m.queue_name::text ORDER BY m.queue_name::text)
  INTO v_spellings
  FROM pgmq.meta AS m
  WHERE pg_catalog.lower(m.queue_name::text COLLATE "C") = pg_catalog.lower(p_queue_name COLLATE "C");
  IF v_spellings IS NULL THEN
    RETURN p_queue_name;
  END IF;
  IF pg_catalog.cardinality(v_spellings) > 1 THEN
    RAISE EXCEPTION 'queue "%" is listed in pgmq.meta under several spellings (%): they share one set of tables',
      p_queue_name, pg_catalog.array_to_string(v_spellings, ', ')
      USING ERRCODE = 'PF004', HINT = 'remove the surplus pgmq.meta rows by hand (see docs/audit.md, queue_alias_conflict)';
  END IF;
  RETURN v_spellings[1];
END;
$$;

-- True when PGMQ has the queue (a meta row in any letter case, or its queue table).
CREATE FUNCTION pgflow._queue_exists(p_queue_name text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT EXISTS (SELECT 1 FROM pgmq.meta AS m
                 WHERE pg_catalog.lower(m.queue_name::text COLLATE "C") = pg_catalog.lower(p_queue_name COLLATE "C"))
      OR pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(p_queue_name, 'q'))) IS NOT NULL
$$;

-- Refuses (PF004) a queue a new definition would create when anything already holds that name:
-- another flow's route, another flow's tasks, or a PGMQ queue pgflow did not create for this
-- definition. pgflow never adopts an existing queue. Caller holds the flow locks.
CREATE FUNCTION pgflow._assert_queue_unclaimed(p_flow_slug text, p_queue_name text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_other text;
BEGIN
  SELECT s.flow_slug INTO v_other FROM pgflow.steps AS s
  WHERE s.queue_name = p_queue_name AND s.flow_slug <> p_flow_slug LIMIT 1;
  IF v_other IS NULL THEN
    SELECT t.flow_slug INTO v_other FROM pgflow.step_tasks AS t
    WHERE t.queue_name = p_queue_name AND t.flow_slug <> p_flow_slug LIMIT 1;
  END IF;
  IF v_other IS NOT NULL THEN
    RAISE EXCEPTION 'queue "%" already belongs to flow "%"; flow "%" cannot use it', p_queue_name, v_other, p_flow_slug
      USING ERRCODE = 'PF004', HINT = 'choose another concrete flow slug';
  END IF;
  IF pgflow._queue_exists(p_queue_name) THEN
    RAISE EXCEPTION 'a PGMQ queue named "%" already exists and pgflow did not create it for flow "%"; pgflow never adopts an existing queue',
      p_queue_name, p_flow_slug
      USING ERRCODE = 'PF004',
            HINT = 'if that queue is unused, drop it (SELECT pgmq.drop_queue(<exact pgmq.meta spelling>)); otherwise choose another flow slug';
  END IF;
END;
$$;

------------------------------------------------------------------------------------------------
-- Queue helpers: the snapshot decides (docs/architecture.md "Queue operations go through two helpers")
------------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgflow._archive_task_messages(
  p_run_ids uuid[],
  p_step_slugs text[],
  p_task_indexes integer[]
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_queue text;
  v_msg_ids bigint[];
  v_count integer;
  v_total integer := 0;
BEGIN
  IF coalesce(pg_catalog.cardinality(p_run_ids), 0) = 0 THEN
    RETURN 0;
  END IF;
  IF pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_step_slugs)
     OR pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_task_indexes) THEN
    RAISE EXCEPTION '_archive_task_messages(): the task key arrays differ in length (% run ids, % step slugs, % task indexes)',
      pg_catalog.cardinality(p_run_ids), pg_catalog.cardinality(p_step_slugs), pg_catalog.cardinality(p_task_indexes)
      USING ERRCODE = '22023';
  END IF;

  FOR v_queue, v_msg_ids IN
    SELECT t.queue_name,
           pg_catalog.array_agg(DISTINCT t.message_id ORDER BY t.message_id)
    FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes)) AS k (run_id, step_slug, task_index)
    -- one primary-key probe per task, whatever the table size
    JOIN LATERAL (
      SELECT st.queue_name, st.message_id FROM pgflow.step_tasks AS st
      WHERE st.run_id = k.run_id AND st.step_slug = k.step_slug AND st.task_index = k.task_index
      LIMIT 1  -- the primary key; keeps the planner from flattening this into a hash join
    ) AS t ON true
    WHERE t.message_id IS NOT NULL
    GROUP BY t.queue_name
    ORDER BY t.queue_name
  LOOP
    SELECT pg_catalog.count(*)::integer INTO v_count FROM pgmq.archive(v_queue, v_msg_ids);
    v_total := v_total + v_count;
  END LOOP;
  RETURN v_total;
END;
$$;

CREATE OR REPLACE FUNCTION pgflow._set_task_messages_vt(
  p_run_ids uuid[],
  p_step_slugs text[],
  p_task_indexes integer[],
  p_vt_offsets integer[]
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_queue text;
  v_msg_ids bigint[];
  v_offsets integer[];
  v_count integer;
  v_total integer := 0;
BEGIN
  IF coalesce(pg_catalog.cardinality(p_run_ids), 0) = 0 THEN
    RETURN 0;
  END IF;
  IF pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_step_slugs)
     OR pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_task_indexes)
     OR pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_vt_offsets) THEN
    RAISE EXCEPTION '_set_task_messages_vt(): the argument arrays differ in length'
      USING ERRCODE = '22023';
  END IF;
  IF pg_catalog.array_position(p_vt_offsets, NULL) IS NOT NULL THEN
    RAISE EXCEPTION '_set_task_messages_vt(): a visibility offset is NULL'
      USING ERRCODE = '22023';
  END IF;

  FOR v_queue, v_msg_ids, v_offsets IN
    SELECT t.queue_name,
           pg_catalog.array_agg(t.message_id ORDER BY t.message_id),
           pg_catalog.array_agg(k.vt_offset ORDER BY t.message_id)
    FROM (
      SELECT DISTINCT ON (u.run_id, u.step_slug, u.task_index) u.run_id, u.step_slug, u.task_index, u.vt_offset
      FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes), pg_catalog.unnest(p_vt_offsets))
           AS u (run_id, step_slug, task_index, vt_offset)
      ORDER BY u.run_id, u.step_slug, u.task_index
    ) AS k
    -- one primary-key probe per task, whatever the table size
    JOIN LATERAL (
      SELECT st.queue_name, st.message_id FROM pgflow.step_tasks AS st
      WHERE st.run_id = k.run_id AND st.step_slug = k.step_slug AND st.task_index = k.task_index
      LIMIT 1  -- the primary key; keeps the planner from flattening this into a hash join
    ) AS t ON true
    WHERE t.message_id IS NOT NULL
    GROUP BY t.queue_name
    ORDER BY t.queue_name
  LOOP
    EXECUTE pg_catalog.format(
      'UPDATE pgmq.%I AS q
          SET vt = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => v.vt_offset)
         FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::integer[])) AS v (msg_id, vt_offset)
        WHERE q.msg_id = v.msg_id',
      pgmq.format_table_name(v_queue, 'q'))
    USING v_msg_ids, v_offsets;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    v_total := v_total + v_count;
  END LOOP;
  RETURN v_total;
END;
$$;

------------------------------------------------------------------------------------------------
-- Definitions
------------------------------------------------------------------------------------------------

-- Creates a plain flow and its default queue lower(flow_slug); idempotent for an existing flow
-- (options unchanged). Refuses case aliases of existing flows (PF003) and queues pgflow did not
-- create for this flow (PF004).
CREATE OR REPLACE FUNCTION pgflow.create_flow(
  flow_slug text,
  max_attempts integer DEFAULT NULL,
  base_delay integer DEFAULT NULL,
  timeout integer DEFAULT NULL
)
RETURNS pgflow.flows
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow pgflow.flows;
  v_queue text := pgflow.default_queue_name(create_flow.flow_slug);
  v_alias text;
BEGIN
  IF create_flow.max_attempts < 0 OR create_flow.base_delay < 0 OR create_flow.timeout <= 0 THEN
    RAISE EXCEPTION 'invalid options for flow "%": max_attempts and base_delay must be >= 0, timeout > 0',
      create_flow.flow_slug
      USING ERRCODE = 'PF003';
  END IF;

  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(v_queue));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(create_flow.flow_slug));

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = create_flow.flow_slug;
  IF FOUND THEN
    IF v_flow.queue_mode = 'flow' AND NOT pgflow._queue_exists(v_queue) THEN
      RAISE EXCEPTION 'queue "%" of flow "%" is missing from PGMQ', v_queue, create_flow.flow_slug
        USING ERRCODE = 'PF004',
              HINT = pg_catalog.format('recreate it with SELECT pgmq.create(%L) if the flow should keep running', v_queue);
    END IF;
    RETURN v_flow;
  END IF;

  SELECT f.flow_slug INTO v_alias FROM pgflow.flows AS f
  WHERE pg_catalog.lower(f.flow_slug COLLATE "C") = v_queue;
  IF FOUND THEN
    RAISE EXCEPTION 'flow slug "%" differs only by letter case from existing flow "%"', create_flow.flow_slug, v_alias
      USING ERRCODE = 'PF003', HINT = 'flow slugs are unique ignoring case, because queue names are lowercase';
  END IF;
  -- PGMQ's own creation lock for this name: a concurrent pgmq.create() of it finishes (commits or
  -- rolls back) before we look, so a queue provisioned meanwhile is seen and refused, never adopted.
  PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgmq.queue_' || v_queue));
  PERFORM pgflow._assert_queue_unclaimed(create_flow.flow_slug, v_queue);
  PERFORM pgmq.validate_queue_name(v_queue);

  INSERT INTO pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
  VALUES (create_flow.flow_slug,
          coalesce(create_flow.max_attempts, 3),
          coalesce(create_flow.base_delay, 5),
          coalesce(create_flow.timeout, 60),
          'flow')
  RETURNING * INTO v_flow;
  BEGIN
    PERFORM pgmq.create(v_queue);
  EXCEPTION WHEN unique_violation THEN
    -- the same tables created concurrently under another letter case (another lock key)
    RAISE EXCEPTION 'a PGMQ queue named "%" appeared while flow "%" was being created; pgflow never adopts an existing queue',
      v_queue, create_flow.flow_slug
      USING ERRCODE = 'PF004', HINT = 'find out who created that queue; drop it if unused, or choose another flow slug';
  END;
  RETURN v_flow;
END;
$$;

-- Adds a step to a plain flow; its route is the flow's default queue. Idempotent for an existing
-- step. Refuses step slugs breaking the shared rules and case-only duplicates (PF003).
CREATE OR REPLACE FUNCTION pgflow.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] DEFAULT '{}',
  max_attempts integer DEFAULT NULL,
  base_delay integer DEFAULT NULL,
  timeout integer DEFAULT NULL,
  start_delay integer DEFAULT NULL,
  step_type text DEFAULT 'single',
  required_input_pattern jsonb DEFAULT NULL,
  forbidden_input_pattern jsonb DEFAULT NULL,
  when_unmet text DEFAULT 'skip',
  when_exhausted text DEFAULT 'fail'
)
RETURNS pgflow.steps
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_step pgflow.steps;
  v_flow pgflow.flows;
  v_deps text[];
  v_missing text[];
  v_index integer;
  v_reasons text[];
  v_twin text;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(add_step.flow_slug COLLATE "C")));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(add_step.flow_slug));

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = add_step.flow_slug;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'cannot add step "%": flow "%" does not exist', add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003', HINT = 'create the flow first with pgflow.create_flow()';
  END IF;

  SELECT s.* INTO v_step FROM pgflow.steps AS s
  WHERE s.flow_slug = add_step.flow_slug AND s.step_slug = add_step.step_slug;
  IF FOUND THEN
    RETURN v_step;
  END IF;

  IF v_flow.queue_mode <> 'flow' THEN
    RAISE EXCEPTION 'flow "%" uses private step queues: its steps come only from compiling its complete definition',
      add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  v_reasons := pgflow.slug_violations(add_step.step_slug);
  IF pg_catalog.cardinality(v_reasons) > 0 THEN
    RAISE EXCEPTION 'invalid step slug % in flow "%": %',
      coalesce(pg_catalog.quote_literal(add_step.step_slug), 'NULL'), add_step.flow_slug, pg_catalog.array_to_string(v_reasons, ', ')
      USING ERRCODE = 'PF003',
            HINT = 'flow and step slugs use ASCII letters, digits and single inner underscores, start with a letter, at most 128 characters';
  END IF;
  SELECT s.step_slug INTO v_twin FROM pgflow.steps AS s
  WHERE s.flow_slug = add_step.flow_slug
    AND pg_catalog.lower(s.step_slug COLLATE "C") = pg_catalog.lower(add_step.step_slug COLLATE "C");
  IF FOUND THEN
    RAISE EXCEPTION 'step slug "%" differs only by letter case from step "%" of flow "%"', add_step.step_slug, v_twin, add_step.flow_slug
      USING ERRCODE = 'PF003', HINT = 'step slugs are unique ignoring case within a flow';
  END IF;
  IF add_step.step_type IS NULL OR add_step.step_type NOT IN ('single', 'map') THEN
    RAISE EXCEPTION 'step "%" of flow "%": step_type must be ''single'' or ''map'', not %',
      add_step.step_slug, add_step.flow_slug, coalesce(pg_catalog.quote_literal(add_step.step_type), 'NULL')
      USING ERRCODE = 'PF003';
  END IF;
  IF add_step.when_unmet IS NULL OR add_step.when_unmet NOT IN ('fail', 'skip', 'skip-cascade')
     OR add_step.when_exhausted IS NULL OR add_step.when_exhausted NOT IN ('fail', 'skip', 'skip-cascade') THEN
    RAISE EXCEPTION 'step "%" of flow "%": when_unmet and when_exhausted must be fail, skip or skip-cascade',
      add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  IF (add_step.required_input_pattern IS NOT NULL AND pg_catalog.jsonb_typeof(add_step.required_input_pattern) <> 'object')
     OR (add_step.forbidden_input_pattern IS NOT NULL AND pg_catalog.jsonb_typeof(add_step.forbidden_input_pattern) <> 'object') THEN
    RAISE EXCEPTION 'step "%" of flow "%": input patterns must be JSON objects', add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  IF add_step.max_attempts < 0 OR add_step.base_delay < 0 OR add_step.timeout <= 0 OR add_step.start_delay < 0 THEN
    RAISE EXCEPTION 'step "%" of flow "%": max_attempts, base_delay and start_delay must be >= 0, timeout > 0',
      add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;

  SELECT coalesce(pg_catalog.array_agg(DISTINCT d ORDER BY d), '{}')
  INTO v_deps
  FROM pg_catalog.unnest(coalesce(add_step.deps_slugs, '{}')) AS d;
  IF pg_catalog.array_position(v_deps, NULL) IS NOT NULL OR add_step.step_slug = ANY (v_deps) THEN
    RAISE EXCEPTION 'step "%" of flow "%" cannot depend on NULL or on itself', add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  SELECT pg_catalog.array_agg(d ORDER BY d) INTO v_missing
  FROM pg_catalog.unnest(v_deps) AS d
  WHERE NOT EXISTS (SELECT 1 FROM pgflow.steps AS s WHERE s.flow_slug = add_step.flow_slug AND s.step_slug = d);
  IF v_missing IS NOT NULL THEN
    RAISE EXCEPTION 'step "%" of flow "%" depends on unknown step(s): %',
      add_step.step_slug, add_step.flow_slug, pg_catalog.array_to_string(v_missing, ', ')
      USING ERRCODE = 'PF003', HINT = 'add dependencies before the steps that use them';
  END IF;
  IF add_step.step_type = 'map' AND pg_catalog.cardinality(v_deps) > 1 THEN
    RAISE EXCEPTION 'map step "%" of flow "%" has % dependencies; a map step takes at most one',
      add_step.step_slug, add_step.flow_slug, pg_catalog.cardinality(v_deps)
      USING ERRCODE = 'PF003';
  END IF;

  SELECT coalesce(pg_catalog.max(s.step_index) + 1, 0) INTO v_index
  FROM pgflow.steps AS s WHERE s.flow_slug = add_step.flow_slug;

  INSERT INTO pgflow.steps (
    flow_slug, step_slug, step_type, step_index, deps_count,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, queue_name)
  VALUES (
    add_step.flow_slug, add_step.step_slug, add_step.step_type, v_index, pg_catalog.cardinality(v_deps),
    add_step.max_attempts, add_step.base_delay, add_step.timeout, add_step.start_delay,
    add_step.required_input_pattern, add_step.forbidden_input_pattern, add_step.when_unmet, add_step.when_exhausted,
    pgflow.default_queue_name(add_step.flow_slug))
  RETURNING * INTO v_step;

  INSERT INTO pgflow.deps (flow_slug, dep_slug, step_slug)
  SELECT add_step.flow_slug, d, add_step.step_slug
  FROM pg_catalog.unnest(v_deps) AS d;

  RETURN v_step;
END;
$$;

-- Every problem of a startup shape that the database would reject, before anything changes, in
-- step order: slug rules, case-only and exact duplicates, step type, dependencies (must name an
-- earlier step; a map step takes at most one), whenUnmet/whenExhausted and option values.
CREATE FUNCTION pgflow._shape_problems(p_flow_slug text, p_shape jsonb)
RETURNS text[]
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$
  WITH steps AS (
    SELECT x.e, x.e ->> 'slug' AS slug, (x.n - 1)::integer AS idx,
           coalesce(pg_catalog.quote_literal(x.e ->> 'slug'), 'NULL') AS label
    FROM pg_catalog.jsonb_array_elements(p_shape -> 'steps') WITH ORDINALITY AS x (e, n)
  ), deps AS (
    SELECT s.idx, s.label, s.e ->> 'stepType' AS step_type, d.value AS dep
    FROM steps AS s
    CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(
      CASE WHEN pg_catalog.jsonb_typeof(s.e -> 'dependencies') = 'array' THEN s.e -> 'dependencies' ELSE '[]' END) AS d
  ), options AS (
    SELECT s.idx, s.label, o.key, o.value
    FROM steps AS s
    CROSS JOIN LATERAL pg_catalog.jsonb_each(
      CASE WHEN pg_catalog.jsonb_typeof(s.e -> 'options') = 'object' THEN s.e -> 'options' ELSE '{}' END) AS o
  ), problems AS (
    SELECT s.idx, 1 AS kind,
           pg_catalog.format('step %s (index %s): %s', s.label, s.idx,
                             pg_catalog.array_to_string(pgflow.slug_violations(s.slug), ', ')) AS problem
    FROM steps AS s
    WHERE pg_catalog.cardinality(pgflow.slug_violations(s.slug)) > 0
    UNION ALL
    SELECT b.idx, 2,
           CASE WHEN a.slug = b.slug
                THEN pg_catalog.format('step %s (index %s) is defined twice (also index %s)', b.label, b.idx, a.idx)
                ELSE pg_catalog.format('step %s (index %s) differs only by letter case from step %s (index %s)',
                                       b.label, b.idx, a.label, a.idx)
           END
    FROM steps AS a
    JOIN steps AS b ON a.idx < b.idx
                   AND pg_catalog.lower(a.slug COLLATE "C") = pg_catalog.lower(b.slug COLLATE "C")
    WHERE a.slug IS NOT NULL AND b.slug IS NOT NULL
    UNION ALL
    SELECT s.idx, 3, pg_catalog.format('step %s (index %s): stepType must be single or map, not %s',
                                       s.label, s.idx, s.e -> 'stepType')
    FROM steps AS s
    WHERE s.e ? 'stepType' AND (s.e ->> 'stepType') IS DISTINCT FROM 'single' AND (s.e ->> 'stepType') IS DISTINCT FROM 'map'
    UNION ALL
    SELECT s.idx, 4, pg_catalog.format('step %s (index %s): dependencies must be an array of step slugs', s.label, s.idx)
    FROM steps AS s
    WHERE s.e ? 'dependencies' AND pg_catalog.jsonb_typeof(s.e -> 'dependencies') <> 'array'
    UNION ALL
    SELECT d.idx, 5,
           CASE WHEN pg_catalog.jsonb_typeof(d.dep) <> 'string'
                  THEN pg_catalog.format('step %s (index %s): dependency %s is not a step slug', d.label, d.idx, d.dep)
                WHEN (d.dep #>> '{}') = (SELECT s.slug FROM steps AS s WHERE s.idx = d.idx)
                  THEN pg_catalog.format('step %s (index %s) depends on itself', d.label, d.idx)
                WHEN EXISTS (SELECT 1 FROM steps AS s WHERE s.slug = (d.dep #>> '{}'))
                  THEN pg_catalog.format('step %s (index %s) depends on %s, which is defined after it',
                                         d.label, d.idx, pg_catalog.quote_literal(d.dep #>> '{}'))
                ELSE pg_catalog.format('step %s (index %s) depends on unknown step %s',
                                       d.label, d.idx, pg_catalog.quote_literal(d.dep #>> '{}'))
           END
    FROM deps AS d
    WHERE pg_catalog.jsonb_typeof(d.dep) <> 'string'
       OR NOT EXISTS (SELECT 1 FROM steps AS s WHERE s.idx < d.idx AND s.slug = (d.dep #>> '{}'))
    UNION ALL
    SELECT d.idx, 6, pg_catalog.format('map step %s (index %s) has %s dependencies; a map step takes at most one',
                                       d.label, d.idx, pg_catalog.count(*))
    FROM deps AS d
    WHERE d.step_type = 'map'
    GROUP BY d.idx, d.label
    HAVING pg_catalog.count(*) > 1
    UNION ALL
    SELECT s.idx, 7, pg_catalog.format('step %s (index %s): %s must be fail, skip or skip-cascade, not %s',
                                       s.label, s.idx, w.key, s.e -> w.key)
    FROM steps AS s
    CROSS JOIN (VALUES ('whenUnmet'), ('whenExhausted')) AS w (key)
    WHERE s.e ? w.key AND coalesce(s.e ->> w.key, '') NOT IN ('fail', 'skip', 'skip-cascade')
    UNION ALL
    SELECT o.idx, 8, pg_catalog.format('step %s (index %s): option %s must be a whole number %s, not %s',
                                       o.label, o.idx, o.key,
                                       CASE o.key WHEN 'timeout' THEN 'of at least 1' ELSE 'of at least 0' END, o.value)
    FROM options AS o
    WHERE o.key IN ('maxAttempts', 'baseDelay', 'timeout', 'startDelay')
      AND o.value <> 'null'::jsonb
      AND (pg_catalog.jsonb_typeof(o.value) <> 'number'
           OR (o.value #>> '{}') !~ '^[0-9]+$'
           OR (o.key = 'timeout' AND (o.value #>> '{}')::numeric < 1))
  )
  SELECT coalesce(pg_catalog.array_agg(p.problem ORDER BY p.idx, p.kind, p.problem), '{}') FROM problems AS p
$$;

-- Protocol-1 startup (released baseline): refused. Workers must be upgraded together with the
-- database (spec "Startup compilation", "Development and release sequence").
CREATE OR REPLACE FUNCTION pgflow.ensure_flow_compiled(flow_slug text, shape jsonb)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
BEGIN
  RAISE EXCEPTION 'worker speaks pgflow protocol 1, database speaks protocol 2 (queue identity): startup of flow "%" refused before anything was compiled or registered',
    ensure_flow_compiled.flow_slug
    USING ERRCODE = 'PF002',
          DETAIL = 'the worker called ensure_flow_compiled(flow_slug, shape), the protocol-1 startup function',
          HINT = 'deploy workers from a release speaking protocol 2 (pgflow-cli with the queue-identity upgrade, database schema 0003); this is a coordinated package-and-database upgrade';
END;
$$;

-- Protocol-2 startup compilation. Validates the complete definition and derives its routes
-- before any change; then, under the flow locks: a missing flow is created ('compiled'); an
-- identical definition with identical routes is verified ('verified'); a different one is
-- recompiled only when is_local() ('recompiled'), otherwise refused ('mismatch', with
-- mismatchKind 'shape' or 'routing'). Production never deletes anything here.
CREATE FUNCTION pgflow.ensure_flow_compiled(
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
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', x.e ->> 'slug', 'queueName', v_queue) ORDER BY x.n), '[]'::jsonb)
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
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', s.step_slug, 'queueName', s.queue_name)
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

-- Whole-flow deletion: runtime rows, definition and the flow's own queues (with archives), in one
-- transaction. Lock order: flow locks -> runs -> step_states -> step_tasks -> queue tables, the
-- runtime-rows-before-queues order workers use, so deletion and workers cannot deadlock. Queue
-- tables are dropped whole; messages are not archived one by one first. A queue another flow
-- also uses (never the case for generated names) is kept, with only this flow's live messages
-- archived.
CREATE OR REPLACE FUNCTION pgflow.delete_flow_and_data(p_flow_slug text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_mode text;
  v_queues text[];
  v_shared text[];
  v_queue text;
  v_listed text;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(p_flow_slug COLLATE "C")));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(p_flow_slug));

  SELECT f.queue_mode INTO v_mode FROM pgflow.flows AS f WHERE f.flow_slug = p_flow_slug;

  PERFORM 1 FROM pgflow.runs AS r WHERE r.flow_slug = p_flow_slug ORDER BY r.run_id FOR UPDATE;
  PERFORM 1 FROM pgflow.step_states AS ss WHERE ss.flow_slug = p_flow_slug
    ORDER BY ss.run_id, ss.step_slug FOR UPDATE;
  PERFORM 1 FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug
    ORDER BY t.run_id, t.step_slug, t.task_index FOR UPDATE;

  SELECT pg_catalog.array_agg(DISTINCT q.queue_name ORDER BY q.queue_name) INTO v_queues
  FROM (
    SELECT s.queue_name FROM pgflow.steps AS s WHERE s.flow_slug = p_flow_slug
    UNION
    SELECT pg_catalog.lower(p_flow_slug COLLATE "C") WHERE v_mode = 'flow'
    UNION
    SELECT t.queue_name FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug
  ) AS q;

  SELECT pg_catalog.array_agg(q ORDER BY q) INTO v_shared
  FROM pg_catalog.unnest(coalesce(v_queues, '{}')) AS q
  WHERE EXISTS (SELECT 1 FROM pgflow.steps AS s WHERE s.queue_name = q AND s.flow_slug <> p_flow_slug)
     OR EXISTS (SELECT 1 FROM pgflow.step_tasks AS t WHERE t.queue_name = q AND t.flow_slug <> p_flow_slug)
     OR EXISTS (SELECT 1 FROM pgflow.flows AS f
                WHERE f.flow_slug <> p_flow_slug AND f.queue_mode = 'flow'
                  AND pg_catalog.lower(f.flow_slug COLLATE "C") = q);

  IF v_shared IS NOT NULL THEN
    SELECT pg_catalog.array_agg(t.run_id), pg_catalog.array_agg(t.step_slug), pg_catalog.array_agg(t.task_index)
    INTO v_run_ids, v_step_slugs, v_task_indexes
    FROM pgflow.step_tasks AS t
    WHERE t.flow_slug = p_flow_slug AND t.queue_name = ANY (v_shared)
      AND t.message_id IS NOT NULL AND t.status IN ('queued', 'started')
      AND pgflow._queue_exists(t.queue_name);
    PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);
  END IF;

  DELETE FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug;
  DELETE FROM pgflow.step_states AS ss WHERE ss.flow_slug = p_flow_slug;
  DELETE FROM pgflow.runs AS r WHERE r.flow_slug = p_flow_slug;

  FOREACH v_queue IN ARRAY coalesce(v_queues, '{}') LOOP
    CONTINUE WHEN v_queue = ANY (coalesce(v_shared, '{}'));
    v_listed := pgflow._listed_queue_name(v_queue);
    IF pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(v_queue, 'q'))) IS NOT NULL THEN
      PERFORM pgmq.drop_queue(v_listed);
    ELSE
      -- tables already gone: pgmq.drop_queue() would keep the meta row; remove our leftovers
      EXECUTE pg_catalog.format('DROP TABLE IF EXISTS pgmq.%I', pgmq.format_table_name(v_queue, 'a'));
      DELETE FROM pgmq.meta AS m WHERE m.queue_name = v_listed;
    END IF;
  END LOOP;

  DELETE FROM pgflow.deps AS d WHERE d.flow_slug = p_flow_slug;
  DELETE FROM pgflow.steps AS s WHERE s.flow_slug = p_flow_slug;
  DELETE FROM pgflow.flows AS f WHERE f.flow_slug = p_flow_slug;
END;
$$;

------------------------------------------------------------------------------------------------
-- Runtime: send to the persisted route, snapshot it on the task
------------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgflow.start_ready_steps(run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow text;
  v_started text[];
  v_step text;
  v_tasks integer;
  v_delay integer;
  v_queue text;
  v_state pgflow.step_states;
BEGIN
  SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r
  WHERE r.run_id = start_ready_steps.run_id AND r.status = 'started';
  IF v_flow IS NULL THEN
    RETURN;
  END IF;

  WITH ready AS (
    SELECT ss.step_slug
    FROM pgflow.step_states AS ss
    WHERE ss.run_id = start_ready_steps.run_id
      AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks > 0
    ORDER BY ss.step_slug
    FOR UPDATE
  ), started AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'started', started_at = pg_catalog.now(), remaining_tasks = ss.initial_tasks
      FROM ready
     WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = ready.step_slug
    RETURNING ss.step_slug
  )
  SELECT pg_catalog.array_agg(s.step_slug ORDER BY s.step_slug) INTO v_started FROM started AS s;

  IF v_started IS NULL THEN
    RETURN;
  END IF;

  FOREACH v_step IN ARRAY v_started LOOP
    SELECT ss.initial_tasks, coalesce(s.opt_start_delay, 0), s.queue_name
    INTO v_tasks, v_delay, v_queue
    FROM pgflow.step_states AS ss
    JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
    WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;

    INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    SELECT v_flow, start_ready_steps.run_id, v_step, (m.n - 1)::integer, v_queue, m.msg_id
    FROM pgmq.send_batch(
           v_queue,
           ARRAY(SELECT pg_catalog.jsonb_build_object('flow_slug', v_flow,
                                                      'run_id', start_ready_steps.run_id,
                                                      'step_slug', v_step,
                                                      'task_index', g.i)
                 FROM pg_catalog.generate_series(0, v_tasks - 1) AS g (i)
                 ORDER BY g.i),
           v_delay) WITH ORDINALITY AS m (msg_id, n);

    SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
    WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;
    PERFORM pgflow._broadcast_step(v_state);
  END LOOP;
END;
$$;

-- Protocol-1 claim: refused (a task is addressed by (queue_name, message_id) now).
CREATE OR REPLACE FUNCTION pgflow.start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid)
RETURNS SETOF pgflow.step_task_record
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
BEGIN
  RAISE EXCEPTION 'worker % speaks pgflow protocol 1 (start_tasks), database speaks protocol 2: nothing was claimed',
    start_tasks.worker_id
    USING ERRCODE = 'PF002',
          HINT = 'stop this worker and deploy one speaking protocol 2 (it claims with pgflow.claim_tasks)';
END;
$$;

--@include migrations/0003/claim.sql

CREATE OR REPLACE FUNCTION pgflow.poll_for_tasks(
  queue_name text,
  vt integer,
  qty integer,
  max_poll_seconds integer DEFAULT 5,
  poll_interval_ms integer DEFAULT 100
)
RETURNS SETOF pgflow.step_task_record
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  RAISE NOTICE 'pgflow.poll_for_tasks() is deprecated and returns nothing: read with pgmq.read_with_poll() and claim with pgflow.claim_tasks() (protocol 2)';
  RETURN;
END;
$$;

------------------------------------------------------------------------------------------------
-- Workers
------------------------------------------------------------------------------------------------

-- Registration now also checks the route: a worker of a concrete flow polls exactly that flow's
-- queue (PF004 otherwise), so coverage can trust worker rows.
CREATE OR REPLACE FUNCTION pgflow.register_worker(
  worker_id uuid,
  function_name text,
  queue_name text,
  flow_slug text,
  step_slug text DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_enabled boolean;
  v_mode text;
  v_route text;
BEGIN
  IF register_worker.worker_id IS NULL OR register_worker.function_name IS NULL OR register_worker.queue_name IS NULL THEN
    RAISE EXCEPTION 'register_worker(): worker_id, function_name and queue_name are required' USING ERRCODE = '22004';
  END IF;

  IF register_worker.flow_slug IS NOT NULL THEN
    SELECT f.queue_mode INTO v_mode FROM pgflow.flows AS f WHERE f.flow_slug = register_worker.flow_slug;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'worker % names flow "%", which does not exist', register_worker.worker_id, register_worker.flow_slug
        USING ERRCODE = 'PF006', HINT = 'workers compile their flow (ensure_flow_compiled) before registering';
    END IF;
    IF v_mode = 'flow' THEN
      v_route := pg_catalog.lower(register_worker.flow_slug COLLATE "C");
      IF register_worker.step_slug IS NOT NULL THEN
        RAISE EXCEPTION 'worker % selects step "%" of flow "%", which has no private step queues',
          register_worker.worker_id, register_worker.step_slug, register_worker.flow_slug
          USING ERRCODE = 'PF004', HINT = 'start a whole-flow worker (no step) for a plain flow';
      END IF;
    ELSE
      SELECT s.queue_name INTO v_route FROM pgflow.steps AS s
      WHERE s.flow_slug = register_worker.flow_slug AND s.step_slug = register_worker.step_slug;
      IF v_route IS NULL THEN
        RAISE EXCEPTION 'worker % of step-queued flow "%" must select one of its steps (got %)',
          register_worker.worker_id, register_worker.flow_slug, coalesce(pg_catalog.quote_literal(register_worker.step_slug), 'none')
          USING ERRCODE = 'PF004';
      END IF;
    END IF;
    IF register_worker.queue_name IS DISTINCT FROM v_route THEN
      RAISE EXCEPTION 'worker % would poll queue "%", but the route of flow "%"% is queue "%"',
        register_worker.worker_id, register_worker.queue_name, register_worker.flow_slug,
        coalesce(' step "' || register_worker.step_slug || '"', ''), v_route
        USING ERRCODE = 'PF004', HINT = 'worker and database must derive the same queue names: upgrade them together';
    END IF;
  END IF;

  INSERT INTO pgflow.worker_functions AS wf (function_name, updated_at)
  VALUES (register_worker.function_name, pg_catalog.clock_timestamp())
  ON CONFLICT (function_name) DO UPDATE SET updated_at = pg_catalog.clock_timestamp()
  RETURNING wf.enabled INTO v_enabled;

  IF NOT v_enabled THEN
    RAISE EXCEPTION 'worker function "%" is disabled (pgflow.worker_functions.enabled = false): worker % may not register',
      register_worker.function_name, register_worker.worker_id
      USING ERRCODE = 'PF001',
            HINT = 'a rollout fence or a fatal claim paused this function (see worker_functions.paused_reason); enable it again when the rollout is done (docs/upgrade.md step 7) or once the cause is fixed (docs/claim-protocol.md)';
  END IF;

  INSERT INTO pgflow.workers (worker_id, queue_name, function_name, flow_slug, step_slug, started_at, last_heartbeat_at)
  VALUES (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
          register_worker.flow_slug, register_worker.step_slug, pg_catalog.now(), pg_catalog.clock_timestamp());
END;
$$;

-- Enabling a function again clears the reason a fatal claim recorded.
CREATE FUNCTION pgflow._clear_pause_on_enable()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = ''
AS $$
BEGIN
  NEW.paused_at := NULL;
  NEW.paused_reason := NULL;
  RETURN NEW;
END;
$$;
CREATE TRIGGER worker_functions_clear_pause
  BEFORE UPDATE OF enabled ON pgflow.worker_functions
  FOR EACH ROW WHEN (NEW.enabled AND NOT OLD.enabled)
  EXECUTE FUNCTION pgflow._clear_pause_on_enable();

------------------------------------------------------------------------------------------------
-- Optional pruning: upgraded in place when installed (spec "installed pruning functions have an
-- explicit upgrade path"); sql/optional/prune.sql is the same text for new installs.
------------------------------------------------------------------------------------------------

DO $upgrade_prune$
BEGIN
  IF pg_catalog.to_regprocedure('pgflow.prune_data_older_than(interval)') IS NOT NULL THEN
    EXECUTE $prune_sql$
--@include optional/prune.sql
$prune_sql$;
  END IF;
END
$upgrade_prune$;

-- Roles that could run the protocol-1 entry points get the protocol-2 ones and the new functions
-- they call, so the upgrade takes no right away from an existing worker role (docs/permissions.md).
-- Nobody else gets anything.
DO $grants$
DECLARE
  v_role text;
BEGIN
  FOR v_role IN
    SELECT r.rolname FROM pg_catalog.pg_roles AS r
    WHERE NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_'
      AND (pg_catalog.has_function_privilege(r.oid, 'pgflow.start_tasks(text, bigint[], uuid)', 'EXECUTE')
           OR pg_catalog.has_function_privilege(r.oid, 'pgflow.ensure_flow_compiled(text, jsonb)', 'EXECUTE'))
    ORDER BY r.rolname
  LOOP
    EXECUTE pg_catalog.format(
      'GRANT EXECUTE ON FUNCTION pgflow.claim_tasks(text, bigint[], uuid, text, text),
                                 pgflow.ensure_flow_compiled(text, jsonb, integer, text, jsonb),
                                 pgflow.is_valid_queue_name(text), pgflow.slug_violations(text),
                                 pgflow.default_queue_name(text), pgflow.step_queue_name(text, text, integer),
                                 pgflow._listed_queue_name(text), pgflow._queue_exists(text),
                                 pgflow._assert_queue_unclaimed(text, text), pgflow._shape_problems(text, jsonb)
       TO %I', v_role);
  END LOOP;
END
$grants$;

-- Nothing in pgflow is reachable by PUBLIC (docs/permissions.md).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgflow FROM PUBLIC;
