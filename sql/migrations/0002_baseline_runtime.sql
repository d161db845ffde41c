-- 0002 baseline runtime: the released pgflow runtime (0.16.0 semantics, with the 0.15.1
-- correctness fixes) on top of the 0001 tables. This is the state an upgrade starts from.
--
-- In this baseline a task's PGMQ queue is its flow slug. Every message mutation after the
-- initial send goes through two helpers, _archive_task_messages and _set_task_messages_vt
-- (docs/architecture.md "Queue operations go through two helpers"); the queue-identity
-- migration replaces the helpers, start_ready_steps, start_tasks and the definition
-- functions, and nothing else needs a second copy.
--
-- Conventions:
--   * every function runs with search_path = '' and qualifies every name;
--   * plpgsql functions whose parameters share a name with a column use
--     "#variable_conflict use_column" and refer to a parameter as <function>.<parameter>;
--   * errors use the PF SQLSTATEs of docs/architecture.md;
--   * realtime, pg_net, vault and pg_cron are optional: they are reached only after a catalog
--     check, so nothing in the core needs them.
--
-- Lock order (the same everywhere, so workers, recovery, definition changes and deletion
-- cannot deadlock; docs/runtime.md explains it):
--   flow advisory lock (1, hashtext(flow_slug))   definition changes, start_flow (shared), deletion
--   -> runs row                                    complete_task, fail_task (FOR UPDATE), start_tasks
--                                                  (FOR SHARE), deletion, pruning
--   -> step_states rows                            by (run_id, step_slug)
--   -> step_tasks rows                             UPDATE ... RETURNING, or FOR UPDATE [SKIP LOCKED]
--                                                  (recovery never waits: SKIP LOCKED)
--   -> PGMQ queue rows / tables                    only through the two helpers (or drop_queue)

------------------------------------------------------------------------------------------------
-- Utilities
------------------------------------------------------------------------------------------------

-- True only when the database (or session) setting pgflow.environment is 'local'. Unset means
-- production, the safe default.
CREATE FUNCTION pgflow.is_local()
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT coalesce(pg_catalog.current_setting('pgflow.environment', true), '') = 'local'
$$;

-- Delay before the next attempt. attempts_count has already been incremented by the claim, so
-- the first retry waits 2 * base_delay, the second 4 * base_delay, and so on.
CREATE FUNCTION pgflow.calculate_retry_delay(base_delay numeric, attempts_count integer)
RETURNS integer
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$
  SELECT pg_catalog.floor(base_delay * pg_catalog.power(2::numeric, attempts_count::numeric))::integer
$$;

-- Sends one realtime broadcast when realtime.send(jsonb, text, text, boolean) exists
-- (Supabase); does nothing anywhere else.
CREATE FUNCTION pgflow._broadcast(payload jsonb, event text, topic text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NULL THEN
    RETURN;
  END IF;
  PERFORM realtime.send(payload, event, topic, false);
END;
$$;

-- Broadcast of a run transition; the event is derived from the row's status.
CREATE FUNCTION pgflow._broadcast_run(p_run pgflow.runs, p_error_message text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_payload jsonb;
BEGIN
  IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NULL THEN
    RETURN;
  END IF;
  v_payload := pg_catalog.jsonb_build_object(
    'event_type', 'run:' || p_run.status,
    'run_id', p_run.run_id,
    'flow_slug', p_run.flow_slug,
    'status', p_run.status,
    'remaining_steps', p_run.remaining_steps,
    'started_at', p_run.started_at);
  IF p_run.status = 'started' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('input', p_run.input);
  ELSIF p_run.status = 'completed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('output', p_run.output, 'completed_at', p_run.completed_at);
  ELSIF p_run.status = 'failed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('error_message', p_error_message, 'failed_at', p_run.failed_at);
  END IF;
  PERFORM pgflow._broadcast(v_payload, 'run:' || p_run.status, 'pgflow:run:' || p_run.run_id::text);
END;
$$;

-- Broadcast of a step transition; the event is derived from the row's status.
CREATE FUNCTION pgflow._broadcast_step(p_state pgflow.step_states)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_payload jsonb;
BEGIN
  IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NULL THEN
    RETURN;
  END IF;
  v_payload := pg_catalog.jsonb_build_object(
    'event_type', 'step:' || p_state.status,
    'run_id', p_state.run_id,
    'flow_slug', p_state.flow_slug,
    'step_slug', p_state.step_slug,
    'status', p_state.status,
    'started_at', p_state.started_at,
    'remaining_tasks', p_state.remaining_tasks,
    'remaining_deps', p_state.remaining_deps);
  IF p_state.status = 'completed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('output', p_state.output, 'completed_at', p_state.completed_at);
  ELSIF p_state.status = 'failed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('error_message', p_state.error_message, 'failed_at', p_state.failed_at);
  ELSIF p_state.status = 'skipped' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('skip_reason', p_state.skip_reason, 'skipped_at', p_state.skipped_at);
  END IF;
  PERFORM pgflow._broadcast(v_payload,
                            'step:' || p_state.step_slug || ':' || p_state.status,
                            'pgflow:run:' || p_state.run_id::text);
END;
$$;

------------------------------------------------------------------------------------------------
-- Queue helpers: the only place where the runtime changes an existing message.
-- Baseline rule: a task's queue is its flow slug (step_tasks.flow_slug = runs.flow_slug).
-- Callers update step_tasks first and call a helper afterwards (task rows before queue rows).
------------------------------------------------------------------------------------------------

-- Archives the messages of the given tasks (matched by position in the three arrays), one
-- pgmq.archive call per queue. Tasks without a message, unknown tasks and messages that are
-- already gone are skipped, so the call is idempotent. Returns how many messages it archived.
CREATE FUNCTION pgflow._archive_task_messages(
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
    SELECT t.flow_slug,
           pg_catalog.array_agg(DISTINCT t.message_id ORDER BY t.message_id)
    FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes)) AS k (run_id, step_slug, task_index)
    JOIN pgflow.step_tasks AS t
      ON t.run_id = k.run_id AND t.step_slug = k.step_slug AND t.task_index = k.task_index
    WHERE t.message_id IS NOT NULL
    GROUP BY t.flow_slug
    ORDER BY t.flow_slug
  LOOP
    SELECT pg_catalog.count(*)::integer INTO v_count FROM pgmq.archive(v_queue, v_msg_ids);
    v_total := v_total + v_count;
  END LOOP;
  RETURN v_total;
END;
$$;

-- Sets vt = clock_timestamp() + offset seconds on the messages of the given tasks (matched by
-- position in the four arrays), one UPDATE per queue. Returns how many messages it found and
-- changed; a caller that needs every message (start_tasks) compares that with its own count.
CREATE FUNCTION pgflow._set_task_messages_vt(
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
    SELECT t.flow_slug,
           pg_catalog.array_agg(t.message_id ORDER BY t.message_id),
           pg_catalog.array_agg(k.vt_offset ORDER BY t.message_id)
    FROM (
      SELECT DISTINCT ON (u.run_id, u.step_slug, u.task_index) u.run_id, u.step_slug, u.task_index, u.vt_offset
      FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes), pg_catalog.unnest(p_vt_offsets))
           AS u (run_id, step_slug, task_index, vt_offset)
      ORDER BY u.run_id, u.step_slug, u.task_index
    ) AS k
    JOIN pgflow.step_tasks AS t
      ON t.run_id = k.run_id AND t.step_slug = k.step_slug AND t.task_index = k.task_index
    WHERE t.message_id IS NOT NULL
    GROUP BY t.flow_slug
    ORDER BY t.flow_slug
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

-- Upstream-compatible batch visibility change on one queue (not used by the runtime itself,
-- which goes through _set_task_messages_vt). Returns the rows it changed.
CREATE FUNCTION pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets integer[])
RETURNS TABLE (msg_id bigint, read_ct integer, enqueued_at timestamptz, vt timestamptz, message jsonb, headers jsonb)
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  IF coalesce(pg_catalog.cardinality(set_vt_batch.msg_ids), 0) = 0
     OR coalesce(pg_catalog.cardinality(set_vt_batch.vt_offsets), 0) = 0 THEN
    RETURN;
  END IF;
  IF pg_catalog.cardinality(set_vt_batch.msg_ids) <> pg_catalog.cardinality(set_vt_batch.vt_offsets) THEN
    RAISE EXCEPTION 'set_vt_batch(): msg_ids has % elements but vt_offsets has %',
      pg_catalog.cardinality(set_vt_batch.msg_ids), pg_catalog.cardinality(set_vt_batch.vt_offsets)
      USING ERRCODE = '22023';
  END IF;
  RETURN QUERY EXECUTE pg_catalog.format(
    'UPDATE pgmq.%I AS q
        SET vt = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => v.vt_offset)
       FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::integer[])) AS v (msg_id, vt_offset)
      WHERE q.msg_id = v.msg_id
      RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.vt, q.message, q.headers',
    pgmq.format_table_name(set_vt_batch.queue_name, 'q'))
  USING set_vt_batch.msg_ids, set_vt_batch.vt_offsets;
END;
$$;

------------------------------------------------------------------------------------------------
-- Definitions
------------------------------------------------------------------------------------------------

-- Creates a flow (idempotent: an existing flow keeps its options) and its PGMQ queue, named
-- exactly like the flow, unless pgmq.meta already lists that exact name.
CREATE FUNCTION pgflow.create_flow(
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
  IF create_flow.max_attempts < 0 OR create_flow.base_delay < 0 OR create_flow.timeout <= 0 THEN
    RAISE EXCEPTION 'invalid options for flow "%": max_attempts and base_delay must be >= 0, timeout > 0',
      create_flow.flow_slug
      USING ERRCODE = 'PF003';
  END IF;

  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(create_flow.flow_slug));

  INSERT INTO pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout)
  VALUES (create_flow.flow_slug,
          coalesce(create_flow.max_attempts, 3),
          coalesce(create_flow.base_delay, 5),
          coalesce(create_flow.timeout, 60))
  ON CONFLICT (flow_slug) DO NOTHING;

  IF NOT EXISTS (SELECT 1 FROM pgmq.meta AS m WHERE m.queue_name = create_flow.flow_slug) THEN
    PERFORM pgmq.create(create_flow.flow_slug);
  END IF;

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = create_flow.flow_slug;
  RETURN v_flow;
END;
$$;

-- Adds a step to a flow (idempotent: an existing step is returned unchanged).
CREATE FUNCTION pgflow.add_step(
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
  v_deps text[];
  v_missing text[];
  v_index integer;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(add_step.flow_slug));

  IF NOT EXISTS (SELECT 1 FROM pgflow.flows AS f WHERE f.flow_slug = add_step.flow_slug) THEN
    RAISE EXCEPTION 'cannot add step "%": flow "%" does not exist', add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003', HINT = 'create the flow first with pgflow.create_flow()';
  END IF;

  SELECT s.* INTO v_step FROM pgflow.steps AS s
  WHERE s.flow_slug = add_step.flow_slug AND s.step_slug = add_step.step_slug;
  IF FOUND THEN
    RETURN v_step;
  END IF;

  IF NOT coalesce(pgflow.is_valid_slug(add_step.step_slug), false) THEN
    RAISE EXCEPTION 'invalid step slug % in flow "%": use letters, digits and underscores, not starting with a digit, at most 128 characters, not "run"',
      coalesce(pg_catalog.quote_literal(add_step.step_slug), 'NULL'), add_step.flow_slug
      USING ERRCODE = 'PF003';
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
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted)
  VALUES (
    add_step.flow_slug, add_step.step_slug, add_step.step_type, v_index, pg_catalog.cardinality(v_deps),
    add_step.max_attempts, add_step.base_delay, add_step.timeout, add_step.start_delay,
    add_step.required_input_pattern, add_step.forbidden_input_pattern, add_step.when_unmet, add_step.when_exhausted)
  RETURNING * INTO v_step;

  INSERT INTO pgflow.deps (flow_slug, dep_slug, step_slug)
  SELECT add_step.flow_slug, d, add_step.step_slug
  FROM pg_catalog.unnest(v_deps) AS d;

  RETURN v_step;
END;
$$;

-- The structural shape of a stored flow (options excluded), NULL when the flow does not exist.
CREATE FUNCTION pgflow._get_flow_shape(p_flow_slug text)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT pg_catalog.jsonb_build_object('steps', coalesce((
    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
             'slug', s.step_slug,
             'stepType', s.step_type,
             'dependencies', coalesce((
               SELECT pg_catalog.jsonb_agg(d.dep_slug ORDER BY d.dep_slug)
               FROM pgflow.deps AS d
               WHERE d.flow_slug = s.flow_slug AND d.step_slug = s.step_slug), '[]'::jsonb),
             'whenUnmet', s.when_unmet,
             'whenExhausted', s.when_exhausted,
             'requiredInputPattern', CASE WHEN s.required_input_pattern IS NULL
                                          THEN '{"defined": false}'::jsonb
                                          ELSE pg_catalog.jsonb_build_object('defined', true, 'value', s.required_input_pattern) END,
             'forbiddenInputPattern', CASE WHEN s.forbidden_input_pattern IS NULL
                                           THEN '{"defined": false}'::jsonb
                                           ELSE pg_catalog.jsonb_build_object('defined', true, 'value', s.forbidden_input_pattern) END)
           ORDER BY s.step_index)
    FROM pgflow.steps AS s
    WHERE s.flow_slug = p_flow_slug), '[]'::jsonb))
  FROM pgflow.flows AS f
  WHERE f.flow_slug = p_flow_slug
$$;

-- A pattern wrapper in comparable form: {"defined": false} or {"defined": true, "value": ...}.
CREATE FUNCTION pgflow._normalize_shape_pattern(p_wrapper jsonb)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$
  SELECT CASE
    WHEN p_wrapper IS NULL OR pg_catalog.jsonb_typeof(p_wrapper) <> 'object'
         OR NOT coalesce(p_wrapper -> 'defined' = 'true'::jsonb, false)
      THEN '{"defined": false}'::jsonb
    ELSE pg_catalog.jsonb_build_object('defined', true, 'value', p_wrapper -> 'value')
  END
$$;

-- Human-readable differences between a worker's shape (p_local) and the stored one (p_db).
-- Options never count; missing fields compare as their defaults.
CREATE FUNCTION pgflow._compare_flow_shapes(p_local jsonb, p_db jsonb)
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = ''
AS $$
DECLARE
  v_local jsonb := coalesce(p_local -> 'steps', '[]'::jsonb);
  v_db jsonb := coalesce(p_db -> 'steps', '[]'::jsonb);
  v_diffs text[] := '{}';
  v_a jsonb;
  v_b jsonb;
  v_slug text;
  v_deps_a jsonb;
  v_deps_b jsonb;
  v_pat_a jsonb;
  v_pat_b jsonb;
  i integer;
BEGIN
  IF pg_catalog.jsonb_typeof(v_local) <> 'array' OR pg_catalog.jsonb_typeof(v_db) <> 'array' THEN
    RAISE EXCEPTION '_compare_flow_shapes(): "steps" must be a JSON array' USING ERRCODE = 'PF003';
  END IF;
  IF pg_catalog.jsonb_array_length(v_local) <> pg_catalog.jsonb_array_length(v_db) THEN
    v_diffs := v_diffs || pg_catalog.format('step count differs: worker defines %s, database has %s',
                                            pg_catalog.jsonb_array_length(v_local), pg_catalog.jsonb_array_length(v_db));
  END IF;
  FOR i IN 0 .. GREATEST(pg_catalog.jsonb_array_length(v_local), pg_catalog.jsonb_array_length(v_db)) - 1 LOOP
    v_a := v_local -> i;
    v_b := v_db -> i;
    IF v_b IS NULL THEN
      v_diffs := v_diffs || pg_catalog.format('step %s: "%s" is defined by the worker but missing in the database', i, v_a ->> 'slug');
      CONTINUE;
    END IF;
    IF v_a IS NULL THEN
      v_diffs := v_diffs || pg_catalog.format('step %s: "%s" exists in the database but not in the worker definition', i, v_b ->> 'slug');
      CONTINUE;
    END IF;
    v_slug := v_b ->> 'slug';
    IF (v_a ->> 'slug') IS DISTINCT FROM v_slug THEN
      v_diffs := v_diffs || pg_catalog.format('step %s: slug differs: worker "%s", database "%s"', i, v_a ->> 'slug', v_slug);
    END IF;
    IF coalesce(v_a ->> 'stepType', 'single') IS DISTINCT FROM coalesce(v_b ->> 'stepType', 'single') THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): step type differs: worker %s, database %s', i, v_slug,
                                              coalesce(v_a ->> 'stepType', 'single'), coalesce(v_b ->> 'stepType', 'single'));
    END IF;
    SELECT coalesce(pg_catalog.jsonb_agg(x ORDER BY x), '[]'::jsonb) INTO v_deps_a
    FROM pg_catalog.jsonb_array_elements_text(coalesce(v_a -> 'dependencies', '[]'::jsonb)) AS x;
    SELECT coalesce(pg_catalog.jsonb_agg(x ORDER BY x), '[]'::jsonb) INTO v_deps_b
    FROM pg_catalog.jsonb_array_elements_text(coalesce(v_b -> 'dependencies', '[]'::jsonb)) AS x;
    IF v_deps_a IS DISTINCT FROM v_deps_b THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): dependencies differ: worker %s, database %s', i, v_slug, v_deps_a, v_deps_b);
    END IF;
    IF coalesce(v_a ->> 'whenUnmet', 'skip') IS DISTINCT FROM coalesce(v_b ->> 'whenUnmet', 'skip') THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): whenUnmet differs: worker %s, database %s', i, v_slug,
                                              coalesce(v_a ->> 'whenUnmet', 'skip'), coalesce(v_b ->> 'whenUnmet', 'skip'));
    END IF;
    IF coalesce(v_a ->> 'whenExhausted', 'fail') IS DISTINCT FROM coalesce(v_b ->> 'whenExhausted', 'fail') THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): whenExhausted differs: worker %s, database %s', i, v_slug,
                                              coalesce(v_a ->> 'whenExhausted', 'fail'), coalesce(v_b ->> 'whenExhausted', 'fail'));
    END IF;
    v_pat_a := pgflow._normalize_shape_pattern(v_a -> 'requiredInputPattern');
    v_pat_b := pgflow._normalize_shape_pattern(v_b -> 'requiredInputPattern');
    IF v_pat_a IS DISTINCT FROM v_pat_b THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): requiredInputPattern (if) differs: worker %s, database %s', i, v_slug, v_pat_a, v_pat_b);
    END IF;
    v_pat_a := pgflow._normalize_shape_pattern(v_a -> 'forbiddenInputPattern');
    v_pat_b := pgflow._normalize_shape_pattern(v_b -> 'forbiddenInputPattern');
    IF v_pat_a IS DISTINCT FROM v_pat_b THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): forbiddenInputPattern (ifNot) differs: worker %s, database %s', i, v_slug, v_pat_a, v_pat_b);
    END IF;
  END LOOP;
  RETURN v_diffs;
END;
$$;

-- Creates a flow and its steps from a worker's shape: create_flow + add_step per step, in order.
CREATE FUNCTION pgflow._create_flow_from_shape(p_flow_slug text, p_shape jsonb)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_step jsonb;
  v_opts jsonb;
  v_deps text[];
BEGIN
  IF p_shape IS NULL OR pg_catalog.jsonb_typeof(p_shape) <> 'object'
     OR pg_catalog.jsonb_typeof(p_shape -> 'steps') IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'flow "%": the shape must be a JSON object with a "steps" array', p_flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  v_opts := coalesce(p_shape -> 'options', '{}'::jsonb);
  PERFORM pgflow.create_flow(
    p_flow_slug,
    max_attempts => (v_opts ->> 'maxAttempts')::integer,
    base_delay => (v_opts ->> 'baseDelay')::integer,
    timeout => (v_opts ->> 'timeout')::integer);

  FOR v_step IN SELECT e FROM pg_catalog.jsonb_array_elements(p_shape -> 'steps') WITH ORDINALITY AS x (e, n) ORDER BY n LOOP
    IF pg_catalog.jsonb_typeof(v_step) <> 'object' OR pg_catalog.jsonb_typeof(v_step -> 'slug') IS DISTINCT FROM 'string' THEN
      RAISE EXCEPTION 'flow "%": every shape step must be an object with a string "slug"', p_flow_slug
        USING ERRCODE = 'PF003';
    END IF;
    v_opts := coalesce(v_step -> 'options', '{}'::jsonb);
    SELECT coalesce(pg_catalog.array_agg(d), '{}') INTO v_deps
    FROM pg_catalog.jsonb_array_elements_text(coalesce(v_step -> 'dependencies', '[]'::jsonb)) AS d;
    PERFORM pgflow.add_step(
      flow_slug => p_flow_slug,
      step_slug => v_step ->> 'slug',
      deps_slugs => v_deps,
      max_attempts => (v_opts ->> 'maxAttempts')::integer,
      base_delay => (v_opts ->> 'baseDelay')::integer,
      timeout => (v_opts ->> 'timeout')::integer,
      start_delay => (v_opts ->> 'startDelay')::integer,
      step_type => coalesce(v_step ->> 'stepType', 'single'),
      required_input_pattern => CASE WHEN v_step -> 'requiredInputPattern' -> 'defined' = 'true'::jsonb
                                     THEN v_step -> 'requiredInputPattern' -> 'value' END,
      forbidden_input_pattern => CASE WHEN v_step -> 'forbiddenInputPattern' -> 'defined' = 'true'::jsonb
                                      THEN v_step -> 'forbiddenInputPattern' -> 'value' END,
      when_unmet => coalesce(v_step ->> 'whenUnmet', 'skip'),
      when_exhausted => coalesce(v_step ->> 'whenExhausted', 'fail'));
  END LOOP;
END;
$$;

-- Deletes a flow with all its runtime data and drops its queue, in one transaction.
-- Lock order: flow advisory lock -> runs -> step_states -> step_tasks (locked, then deleted)
-- -> queue tables (drop_queue) -> deps, steps, flows. Workers that hold task rows finish
-- first; a worker that later touches the dropped queue gets an error, never half a flow.
-- The queue is dropped only when pgmq.meta lists exactly this name and no other spelling of
-- it (a case alias shares the same physical table); otherwise the flow's live messages are
-- archived and the queue is left alone. workers and worker_functions are not touched.
CREATE FUNCTION pgflow.delete_flow_and_data(p_flow_slug text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_drop boolean;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(p_flow_slug));

  PERFORM 1 FROM pgflow.runs AS r WHERE r.flow_slug = p_flow_slug ORDER BY r.run_id FOR UPDATE;
  PERFORM 1 FROM pgflow.step_states AS ss WHERE ss.flow_slug = p_flow_slug
    ORDER BY ss.run_id, ss.step_slug FOR UPDATE;
  PERFORM 1 FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug
    ORDER BY t.run_id, t.step_slug, t.task_index FOR UPDATE;

  v_drop := EXISTS (SELECT 1 FROM pgmq.meta AS m WHERE m.queue_name = p_flow_slug)
            AND NOT EXISTS (SELECT 1 FROM pgmq.meta AS m
                            WHERE pg_catalog.lower(m.queue_name) = pg_catalog.lower(p_flow_slug)
                              AND m.queue_name <> p_flow_slug)
            AND NOT EXISTS (SELECT 1 FROM pgflow.flows AS f
                            WHERE pg_catalog.lower(f.flow_slug) = pg_catalog.lower(p_flow_slug)
                              AND f.flow_slug <> p_flow_slug);

  IF NOT v_drop AND pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(p_flow_slug, 'q'))) IS NOT NULL THEN
    SELECT pg_catalog.array_agg(t.run_id), pg_catalog.array_agg(t.step_slug), pg_catalog.array_agg(t.task_index)
    INTO v_run_ids, v_step_slugs, v_task_indexes
    FROM pgflow.step_tasks AS t
    WHERE t.flow_slug = p_flow_slug AND t.message_id IS NOT NULL AND t.status IN ('queued', 'started');
    PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);
  END IF;

  DELETE FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug;
  DELETE FROM pgflow.step_states AS ss WHERE ss.flow_slug = p_flow_slug;
  DELETE FROM pgflow.runs AS r WHERE r.flow_slug = p_flow_slug;

  IF v_drop THEN
    PERFORM pgmq.drop_queue(p_flow_slug);
  END IF;

  DELETE FROM pgflow.deps AS d WHERE d.flow_slug = p_flow_slug;
  DELETE FROM pgflow.steps AS s WHERE s.flow_slug = p_flow_slug;
  DELETE FROM pgflow.flows AS f WHERE f.flow_slug = p_flow_slug;
END;
$$;

-- Worker startup compilation (the only compiler since 0.16.0). Under the flow lock:
--   missing flow            -> create it from the shape            -> {"status": "compiled"}
--   same shape              -> nothing                             -> {"status": "verified"}
--   different, is_local()   -> delete_flow_and_data + recreate     -> {"status": "recompiled"}
--   different, production   -> nothing (never deletes)             -> {"status": "mismatch"}
-- Every result has a "differences" array (worker vs database).
CREATE FUNCTION pgflow.ensure_flow_compiled(flow_slug text, shape jsonb)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
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

------------------------------------------------------------------------------------------------
-- Runtime: internal transitions (callers hold the run row lock)
------------------------------------------------------------------------------------------------

-- Fails a started run because of p_step_slug: the step becomes failed, the run failed, every
-- queued/started task of the run cancelled, and the messages of the cancelled tasks and of the
-- step's failed task(s) archived, all in the caller's transaction. A run that is no longer
-- started is left alone (no second terminal transition, no duplicate event). Returns whether
-- it failed the run.
CREATE FUNCTION pgflow._fail_run(p_run_id uuid, p_step_slug text, p_error_message text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  UPDATE pgflow.runs AS r
     SET status = 'failed', failed_at = pg_catalog.now()
   WHERE r.run_id = p_run_id AND r.status = 'started'
  RETURNING r.* INTO v_run;
  IF v_run.run_id IS NULL THEN
    RETURN false;
  END IF;

  UPDATE pgflow.step_states AS ss
     SET status = 'failed', failed_at = pg_catalog.now(), error_message = p_error_message
   WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug AND ss.status IN ('created', 'started')
  RETURNING ss.* INTO v_state;

  WITH cancelled AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'cancelled'
     WHERE t.run_id = p_run_id AND t.status IN ('queued', 'started')
    RETURNING t.run_id, t.step_slug, t.task_index
  ), culprits AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.status = 'failed'
  ), keys AS (
    SELECT * FROM cancelled UNION ALL SELECT * FROM culprits
  )
  SELECT pg_catalog.array_agg(k.run_id), pg_catalog.array_agg(k.step_slug), pg_catalog.array_agg(k.task_index)
  INTO v_run_ids, v_step_slugs, v_task_indexes
  FROM keys AS k;

  PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

  IF v_state.run_id IS NOT NULL THEN
    PERFORM pgflow._broadcast_step(v_state);
  END IF;
  PERFORM pgflow._broadcast_run(v_run, p_error_message);
  RETURN true;
END;
$$;

-- Releases the children of a step that just finished without producing tasks for them to wait
-- on (skipped): remaining_deps - 1, and a map child that does not know its size yet gets 0
-- tasks (its only dependency produced nothing).
CREATE FUNCTION pgflow._release_children_of_skipped(p_run_id uuid, p_flow_slug text, p_step_slug text)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  UPDATE pgflow.step_states AS cs
     SET remaining_deps = cs.remaining_deps - 1,
         initial_tasks = CASE WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN 0 ELSE cs.initial_tasks END
    FROM pgflow.deps AS d
    JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
   WHERE d.flow_slug = p_flow_slug AND d.dep_slug = p_step_slug
     AND cs.run_id = p_run_id AND cs.step_slug = d.step_slug AND cs.status = 'created';
$$;

-- Skips one created/started step (plain skip): the step's queued/started tasks become skipped
-- and their messages are archived, the run has one step less to wait for, the children are
-- released. Returns false (and changes nothing) when the step is already terminal.
CREATE FUNCTION pgflow._skip_step(p_run_id uuid, p_step_slug text, p_skip_reason text, p_error_message text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_state pgflow.step_states;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  UPDATE pgflow.step_states AS ss
     SET status = 'skipped', skip_reason = p_skip_reason, skipped_at = pg_catalog.now(),
         remaining_tasks = NULL, error_message = coalesce(p_error_message, ss.error_message)
   WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug AND ss.status IN ('created', 'started')
  RETURNING ss.* INTO v_state;
  IF v_state.run_id IS NULL THEN
    RETURN false;
  END IF;

  WITH skipped AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'skipped'
     WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.status IN ('queued', 'started')
    RETURNING t.run_id, t.step_slug, t.task_index
  )
  SELECT pg_catalog.array_agg(k.run_id), pg_catalog.array_agg(k.step_slug), pg_catalog.array_agg(k.task_index)
  INTO v_run_ids, v_step_slugs, v_task_indexes
  FROM skipped AS k;
  PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

  UPDATE pgflow.runs AS r SET remaining_steps = r.remaining_steps - 1 WHERE r.run_id = p_run_id;
  PERFORM pgflow._release_children_of_skipped(p_run_id, v_state.flow_slug, p_step_slug);
  PERFORM pgflow._broadcast_step(v_state);
  RETURN true;
END;
$$;

-- Skips a step and every step below it in the DAG. The step keeps p_skip_reason, its
-- descendants get 'dependency_skipped'. Only created/started steps change; their queued/started
-- tasks become skipped and their messages are archived; the run's remaining_steps drops by the
-- number of steps skipped. Returns that number.
CREATE FUNCTION pgflow._cascade_force_skip_steps(run_id uuid, step_slug text, skip_reason text)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow text;
  v_skipped text[];
  v_state pgflow.step_states;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r WHERE r.run_id = _cascade_force_skip_steps.run_id;
  IF v_flow IS NULL THEN
    RETURN 0;
  END IF;

  WITH RECURSIVE below (step_slug) AS (
    SELECT _cascade_force_skip_steps.step_slug
    UNION
    SELECT d.step_slug
    FROM pgflow.deps AS d
    JOIN below AS b ON d.dep_slug = b.step_slug
    WHERE d.flow_slug = v_flow
  ), skipped AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'skipped',
           skip_reason = CASE WHEN ss.step_slug = _cascade_force_skip_steps.step_slug
                              THEN _cascade_force_skip_steps.skip_reason ELSE 'dependency_skipped' END,
           skipped_at = pg_catalog.now(),
           remaining_tasks = NULL
     WHERE ss.run_id = _cascade_force_skip_steps.run_id
       AND ss.step_slug IN (SELECT b.step_slug FROM below AS b)
       AND ss.status IN ('created', 'started')
    RETURNING ss.step_slug
  )
  SELECT pg_catalog.array_agg(s.step_slug ORDER BY s.step_slug) INTO v_skipped FROM skipped AS s;

  IF v_skipped IS NULL THEN
    RETURN 0;
  END IF;

  WITH skipped_tasks AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'skipped'
     WHERE t.run_id = _cascade_force_skip_steps.run_id
       AND t.step_slug = ANY (v_skipped)
       AND t.status IN ('queued', 'started')
    RETURNING t.run_id, t.step_slug, t.task_index
  )
  SELECT pg_catalog.array_agg(k.run_id), pg_catalog.array_agg(k.step_slug), pg_catalog.array_agg(k.task_index)
  INTO v_run_ids, v_step_slugs, v_task_indexes
  FROM skipped_tasks AS k;
  PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

  UPDATE pgflow.runs AS r
     SET remaining_steps = r.remaining_steps - pg_catalog.cardinality(v_skipped)
   WHERE r.run_id = _cascade_force_skip_steps.run_id;

  FOR v_state IN
    SELECT ss.* FROM pgflow.step_states AS ss
    WHERE ss.run_id = _cascade_force_skip_steps.run_id AND ss.step_slug = ANY (v_skipped)
    ORDER BY ss.step_slug
  LOOP
    PERFORM pgflow._broadcast_step(v_state);
  END LOOP;

  RETURN pg_catalog.cardinality(v_skipped);
END;
$$;

-- Evaluates the if/ifNot conditions of every created step whose dependencies are all done,
-- until nothing changes. Input of a condition: the run input for a root step, otherwise
-- {dep_slug: output} of its completed dependencies. Met = (if is NULL or input @> if) and
-- (ifNot is NULL or not input @> ifNot). Unmet, by when_unmet:
--   fail         -> the first such step (step_index order) and the run fail; returns false
--   skip         -> the step is skipped (condition_unmet), its children are released
--   skip-cascade -> the step and everything below it are skipped
-- Returns true for a started or completed run, false for a failed (or missing) one.
CREATE FUNCTION pgflow.cascade_resolve_conditions(run_id uuid)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_status text;
  v_unmet record;
  v_found boolean;
BEGIN
  SELECT r.status INTO v_status FROM pgflow.runs AS r WHERE r.run_id = cascade_resolve_conditions.run_id;
  IF v_status = 'completed' THEN
    RETURN true;
  ELSIF v_status IS DISTINCT FROM 'started' THEN
    RETURN false;
  END IF;

  LOOP
    v_found := false;
    FOR v_unmet IN
      WITH candidates AS (
        SELECT ss.step_slug, s.step_index, s.when_unmet,
               s.required_input_pattern AS if_pattern, s.forbidden_input_pattern AS if_not_pattern,
               CASE WHEN s.deps_count = 0 THEN r.input
                    ELSE coalesce((
                      SELECT pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                      FROM pgflow.deps AS d
                      JOIN pgflow.step_states AS ds ON ds.run_id = ss.run_id AND ds.step_slug = d.dep_slug
                      WHERE d.flow_slug = ss.flow_slug AND d.step_slug = ss.step_slug AND ds.status = 'completed'),
                      '{}'::jsonb)
               END AS cond_input
        FROM pgflow.step_states AS ss
        JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
        JOIN pgflow.runs AS r ON r.run_id = ss.run_id
        WHERE ss.run_id = cascade_resolve_conditions.run_id
          AND ss.status = 'created' AND ss.remaining_deps = 0
          AND (s.required_input_pattern IS NOT NULL OR s.forbidden_input_pattern IS NOT NULL)
      )
      SELECT c.step_slug, c.when_unmet
      FROM candidates AS c
      WHERE NOT ((c.if_pattern IS NULL OR c.cond_input @> c.if_pattern)
                 AND (c.if_not_pattern IS NULL OR NOT (c.cond_input @> c.if_not_pattern)))
      ORDER BY (c.when_unmet = 'fail') DESC, c.step_index
    LOOP
      v_found := true;
      IF v_unmet.when_unmet = 'fail' THEN
        PERFORM pgflow._fail_run(cascade_resolve_conditions.run_id, v_unmet.step_slug,
                                 pg_catalog.format('Condition not met for step "%s" (when_unmet = fail)', v_unmet.step_slug));
        RETURN false;
      ELSIF v_unmet.when_unmet = 'skip' THEN
        PERFORM pgflow._skip_step(cascade_resolve_conditions.run_id, v_unmet.step_slug, 'condition_unmet');
      ELSE
        PERFORM pgflow._cascade_force_skip_steps(cascade_resolve_conditions.run_id, v_unmet.step_slug, 'condition_unmet');
      END IF;
    END LOOP;
    EXIT WHEN NOT v_found;
  END LOOP;
  RETURN true;
END;
$$;

-- Completes every created step that is ready and has no tasks (an empty map, or a map whose
-- only dependency produced nothing), with output [] for a map and NULL for a single step, and
-- propagates to the children. Conditions are resolved before each pass, so a conditional step
-- is never completed without its condition being checked. Repeats until nothing changes and
-- returns the number of steps completed.
CREATE FUNCTION pgflow.cascade_complete_taskless_steps(run_id uuid)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow text;
  v_done text[];
  v_total integer := 0;
  v_state pgflow.step_states;
BEGIN
  LOOP
    IF NOT pgflow.cascade_resolve_conditions(cascade_complete_taskless_steps.run_id) THEN
      EXIT;
    END IF;
    SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r
    WHERE r.run_id = cascade_complete_taskless_steps.run_id AND r.status = 'started';
    EXIT WHEN v_flow IS NULL;

    WITH done AS (
      UPDATE pgflow.step_states AS ss
         SET status = 'completed',
             started_at = pg_catalog.now(),
             completed_at = pg_catalog.now(),
             remaining_tasks = 0,
             output = CASE WHEN s.step_type = 'map' THEN '[]'::jsonb ELSE NULL END
        FROM pgflow.steps AS s
       WHERE s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
         AND ss.run_id = cascade_complete_taskless_steps.run_id
         AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks = 0
      RETURNING ss.step_slug
    )
    SELECT pg_catalog.array_agg(d.step_slug ORDER BY d.step_slug) INTO v_done FROM done AS d;
    EXIT WHEN v_done IS NULL;

    UPDATE pgflow.step_states AS cs
       SET remaining_deps = cs.remaining_deps - x.finished,
           initial_tasks = CASE WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN 0 ELSE cs.initial_tasks END
      FROM (SELECT d.step_slug, pg_catalog.count(*)::integer AS finished
            FROM pgflow.deps AS d
            WHERE d.flow_slug = v_flow AND d.dep_slug = ANY (v_done)
            GROUP BY d.step_slug) AS x
      JOIN pgflow.steps AS c ON c.flow_slug = v_flow AND c.step_slug = x.step_slug
     WHERE cs.run_id = cascade_complete_taskless_steps.run_id
       AND cs.step_slug = x.step_slug AND cs.status = 'created';

    UPDATE pgflow.runs AS r
       SET remaining_steps = r.remaining_steps - pg_catalog.cardinality(v_done)
     WHERE r.run_id = cascade_complete_taskless_steps.run_id;

    FOR v_state IN
      SELECT ss.* FROM pgflow.step_states AS ss
      WHERE ss.run_id = cascade_complete_taskless_steps.run_id AND ss.step_slug = ANY (v_done)
      ORDER BY ss.step_slug
    LOOP
      PERFORM pgflow._broadcast_step(v_state);
    END LOOP;
    v_total := v_total + pg_catalog.cardinality(v_done);
  END LOOP;
  RETURN v_total;
END;
$$;

-- Completes a started run whose steps are all done. Output: {leaf_step: output} of the leaf
-- steps (no dependents) that completed; skipped leaves are left out.
CREATE FUNCTION pgflow.maybe_complete_run(run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run pgflow.runs;
BEGIN
  UPDATE pgflow.runs AS r
     SET status = 'completed',
         completed_at = pg_catalog.now(),
         output = coalesce((
           SELECT pg_catalog.jsonb_object_agg(ss.step_slug, ss.output)
           FROM pgflow.step_states AS ss
           WHERE ss.run_id = r.run_id AND ss.status = 'completed'
             AND NOT EXISTS (SELECT 1 FROM pgflow.deps AS d
                             WHERE d.flow_slug = ss.flow_slug AND d.dep_slug = ss.step_slug)), '{}'::jsonb)
   WHERE r.run_id = maybe_complete_run.run_id AND r.status = 'started' AND r.remaining_steps = 0
  RETURNING r.* INTO v_run;
  IF v_run.run_id IS NOT NULL THEN
    PERFORM pgflow._broadcast_run(v_run);
  END IF;
END;
$$;

-- Starts every ready step of a started run: status created, all dependencies done, at least one
-- task. One PGMQ message per task ({flow_slug, run_id, step_slug, task_index}) goes to the
-- flow's queue in one send_batch per step, delayed by the step's start_delay; message ids are
-- paired with task indexes by ordinality; one queued step_tasks row per task.
CREATE FUNCTION pgflow.start_ready_steps(run_id uuid)
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
    SELECT ss.initial_tasks, coalesce(s.opt_start_delay, 0)
    INTO v_tasks, v_delay
    FROM pgflow.step_states AS ss
    JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
    WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;

    INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id)
    SELECT v_flow, start_ready_steps.run_id, v_step, (m.n - 1)::integer, m.msg_id
    FROM pgmq.send_batch(
           v_flow,
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

-- Moves a run forward after a change: conditions and taskless steps settle, then ready steps
-- start and the run completes if nothing is left. Caller holds the run row lock.
CREATE FUNCTION pgflow._advance_run(p_run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  IF NOT pgflow.cascade_resolve_conditions(p_run_id) THEN
    RETURN;
  END IF;
  PERFORM pgflow.cascade_complete_taskless_steps(p_run_id);
  IF NOT EXISTS (SELECT 1 FROM pgflow.runs AS r WHERE r.run_id = p_run_id AND r.status = 'started') THEN
    RETURN;
  END IF;
  PERFORM pgflow.start_ready_steps(p_run_id);
  PERFORM pgflow.maybe_complete_run(p_run_id);
END;
$$;

------------------------------------------------------------------------------------------------
-- Runtime: public entry points
------------------------------------------------------------------------------------------------

-- Starts a run of a flow. A flow with root map steps needs a JSON array input (each element
-- becomes one task). Takes the flow advisory lock in shared mode, so a run never starts while
-- the flow is being recompiled or deleted.
CREATE FUNCTION pgflow.start_flow(flow_slug text, input jsonb, run_id uuid DEFAULT NULL)
RETURNS SETOF pgflow.runs
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run pgflow.runs;
  v_has_root_map boolean;
  v_root_tasks integer;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock_shared(1, pg_catalog.hashtext(start_flow.flow_slug));

  IF NOT EXISTS (SELECT 1 FROM pgflow.flows AS f WHERE f.flow_slug = start_flow.flow_slug) THEN
    RAISE EXCEPTION 'flow "%" does not exist', start_flow.flow_slug
      USING ERRCODE = 'PF006', HINT = 'start a worker for the flow (startup compilation creates it) or create it with pgflow.create_flow()';
  END IF;
  IF start_flow.input IS NULL THEN
    RAISE EXCEPTION 'flow "%": the run input must not be NULL (use ''{}'' for no input)', start_flow.flow_slug
      USING ERRCODE = '22004';
  END IF;

  SELECT EXISTS (SELECT 1 FROM pgflow.steps AS s
                 WHERE s.flow_slug = start_flow.flow_slug AND s.step_type = 'map' AND s.deps_count = 0)
  INTO v_has_root_map;
  IF v_has_root_map AND pg_catalog.jsonb_typeof(start_flow.input) <> 'array' THEN
    RAISE EXCEPTION 'flow "%" has a root map step, so its input must be a JSON array (got %)',
      start_flow.flow_slug, pg_catalog.jsonb_typeof(start_flow.input)
      USING ERRCODE = '22023';
  END IF;
  IF v_has_root_map THEN
    v_root_tasks := pg_catalog.jsonb_array_length(start_flow.input);
  END IF;

  INSERT INTO pgflow.runs (run_id, flow_slug, input, remaining_steps)
  SELECT coalesce(start_flow.run_id, pg_catalog.gen_random_uuid()), start_flow.flow_slug, start_flow.input,
         (SELECT pg_catalog.count(*)::integer FROM pgflow.steps AS s WHERE s.flow_slug = start_flow.flow_slug)
  RETURNING * INTO v_run;

  INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  SELECT s.flow_slug, v_run.run_id, s.step_slug, s.deps_count,
         CASE WHEN s.step_type = 'map' AND s.deps_count = 0 THEN v_root_tasks
              WHEN s.step_type = 'map' THEN NULL
              ELSE 1 END
  FROM pgflow.steps AS s
  WHERE s.flow_slug = start_flow.flow_slug
  ORDER BY s.step_index;

  PERFORM pgflow._broadcast_run(v_run);
  PERFORM pgflow._advance_run(v_run.run_id);

  RETURN QUERY SELECT r.* FROM pgflow.runs AS r WHERE r.run_id = v_run.run_id;
END;
$$;

-- Claims the queued tasks behind the given messages of a flow's queue for one worker. Only tasks
-- of started runs and started steps are claimed: attempts_count + 1, status started,
-- started_at, last_worker_id. Before anything is returned, the claimed messages become
-- invisible for the effective timeout + 2 s; if fewer messages could be changed than tasks were
-- claimed, the call raises and the whole claim rolls back (no attempt consumed). Messages that
-- match no claimable task are ignored (they reappear after the reader's own visibility timeout).
CREATE FUNCTION pgflow.start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid)
RETURNS SETOF pgflow.step_task_record
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
  v_offsets integer[];
  v_claimed integer;
  v_changed integer;
BEGIN
  IF coalesce(pg_catalog.cardinality(start_tasks.msg_ids), 0) = 0 THEN
    RETURN;
  END IF;

  -- Lock order runs -> step_tasks, as complete_task/fail_task: the runs in share mode (claims do
  -- not block each other, but wait for a completion or failure of the same run), then the task
  -- rows in key order, so two claims with overlapping batches cannot deadlock either.
  PERFORM 1
  FROM pgflow.runs AS r
  WHERE r.run_id IN (SELECT t.run_id FROM pgflow.step_tasks AS t
                     WHERE t.flow_slug = start_tasks.flow_slug
                       AND t.message_id = ANY (start_tasks.msg_ids)
                       AND t.status = 'queued')
  ORDER BY r.run_id
  FOR SHARE;

  WITH locked AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    WHERE t.flow_slug = start_tasks.flow_slug
      AND t.message_id = ANY (start_tasks.msg_ids)
      AND t.status = 'queued'
    ORDER BY t.run_id, t.step_slug, t.task_index
    FOR UPDATE
  ), claimed AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'started',
           attempts_count = t.attempts_count + 1,
           started_at = pg_catalog.now(),
           last_worker_id = start_tasks.worker_id
      FROM locked AS l, pgflow.runs AS r, pgflow.step_states AS ss, pgflow.steps AS s, pgflow.flows AS f
     WHERE t.run_id = l.run_id AND t.step_slug = l.step_slug AND t.task_index = l.task_index
       AND t.status = 'queued'
       AND r.run_id = t.run_id AND r.status = 'started'
       AND ss.run_id = t.run_id AND ss.step_slug = t.step_slug AND ss.status = 'started'
       AND s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
       AND f.flow_slug = t.flow_slug
    RETURNING t.run_id, t.step_slug, t.task_index, coalesce(s.opt_timeout, f.opt_timeout) + 2 AS vt_offset
  )
  SELECT pg_catalog.array_agg(c.run_id), pg_catalog.array_agg(c.step_slug),
         pg_catalog.array_agg(c.task_index), pg_catalog.array_agg(c.vt_offset), pg_catalog.count(*)::integer
  INTO v_run_ids, v_step_slugs, v_task_indexes, v_offsets, v_claimed
  FROM claimed AS c;

  IF v_claimed = 0 THEN
    RETURN;
  END IF;

  v_changed := pgflow._set_task_messages_vt(v_run_ids, v_step_slugs, v_task_indexes, v_offsets);
  IF v_changed < v_claimed THEN
    RAISE EXCEPTION 'start_tasks(): visibility updated % of % claimed messages in queue "%"; the claim was rolled back and no attempt was consumed',
      v_changed, v_claimed, start_tasks.flow_slug
      USING ERRCODE = 'P0001',
            HINT = 'a claimed task''s message is missing from its queue; check for code that archives or deletes pgflow messages directly';
  END IF;

  RETURN QUERY
  SELECT t.flow_slug,
         t.run_id,
         t.step_slug,
         CASE
           WHEN s.step_type = 'map' AND s.deps_count = 0 THEN r.input -> t.task_index
           WHEN s.step_type = 'map' THEN (
             SELECT ds.output -> t.task_index
             FROM pgflow.deps AS d
             JOIN pgflow.step_states AS ds ON ds.run_id = t.run_id AND ds.step_slug = d.dep_slug
             WHERE d.flow_slug = t.flow_slug AND d.step_slug = t.step_slug
             LIMIT 1)
           WHEN s.deps_count = 0 THEN '{}'::jsonb
           ELSE coalesce((
             SELECT pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
             FROM pgflow.deps AS d
             JOIN pgflow.step_states AS ds ON ds.run_id = t.run_id AND ds.step_slug = d.dep_slug
             WHERE d.flow_slug = t.flow_slug AND d.step_slug = t.step_slug AND ds.status = 'completed'),
             '{}'::jsonb)
         END,
         t.message_id,
         t.task_index,
         CASE WHEN s.step_type = 'single' AND s.deps_count = 0 THEN r.input END
  FROM ROWS FROM (pg_catalog.unnest(v_run_ids), pg_catalog.unnest(v_step_slugs), pg_catalog.unnest(v_task_indexes)) AS k (run_id, step_slug, task_index)
  JOIN pgflow.step_tasks AS t ON t.run_id = k.run_id AND t.step_slug = k.step_slug AND t.task_index = k.task_index
  JOIN pgflow.runs AS r ON r.run_id = t.run_id
  JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
  ORDER BY pg_catalog.array_position(start_tasks.msg_ids, t.message_id), t.run_id, t.step_slug, t.task_index;
END;
$$;

-- Records a task's success. A late call (run or step no longer started, task terminal) changes
-- nothing and archives the task's message idempotently; a queued task (requeued by stalled
-- recovery) is left alone with its message. Otherwise the task completes; when it was the
-- step's last one the step completes (map output: task outputs in task_index order), the
-- children are released, and the run moves on. A single step whose output is not an array but
-- feeds a map step fails the run with a [TYPE_VIOLATION] error.
CREATE FUNCTION pgflow.complete_task(run_id uuid, step_slug text, task_index integer, output jsonb)
RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_task pgflow.step_tasks;
  v_step pgflow.steps;
  v_error text;
  v_child_tasks integer;
BEGIN
  SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = complete_task.run_id FOR UPDATE;
  IF v_run.run_id IS NULL THEN
    RETURN;
  END IF;
  SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
  WHERE ss.run_id = complete_task.run_id AND ss.step_slug = complete_task.step_slug FOR UPDATE;
  SELECT t.* INTO v_task FROM pgflow.step_tasks AS t
  WHERE t.run_id = complete_task.run_id AND t.step_slug = complete_task.step_slug
    AND t.task_index = complete_task.task_index FOR UPDATE;
  IF v_task.run_id IS NULL THEN
    RETURN;
  END IF;

  IF v_run.status <> 'started' OR v_state.status <> 'started' OR v_task.status <> 'started' THEN
    IF NOT (v_task.status = 'queued' AND v_run.status = 'started' AND v_state.status = 'started') THEN
      PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
    END IF;
    RETURN NEXT v_task;
    RETURN;
  END IF;

  SELECT s.* INTO v_step FROM pgflow.steps AS s
  WHERE s.flow_slug = v_run.flow_slug AND s.step_slug = complete_task.step_slug;

  -- A map step over a single step's output needs an array.
  IF v_step.step_type = 'single'
     AND pg_catalog.jsonb_typeof(complete_task.output) IS DISTINCT FROM 'array'
     AND EXISTS (SELECT 1 FROM pgflow.deps AS d
                 JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
                 WHERE d.flow_slug = v_run.flow_slug AND d.dep_slug = complete_task.step_slug AND c.step_type = 'map') THEN
    SELECT pg_catalog.format('[TYPE_VIOLATION] step "%s" returned %s, but map step(s) %s need a JSON array from it',
                             complete_task.step_slug,
                             coalesce(pg_catalog.jsonb_typeof(complete_task.output), 'no output'),
                             pg_catalog.string_agg('"' || d.step_slug || '"', ', ' ORDER BY d.step_slug))
    INTO v_error
    FROM pgflow.deps AS d
    JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
    WHERE d.flow_slug = v_run.flow_slug AND d.dep_slug = complete_task.step_slug AND c.step_type = 'map';

    UPDATE pgflow.step_tasks AS t
       SET status = 'failed', failed_at = pg_catalog.now(), error_message = v_error
     WHERE t.run_id = complete_task.run_id AND t.step_slug = complete_task.step_slug
       AND t.task_index = complete_task.task_index
    RETURNING t.* INTO v_task;
    PERFORM pgflow._fail_run(complete_task.run_id, complete_task.step_slug, v_error);
    RETURN NEXT v_task;
    RETURN;
  END IF;

  UPDATE pgflow.step_tasks AS t
     SET status = 'completed', completed_at = pg_catalog.now(), output = complete_task.output
   WHERE t.run_id = complete_task.run_id AND t.step_slug = complete_task.step_slug
     AND t.task_index = complete_task.task_index
  RETURNING t.* INTO v_task;

  UPDATE pgflow.step_states AS ss
     SET remaining_tasks = ss.remaining_tasks - 1
   WHERE ss.run_id = complete_task.run_id AND ss.step_slug = complete_task.step_slug
  RETURNING ss.* INTO v_state;

  IF v_state.remaining_tasks = 0 THEN
    UPDATE pgflow.step_states AS ss
       SET status = 'completed',
           completed_at = pg_catalog.now(),
           output = CASE WHEN v_step.step_type = 'map' THEN coalesce((
                           SELECT pg_catalog.jsonb_agg(t.output ORDER BY t.task_index)
                           FROM pgflow.step_tasks AS t
                           WHERE t.run_id = ss.run_id AND t.step_slug = ss.step_slug AND t.status = 'completed'),
                           '[]'::jsonb)
                         ELSE complete_task.output END
     WHERE ss.run_id = complete_task.run_id AND ss.step_slug = complete_task.step_slug
    RETURNING ss.* INTO v_state;

    -- Size of a map child that maps over this step's output (computed here: a CASE inside the
    -- UPDATE could be folded at plan time and evaluated for non-arrays).
    IF pg_catalog.jsonb_typeof(v_state.output) = 'array' THEN
      v_child_tasks := pg_catalog.jsonb_array_length(v_state.output);
    END IF;

    UPDATE pgflow.step_states AS cs
       SET remaining_deps = cs.remaining_deps - 1,
           initial_tasks = CASE
             WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN v_child_tasks
             ELSE cs.initial_tasks END
      FROM pgflow.deps AS d
      JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
     WHERE d.flow_slug = v_run.flow_slug AND d.dep_slug = complete_task.step_slug
       AND cs.run_id = complete_task.run_id AND cs.step_slug = d.step_slug AND cs.status = 'created';

    UPDATE pgflow.runs AS r SET remaining_steps = r.remaining_steps - 1 WHERE r.run_id = complete_task.run_id;

    PERFORM pgflow._broadcast_step(v_state);
    PERFORM pgflow._advance_run(complete_task.run_id);
  END IF;

  PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
  RETURN NEXT v_task;
END;
$$;

-- Records a task's failure. Late calls behave as in complete_task. With attempts left
-- (attempts_count < effective max_attempts) the task is queued again and its message becomes
-- visible after calculate_retry_delay(effective base_delay, attempts_count) seconds. A task
-- whose message no longer exists (a permanently stalled task) cannot be retried and is treated
-- as exhausted. An exhausted task fails, and its step's when_exhausted decides:
--   fail         -> the step and the run fail; every other unfinished task is cancelled
--   skip         -> the step is skipped (handler_failed), its other tasks skipped, children released
--   skip-cascade -> the step and everything below it are skipped
CREATE FUNCTION pgflow.fail_task(run_id uuid, step_slug text, task_index integer, error_message text)
RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_task pgflow.step_tasks;
  v_max_attempts integer;
  v_base_delay integer;
  v_when_exhausted text;
  v_error text := fail_task.error_message;
BEGIN
  SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = fail_task.run_id FOR UPDATE;
  IF v_run.run_id IS NULL THEN
    RETURN;
  END IF;
  SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
  WHERE ss.run_id = fail_task.run_id AND ss.step_slug = fail_task.step_slug FOR UPDATE;
  SELECT t.* INTO v_task FROM pgflow.step_tasks AS t
  WHERE t.run_id = fail_task.run_id AND t.step_slug = fail_task.step_slug
    AND t.task_index = fail_task.task_index FOR UPDATE;
  IF v_task.run_id IS NULL THEN
    RETURN;
  END IF;

  IF v_run.status <> 'started' OR v_state.status <> 'started' OR v_task.status <> 'started' THEN
    IF NOT (v_task.status = 'queued' AND v_run.status = 'started' AND v_state.status = 'started') THEN
      PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
    END IF;
    RETURN NEXT v_task;
    RETURN;
  END IF;

  SELECT coalesce(s.opt_max_attempts, f.opt_max_attempts), coalesce(s.opt_base_delay, f.opt_base_delay), s.when_exhausted
  INTO v_max_attempts, v_base_delay, v_when_exhausted
  FROM pgflow.steps AS s
  JOIN pgflow.flows AS f ON f.flow_slug = s.flow_slug
  WHERE s.flow_slug = v_run.flow_slug AND s.step_slug = fail_task.step_slug;

  IF v_task.attempts_count < v_max_attempts THEN
    UPDATE pgflow.step_tasks AS t
       SET status = 'queued', started_at = NULL, error_message = v_error
     WHERE t.run_id = fail_task.run_id AND t.step_slug = fail_task.step_slug AND t.task_index = fail_task.task_index
    RETURNING t.* INTO v_task;
    IF pgflow._set_task_messages_vt(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index],
                                    ARRAY[pgflow.calculate_retry_delay(v_base_delay, v_task.attempts_count)]) > 0 THEN
      RETURN NEXT v_task;
      RETURN;
    END IF;
    v_error := v_error || ' (not retried: the task''s queue message no longer exists)';
  END IF;

  UPDATE pgflow.step_tasks AS t
     SET status = 'failed', failed_at = pg_catalog.now(), error_message = v_error
   WHERE t.run_id = fail_task.run_id AND t.step_slug = fail_task.step_slug AND t.task_index = fail_task.task_index
  RETURNING t.* INTO v_task;

  IF v_when_exhausted = 'fail' THEN
    PERFORM pgflow._fail_run(fail_task.run_id, fail_task.step_slug, v_error);
  ELSE
    IF v_when_exhausted = 'skip' THEN
      PERFORM pgflow._skip_step(fail_task.run_id, fail_task.step_slug, 'handler_failed', v_error);
    ELSE
      PERFORM pgflow._cascade_force_skip_steps(fail_task.run_id, fail_task.step_slug, 'handler_failed');
      UPDATE pgflow.step_states AS ss SET error_message = v_error
       WHERE ss.run_id = fail_task.run_id AND ss.step_slug = fail_task.step_slug;
    END IF;
    PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
    PERFORM pgflow._advance_run(fail_task.run_id);
  END IF;

  RETURN NEXT v_task;
END;
$$;

-- Gives stalled tasks back to the queue. A task is stalled when it is started (and not
-- permanently stalled) in a started run and a started step, and its started_at is older than
-- the effective timeout (coalesce(step, flow)) + 30 s. While requeued_count < 3 it goes back to
-- queued (started_at and last_worker_id cleared, requeued_count + 1) and its message becomes
-- visible now; after that it is marked permanently_stalled_at, its message is archived and its
-- status stays started. Rows locked by someone else are skipped. Returns how many tasks were
-- requeued. attempts_count is not reset: a re-claim uses an attempt.
CREATE FUNCTION pgflow.requeue_stalled_tasks()
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
DECLARE
  v_req_runs uuid[];
  v_req_steps text[];
  v_req_idx integer[];
  v_dead_runs uuid[];
  v_dead_steps text[];
  v_dead_idx integer[];
BEGIN
  WITH candidates AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    JOIN pgflow.runs AS r ON r.run_id = t.run_id
    JOIN pgflow.step_states AS ss ON ss.run_id = t.run_id AND ss.step_slug = t.step_slug
    JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
    JOIN pgflow.flows AS f ON f.flow_slug = t.flow_slug
    WHERE t.status = 'started'
      AND t.permanently_stalled_at IS NULL
      AND r.status = 'started'
      AND ss.status = 'started'
      AND t.started_at < pg_catalog.now() - pg_catalog.make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
    ORDER BY t.run_id, t.step_slug, t.task_index
    FOR UPDATE OF t SKIP LOCKED
  ), requeued AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'queued', started_at = NULL, last_worker_id = NULL,
           requeued_count = t.requeued_count + 1, last_requeued_at = pg_catalog.now()
      FROM candidates AS c
     WHERE t.run_id = c.run_id AND t.step_slug = c.step_slug AND t.task_index = c.task_index
       AND t.requeued_count < 3
    RETURNING 'requeued'::text AS outcome, t.run_id, t.step_slug, t.task_index
  ), stalled AS (
    UPDATE pgflow.step_tasks AS t
       SET permanently_stalled_at = pg_catalog.now()
      FROM candidates AS c
     WHERE t.run_id = c.run_id AND t.step_slug = c.step_slug AND t.task_index = c.task_index
       AND t.requeued_count >= 3
    RETURNING 'stalled'::text AS outcome, t.run_id, t.step_slug, t.task_index
  ), changed AS (
    SELECT * FROM requeued UNION ALL SELECT * FROM stalled
  )
  SELECT pg_catalog.array_agg(x.run_id) FILTER (WHERE x.outcome = 'requeued'),
         pg_catalog.array_agg(x.step_slug) FILTER (WHERE x.outcome = 'requeued'),
         pg_catalog.array_agg(x.task_index) FILTER (WHERE x.outcome = 'requeued'),
         pg_catalog.array_agg(x.run_id) FILTER (WHERE x.outcome = 'stalled'),
         pg_catalog.array_agg(x.step_slug) FILTER (WHERE x.outcome = 'stalled'),
         pg_catalog.array_agg(x.task_index) FILTER (WHERE x.outcome = 'stalled')
  INTO v_req_runs, v_req_steps, v_req_idx, v_dead_runs, v_dead_steps, v_dead_idx
  FROM changed AS x;

  IF v_req_runs IS NOT NULL THEN
    PERFORM pgflow._set_task_messages_vt(v_req_runs, v_req_steps, v_req_idx,
                                         pg_catalog.array_fill(0, ARRAY[pg_catalog.cardinality(v_req_runs)]));
  END IF;
  IF v_dead_runs IS NOT NULL THEN
    PERFORM pgflow._archive_task_messages(v_dead_runs, v_dead_steps, v_dead_idx);
  END IF;
  RETURN coalesce(pg_catalog.cardinality(v_req_runs), 0);
END;
$$;

-- A run with all its step states, as one JSON document: {"run": {...}, "steps": [...]}.
CREATE FUNCTION pgflow.get_run_with_states(run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_result jsonb;
BEGIN
  SELECT pg_catalog.jsonb_build_object(
           'run', pg_catalog.to_jsonb(r),
           'steps', coalesce((
             SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(ss) ORDER BY s.step_index)
             FROM pgflow.step_states AS ss
             JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
             WHERE ss.run_id = r.run_id), '[]'::jsonb))
  INTO v_result
  FROM pgflow.runs AS r
  WHERE r.run_id = get_run_with_states.run_id;
  IF v_result IS NULL THEN
    RAISE EXCEPTION 'run % does not exist', get_run_with_states.run_id USING ERRCODE = 'PF006';
  END IF;
  RETURN v_result;
END;
$$;

-- start_flow, then the new run with its step states (for clients that need both at once).
CREATE FUNCTION pgflow.start_flow_with_states(flow_slug text, input jsonb, run_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run_id uuid;
BEGIN
  SELECT r.run_id INTO v_run_id
  FROM pgflow.start_flow(start_flow_with_states.flow_slug, start_flow_with_states.input, start_flow_with_states.run_id) AS r;
  RETURN pgflow.get_run_with_states(v_run_id);
END;
$$;

-- Deprecated upstream entry point kept for old callers: polls nothing.
CREATE FUNCTION pgflow.poll_for_tasks(
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
  RAISE NOTICE 'pgflow.poll_for_tasks() is deprecated and returns nothing: read with pgmq.read_with_poll() and claim with pgflow.start_tasks()';
  RETURN;
END;
$$;

------------------------------------------------------------------------------------------------
-- Workers
------------------------------------------------------------------------------------------------

-- Registers (or touches) a worker function; never changes its enabled flag.
CREATE FUNCTION pgflow.track_worker_function(function_name text)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  INSERT INTO pgflow.worker_functions AS wf (function_name, updated_at)
  VALUES (track_worker_function.function_name, pg_catalog.clock_timestamp())
  ON CONFLICT (function_name) DO UPDATE SET updated_at = pg_catalog.clock_timestamp();
$$;

-- Registers a starting worker: tracks its function and inserts its worker row. A fenced
-- function (worker_functions.enabled = false) is refused with SQLSTATE PF001 and nothing is
-- written. The function row is locked by the upsert, so a concurrent fence either waits for
-- this registration (and then sees the worker) or wins and makes it fail.
CREATE FUNCTION pgflow.register_worker(
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
BEGIN
  IF register_worker.worker_id IS NULL OR register_worker.function_name IS NULL OR register_worker.queue_name IS NULL THEN
    RAISE EXCEPTION 'register_worker(): worker_id, function_name and queue_name are required' USING ERRCODE = '22004';
  END IF;

  INSERT INTO pgflow.worker_functions AS wf (function_name, updated_at)
  VALUES (register_worker.function_name, pg_catalog.clock_timestamp())
  ON CONFLICT (function_name) DO UPDATE SET updated_at = pg_catalog.clock_timestamp()
  RETURNING wf.enabled INTO v_enabled;

  IF NOT v_enabled THEN
    RAISE EXCEPTION 'worker function "%" is fenced (pgflow.worker_functions.enabled = false): worker % may not register',
      register_worker.function_name, register_worker.worker_id
      USING ERRCODE = 'PF001',
            HINT = 'a rollout disabled this function; finish the rollout and enable it again (UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = ...)';
  END IF;

  INSERT INTO pgflow.workers (worker_id, queue_name, function_name, flow_slug, step_slug, started_at, last_heartbeat_at)
  VALUES (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
          register_worker.flow_slug, register_worker.step_slug, pg_catalog.now(), pg_catalog.clock_timestamp());
END;
$$;

-- Heartbeat. Returns true when the worker should stop polling: it was deprecated, or its row
-- no longer exists (it can no longer claim anything).
CREATE FUNCTION pgflow.send_heartbeat(worker_id uuid)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_deprecated boolean;
BEGIN
  UPDATE pgflow.workers AS w
     SET last_heartbeat_at = pg_catalog.clock_timestamp()
   WHERE w.worker_id = send_heartbeat.worker_id
  RETURNING w.deprecated_at IS NOT NULL INTO v_deprecated;
  RETURN coalesce(v_deprecated, true);
END;
$$;

CREATE FUNCTION pgflow.mark_worker_stopped(worker_id uuid)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  UPDATE pgflow.workers AS w
     SET stopped_at = pg_catalog.clock_timestamp()
   WHERE w.worker_id = mark_worker_stopped.worker_id;
$$;

-- Optional HTTP starter (Supabase Edge Functions). Needs pg_net; in production also vault
-- secrets (pgflow_auth_secret or supabase_service_role_key, and supabase_project_id) unless
-- pgflow.functions_url is set. Without them it returns no rows and does nothing. Pings every
-- enabled function (fenced functions never) that, in production, has no live worker and whose
-- debounce has passed; locally every enabled function. pg_net and vault are reached only
-- through dynamic SQL after a catalog check.
CREATE FUNCTION pgflow.ensure_workers()
RETURNS TABLE (function_name text, invoked boolean, request_id bigint)
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_local boolean := pgflow.is_local();
  v_url text := nullif(pg_catalog.current_setting('pgflow.functions_url', true), '');
  v_secret text;
  v_project text;
  v_fn text;
  v_request bigint;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'net' AND p.proname = 'http_post') THEN
    RETURN;
  END IF;

  IF pg_catalog.to_regclass('vault.decrypted_secrets') IS NOT NULL THEN
    EXECUTE $q$
      SELECT coalesce(nullif(pg_catalog.max(s.decrypted_secret) FILTER (WHERE s.name = 'pgflow_auth_secret'), ''),
                      nullif(pg_catalog.max(s.decrypted_secret) FILTER (WHERE s.name = 'supabase_service_role_key'), '')),
             nullif(pg_catalog.max(s.decrypted_secret) FILTER (WHERE s.name = 'supabase_project_id'), '')
      FROM vault.decrypted_secrets AS s
      WHERE s.name IN ('pgflow_auth_secret', 'supabase_service_role_key', 'supabase_project_id')
    $q$ INTO v_secret, v_project;
  END IF;

  IF v_local THEN
    v_url := coalesce(v_url, 'http://kong:8000/functions/v1');
    v_secret := NULL;
  ELSE
    IF v_url IS NULL AND v_project IS NOT NULL THEN
      v_url := 'https://' || v_project || '.supabase.co/functions/v1';
    END IF;
    IF v_url IS NULL OR v_secret IS NULL THEN
      RETURN;
    END IF;
  END IF;

  FOR v_fn IN
    SELECT wf.function_name
    FROM pgflow.worker_functions AS wf
    WHERE wf.enabled
      AND (v_local
           OR ((wf.last_invoked_at IS NULL OR wf.last_invoked_at < pg_catalog.now() - wf.debounce)
               AND NOT EXISTS (SELECT 1 FROM pgflow.workers AS w
                               WHERE w.function_name = wf.function_name
                                 AND w.stopped_at IS NULL AND w.deprecated_at IS NULL
                                 AND w.last_heartbeat_at > pg_catalog.now() - wf.debounce)))
    ORDER BY wf.function_name
    FOR UPDATE OF wf SKIP LOCKED
  LOOP
    EXECUTE 'SELECT net.http_post(url => $1, body => $2, headers => $3)'
      INTO v_request
      USING v_url || '/' || v_fn,
            '{}'::jsonb,
            pg_catalog.jsonb_build_object('Content-Type', 'application/json')
              || CASE WHEN v_secret IS NULL THEN '{}'::jsonb
                      ELSE pg_catalog.jsonb_build_object('Authorization', 'Bearer ' || v_secret) END;
    UPDATE pgflow.worker_functions AS wf SET last_invoked_at = pg_catalog.clock_timestamp()
     WHERE wf.function_name = v_fn;
    function_name := v_fn;
    invoked := true;
    request_id := v_request;
    RETURN NEXT;
  END LOOP;
END;
$$;

-- Raises a clear error when pg_cron is not installed.
CREATE FUNCTION pgflow._require_pg_cron()
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
BEGIN
  IF pg_catalog.to_regclass('cron.job') IS NULL
     OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                    JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
                    WHERE n.nspname = 'cron' AND p.proname = 'schedule') THEN
    RAISE EXCEPTION 'pg_cron is not installed in this database, so pgflow cannot schedule jobs'
      USING ERRCODE = '0A000',
            HINT = 'install pg_cron (CREATE EXTENSION pg_cron), or run the function from your own scheduler';
  END IF;
END;
$$;

-- Schedules pgflow_ensure_workers and the hourly pgflow_cleanup_logs (pg_cron; idempotent).
CREATE FUNCTION pgflow.setup_ensure_workers_cron(cron_interval text DEFAULT '1 second')
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
BEGIN
  PERFORM pgflow._require_pg_cron();
  EXECUTE 'SELECT cron.unschedule(j.jobid) FROM cron.job AS j WHERE j.jobname = ANY ($1)'
    USING ARRAY['pgflow_ensure_workers', 'pgflow_cleanup_logs'];
  EXECUTE 'SELECT cron.schedule($1, $2, $3)'
    USING 'pgflow_ensure_workers', cron_interval, 'SELECT pgflow.ensure_workers()';
  EXECUTE 'SELECT cron.schedule($1, $2, $3)'
    USING 'pgflow_cleanup_logs', '0 * * * *', 'SELECT pgflow.cleanup_ensure_workers_logs()';
  RETURN 'scheduled pgflow_ensure_workers every ' || cron_interval || ' and pgflow_cleanup_logs hourly';
END;
$$;

-- Schedules pgflow_requeue_stalled_tasks (pg_cron; idempotent).
CREATE FUNCTION pgflow.setup_requeue_stalled_tasks_cron(cron_interval text DEFAULT '15 seconds')
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
BEGIN
  PERFORM pgflow._require_pg_cron();
  EXECUTE 'SELECT cron.unschedule(j.jobid) FROM cron.job AS j WHERE j.jobname = $1'
    USING 'pgflow_requeue_stalled_tasks';
  EXECUTE 'SELECT cron.schedule($1, $2, $3)'
    USING 'pgflow_requeue_stalled_tasks', cron_interval, 'SELECT pgflow.requeue_stalled_tasks()';
  RETURN 'scheduled pgflow_requeue_stalled_tasks every ' || cron_interval;
END;
$$;

-- Deletes pg_cron run history older than retention_hours; 0 when pg_cron is not installed.
CREATE FUNCTION pgflow.cleanup_ensure_workers_logs(retention_hours integer DEFAULT 24)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
DECLARE
  v_count integer;
BEGIN
  IF pg_catalog.to_regclass('cron.job_run_details') IS NULL THEN
    RETURN 0;
  END IF;
  EXECUTE 'DELETE FROM cron.job_run_details AS d WHERE d.end_time < pg_catalog.now() - pg_catalog.make_interval(hours => $1)'
    USING retention_hours;
  GET DIAGNOSTICS v_count = ROW_COUNT;
  RETURN v_count;
END;
$$;

------------------------------------------------------------------------------------------------
-- Privileges: nothing is executable by PUBLIC; operators grant to their own roles.
------------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgflow FROM PUBLIC;
