-- Fragment: every upgrade-audit finding, as one self-contained SELECT (a CTE chain).
--
-- Used by `pgflow audit` (sql/audit.sql, section findings) and meant to be included by the
-- queue-identity migration, which reruns it under its locks and refuses when any row has
-- blocking = true. Keep it a single statement: no semicolon, no dollar quoting, no psql
-- variables, no parameters, every object schema-qualified (the caller may run with an empty
-- search_path), reads only (SELECT on pgflow and pgmq tables, the catalogs).
--
-- Works on every supported schema generation with the same text: optional columns are read
-- by name scoping (audit/flows.sql, audit/steps.sql: steps.queue_name, flows.queue_mode arrive
-- with the queue-identity migration; step_tasks.queue_name is only looked up in the catalog).
--
-- Plans stay linear in the number of flows and queues: flows_x and steps_x are NOT MATERIALIZED
-- (plain scans of pgflow.flows and pgflow.steps, so the planner keeps their statistics), and
-- every lookup CTE is one row per key (an aggregation), so joins against it cannot multiply the
-- row estimates. Estimates that compound across joins of CTEs (whose columns have no
-- statistics) made hash joins plan a million batches for an empty relation at 10,000 flows.
--
-- Output columns:
--   check_id text       stable id (docs/audit.md)
--   severity text       'error' | 'warning' | 'info'
--   blocking boolean    true = the queue-identity migration refuses while this row exists
--   flow_slug text      the flow concerned (NULL for queues no flow owns)
--   step_slug text      the step concerned, if any
--   object_type text    'flow' | 'step' | 'queue'
--   object_name text    the flow slug, step slug or queue name (spelled as stored)
--   reasons text[]      stable reason codes, all that apply, in a fixed order
--   evidence jsonb      facts behind the finding; 'related_flows' lists every flow involved
--   message text        one sentence for people
--   fix text            what to do about it
--
-- Name handling: slug and queue-name rules compare with lower(x COLLATE "C") (ASCII only,
-- independent of the database locale), like fragments/*.sql. The physical table of a queue
-- is derived exactly as PGMQ derives it: 'q_' || lower(name) in the database's default
-- collation, cut to PostgreSQL's 63-byte identifier limit by the cast to name. The two differ
-- where the collation lowercases an ASCII letter otherwise (ICU/libc tr-TR and az: I -> ı), so
-- a legacy queue created under the flow's own spelling can live in tables the routed queue
-- name does not reach (flow_queue_table_elsewhere).
WITH
flows_x AS NOT MATERIALIZED (
--@include audit/flows.sql
),
steps_x AS NOT MATERIALIZED (
--@include audit/steps.sql
),
reason_text (code, words) AS (
  VALUES ('empty', 'is empty'),
         ('too_long', 'is longer than 128 characters'),
         ('invalid_character', 'contains a character other than ASCII letters, digits and _'),
         ('leading_digit', 'starts with a digit'),
         ('leading_underscore', 'starts with _'),
         ('trailing_underscore', 'ends with _'),
         ('double_underscore', 'contains __ (reserved for generated queue names)'),
         ('reserved_word', 'is a reserved word'),
         ('too_many_characters', 'is longer than PGMQ''s 47 characters'),
         ('too_many_bytes', 'makes a q_/a_ table name longer than PostgreSQL''s 63-byte identifier limit'),
         ('meta_row_missing', 'has no pgmq.meta row'),
         ('queue_table_missing', 'has no queue table'),
         ('archive_table_missing', 'has no archive table'),
         ('routed_queue_table_elsewhere', 'has its tables where the routed queue name does not reach'),
         ('not_lowercase', 'is not lowercase'),
         ('differs_from_flow_slug', 'is spelled differently from the flow slug')
),
slug_input AS (
  SELECT flow_slug AS slug FROM flows_x
  UNION
  SELECT step_slug FROM steps_x
),
slug_checked AS (
--@include fragments/slug_violations.sql
),
slug_report AS (
  SELECT sc.slug,
         sc.reasons,
         (SELECT string_agg(rt.words, '; ' ORDER BY u.ord)
            FROM unnest(sc.reasons) WITH ORDINALITY AS u(code, ord)
            JOIN reason_text AS rt ON rt.code = u.code) AS reason_words,
         CASE
           WHEN sc.reasons <@ ARRAY['leading_underscore', 'trailing_underscore', 'double_underscore']::text[]
                AND (btrim(regexp_replace(sc.slug, '_{2,}', '_', 'g'), '_') COLLATE "C") ~ '^[A-Za-z]'
                AND btrim(regexp_replace(sc.slug, '_{2,}', '_', 'g'), '_') <> 'run'
           THEN btrim(regexp_replace(sc.slug, '_{2,}', '_', 'g'), '_')
         END AS suggested_slug
  FROM slug_checked AS sc
  WHERE cardinality(sc.reasons) > 0
),
-- PGMQ: metadata rows and physical tables
meta_rows AS (
  SELECT m.queue_name::text AS spelling,
         ('q_' || lower(m.queue_name::text))::name::text AS q_table
  FROM pgmq.meta AS m
),
pgmq_tables AS (
  SELECT c.relname::text AS relname
  FROM pg_catalog.pg_class AS c
  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
  WHERE n.nspname = 'pgmq'
    AND c.relkind IN ('r', 'p')
    AND NOT c.relispartition
    AND (c.relname LIKE 'q\_%' OR c.relname LIKE 'a\_%')
),
-- one row per physical queue, keyed by its q_ table name: its pgmq.meta spellings and which of its
-- two tables exist (one aggregation over both sources, so later joins see one row per queue)
queues AS (
  SELECT g.q_table,
         'a_' || substr(g.q_table, 3) AS a_table,
         coalesce(g.spellings, ARRAY[]::text[]) AS spellings,
         coalesce(g.spellings[1], substr(g.q_table, 3)) AS display_name,
         coalesce(g.max_chars, length(substr(g.q_table, 3))) AS max_chars,
         coalesce(g.max_bytes, octet_length(g.q_table)) AS max_bytes,
         g.has_queue_table,
         g.has_archive_table
  FROM (
    SELECT u.q_table,
           array_agg(u.spelling ORDER BY u.spelling COLLATE "C") FILTER (WHERE u.kind = 'meta') AS spellings,
           max(length(u.spelling)) AS max_chars,
           max(octet_length('q_' || lower(u.spelling))) AS max_bytes,
           bool_or(u.kind = 'q') AS has_queue_table,
           bool_or(u.kind = 'a') AS has_archive_table
    FROM (
      SELECT mr.q_table, mr.spelling, 'meta' AS kind FROM meta_rows AS mr
      UNION ALL
      SELECT 'q_' || substr(t.relname, 3), NULL, left(t.relname, 1) FROM pgmq_tables AS t
    ) AS u
    GROUP BY u.q_table
  ) AS g
),
-- the queues each flow uses: its default queue (flow mode) and its persisted step routes
flow_queues AS (
--@include audit/flow_queues.sql
),
-- per queue table: the flows that use it, and every (flow, queue name, origin) route to it
queue_owners AS (
  SELECT q_table,
         array_agg(DISTINCT (flow_slug COLLATE "C") ORDER BY (flow_slug COLLATE "C")) AS owners,
         array_agg(flow_slug) AS route_flows,
         array_agg(queue_name) AS route_names,
         array_agg(origin) AS route_origins
  FROM flow_queues
  GROUP BY q_table
),
-- every meta row of an owned queue, with the flow it belongs to (the owner spelled exactly
-- like it, else the first owner) and whether any owner expects exactly this spelling
-- (one row per meta row: the routes are looked at through the owner's arrays, not a join)
owned_meta AS (
  SELECT mr.spelling,
         mr.q_table,
         qo.owners,
         o.flow_slug,
         o.matches_owner
  FROM meta_rows AS mr
  JOIN queue_owners AS qo ON qo.q_table = mr.q_table
  CROSS JOIN LATERAL (
    SELECT coalesce(min(r.flow_slug COLLATE "C") FILTER (WHERE r.flow_slug = mr.spelling),
                    min(r.flow_slug COLLATE "C")) AS flow_slug,
           -- the spelling a flow uses: its routed queue name (the lowercase name the queue-identity
           -- create_flow gives it, or a step route), or, for a legacy default queue, the flow slug
           coalesce(bool_or(r.queue_name = mr.spelling
                            OR (r.origin = 'default' AND r.flow_slug = mr.spelling)), false) AS matches_owner
    FROM unnest(qo.route_flows, qo.route_names, qo.route_origins) AS r(flow_slug, queue_name, origin)
  ) AS o
),
-- generated private step queue names of every flow that could opt into step queues
route_input AS (
  SELECT s.flow_slug, s.step_slug, s.step_index
  FROM steps_x AS s
  JOIN flows_x AS f ON f.flow_slug = s.flow_slug
  WHERE f.queue_mode <> 'step'
    AND s.step_index >= 0
    AND NOT EXISTS (SELECT 1 FROM slug_report AS r WHERE r.slug = s.flow_slug)
    AND NOT EXISTS (SELECT 1 FROM slug_report AS r WHERE r.slug = s.step_slug)
),
step_names AS (
--@include fragments/step_queue_names.sql
),
collisions AS (
  SELECT sn.flow_slug, sn.step_slug, sn.step_index, sn.queue_name AS generated_name, sn.name_kind, q.*
  FROM step_names AS sn
  JOIN queues AS q ON q.q_table = ('q_' || lower(sn.queue_name))::name::text
  WHERE sn.queue_name IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM flow_queues AS fq
                     WHERE fq.q_table = q.q_table AND fq.flow_slug = sn.flow_slug)
),
task_dups AS (
  SELECT t.queue_name,
         count(*) AS duplicated_ids,
         sum(t.tasks) AS tasks,
         (array_agg(t.message_id ORDER BY t.message_id))[1:10] AS sample_message_ids,
         (SELECT array_agg(f.flow_slug ORDER BY f.flow_slug COLLATE "C")
            FROM flows_x AS f WHERE f.default_queue = t.queue_name) AS flows
  FROM (
    SELECT (lower(st.flow_slug COLLATE "C") COLLATE "default") AS queue_name,
           st.message_id,
           count(*) AS tasks
    FROM pgflow.step_tasks AS st
    WHERE st.message_id IS NOT NULL
      AND NOT EXISTS (
        SELECT 1
        FROM pg_catalog.pg_attribute AS a
        JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
        JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'pgflow' AND c.relname = 'step_tasks'
          AND a.attname = 'queue_name' AND a.attnum > 0 AND NOT a.attisdropped)
    GROUP BY 1, 2
    HAVING count(*) > 1
  ) AS t
  GROUP BY t.queue_name
),
-- the next message id each PGMQ queue table will hand out (NULL: the role may not read its sequence)
queue_next_ids AS (
  SELECT c.relname::text AS q_table,
         CASE WHEN has_sequence_privilege(sc.oid, 'SELECT')
              THEN coalesce(ps.last_value + ps.increment_by, ps.start_value) END AS next_id
  FROM pg_catalog.pg_class AS c
  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'pgmq'
  JOIN pg_catalog.pg_depend AS d ON d.refobjid = c.oid AND d.classid = 'pg_catalog.pg_class'::regclass
                                AND d.deptype IN ('a', 'i')
  JOIN pg_catalog.pg_class AS sc ON sc.oid = d.objid AND sc.relkind = 'S'
  JOIN pg_catalog.pg_sequences AS ps ON ps.schemaname = 'pgmq' AND ps.sequencename = sc.relname
  WHERE c.relname LIKE 'q\_%'
),
-- a flow's default queue as the released create_flow made it (pgmq.create(flow_slug): tables
-- named by lower(flow_slug) in the database collation) against the queue its tasks are routed
-- to (lower(flow_slug COLLATE "C")); rows only where the two are different physical tables
legacy_elsewhere AS (
  SELECT fq.flow_slug,
         fq.queue_name AS routed_queue,
         fq.q_table AS routed_q_table,
         coalesce(rq.has_queue_table, false) AS routed_has_queue_table,
         coalesce(rq.has_archive_table, false) AS routed_has_archive_table,
         lq.q_table AS legacy_q_table,
         lq.a_table AS legacy_a_table,
         lq.spellings AS legacy_spellings,
         lq.has_queue_table AS legacy_has_queue_table,
         coalesce(tf.queued_tasks, 0) AS queued_tasks,
         coalesce(tf.started_tasks, 0) AS started_tasks,
         tf.max_message_id,
         nx.next_id AS routed_next_message_id
  FROM flow_queues AS fq
  JOIN queues AS lq ON lq.q_table = ('q_' || lower(fq.flow_slug))::name::text
  LEFT JOIN queues AS rq ON rq.q_table = fq.q_table
  -- per flow: the tasks that still need their queue, queued (a message waits) or started (it will
  -- be archived), and the highest message id any task holds (they all came from the flow's legacy
  -- queue). Read only for a flow whose two tables differ (a constant condition inside: no scan of
  -- the task table otherwise, which matters under a migration's exclusive locks)
  LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE st.status = 'queued') AS queued_tasks,
           count(*) FILTER (WHERE st.status = 'started') AS started_tasks,
           max(st.message_id) AS max_message_id
    FROM pgflow.step_tasks AS st
    WHERE st.flow_slug = fq.flow_slug AND lq.q_table <> fq.q_table
  ) AS tf ON true
  LEFT JOIN queue_next_ids AS nx ON nx.q_table = fq.q_table
  WHERE fq.origin = 'default'
    AND lq.q_table <> fq.q_table
    AND (NOT coalesce(rq.has_queue_table, false) OR NOT coalesce(rq.has_archive_table, false)
         OR coalesce(tf.queued_tasks, 0) + coalesce(tf.started_tasks, 0) > 0
         -- the tasks' old message ids would collide with the routed queue's new ones
         OR (tf.max_message_id IS NOT NULL AND coalesce(nx.next_id <= tf.max_message_id, true)))
),
database_collation AS (
  SELECT coalesce(to_jsonb(d) ->> 'daticulocale', to_jsonb(d) ->> 'datlocale', d.datcollate::text) AS collation_name,
         coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') AS provider
  FROM pg_catalog.pg_database AS d
  WHERE d.datname = current_database()
),
findings AS (
  -- flow slugs the new rules reject
  SELECT 'flow_slug_rejected' AS check_id, 'error' AS severity, true AS blocking,
         f.flow_slug, NULL::text AS step_slug, 'flow' AS object_type, f.flow_slug AS object_name,
         r.reasons,
         jsonb_build_object('length', length(f.flow_slug), 'suggested_slug', r.suggested_slug,
                            'related_flows', jsonb_build_array(f.flow_slug)) AS evidence,
         format('flow slug "%s" %s', f.flow_slug, r.reason_words) AS message,
         'Define a new concrete flow under a compliant slug (letters and digits, single inner underscores, '
         || 'starting with a letter), move workers and callers to it, let the old flow''s runs finish, '
         || 'then delete the old flow. pgflow never renames a flow.' AS fix
  FROM flows_x AS f
  JOIN slug_report AS r ON r.slug = f.flow_slug

  UNION ALL
  -- step slugs the new rules reject
  SELECT 'step_slug_rejected', 'error', true,
         s.flow_slug, s.step_slug, 'step', s.step_slug,
         r.reasons,
         jsonb_build_object('length', length(s.step_slug), 'step_index', s.step_index,
                            'suggested_slug', r.suggested_slug,
                            'related_flows', jsonb_build_array(s.flow_slug)),
         format('step slug "%s" of flow "%s" %s', s.step_slug, s.flow_slug, r.reason_words),
         'Step slugs are part of the flow''s shape: define a new concrete flow (a new flow slug) whose steps '
         || 'use compliant slugs, move workers and callers to it, let the old flow drain, then delete it.'
  FROM steps_x AS s
  JOIN slug_report AS r ON r.slug = s.step_slug

  UNION ALL
  -- flow slugs equal ignoring case: one row per group member, naming the whole group
  SELECT 'flow_slug_case_conflict', 'error', true,
         f.flow_slug, NULL, 'flow', f.flow_slug,
         ARRAY['case_only_duplicate'],
         jsonb_build_object('normalized', g.norm, 'group', to_jsonb(g.members),
                            'related_flows', to_jsonb(g.members)),
         format('flow slug "%s" differs only by letter case from %s; all of them share the PGMQ tables of queue "%s"',
                f.flow_slug,
                (SELECT string_agg(format('"%s"', m), ', ' ORDER BY m COLLATE "C")
                   FROM unnest(g.members) AS m WHERE m <> f.flow_slug),
                g.norm),
         'Keep at most one flow of this group: replace every other member by a new concrete flow whose slug '
         || 'differs by more than letter case, move workers and callers to it, drain and delete the old one.'
  FROM flows_x AS f
  JOIN (
    SELECT lower(flow_slug COLLATE "C") AS norm,
           array_agg(flow_slug ORDER BY flow_slug COLLATE "C") AS members
    FROM flows_x
    GROUP BY 1
    HAVING count(*) > 1
  ) AS g ON g.norm = lower(f.flow_slug COLLATE "C")

  UNION ALL
  -- step slugs equal ignoring case within one flow
  SELECT 'step_slug_case_conflict', 'error', true,
         s.flow_slug, s.step_slug, 'step', s.step_slug,
         ARRAY['case_only_duplicate'],
         jsonb_build_object('normalized', g.norm, 'group', to_jsonb(g.members),
                            'related_flows', jsonb_build_array(s.flow_slug)),
         format('step slug "%s" of flow "%s" differs only by letter case from %s',
                s.step_slug, s.flow_slug,
                (SELECT string_agg(format('"%s"', m), ', ' ORDER BY m COLLATE "C")
                   FROM unnest(g.members) AS m WHERE m <> s.step_slug)),
         'Define a new concrete flow whose step slugs differ by more than letter case, move workers and '
         || 'callers to it, let this flow drain, then delete it.'
  FROM steps_x AS s
  JOIN (
    SELECT flow_slug,
           lower(step_slug COLLATE "C") AS norm,
           array_agg(step_slug ORDER BY step_slug COLLATE "C") AS members
    FROM steps_x
    GROUP BY 1, 2
    HAVING count(*) > 1
  ) AS g ON g.flow_slug = s.flow_slug AND g.norm = lower(s.step_slug COLLATE "C")

  UNION ALL
  -- several pgmq.meta rows naming the same physical tables
  SELECT 'queue_alias_conflict', 'error', true,
         om.flow_slug, NULL, 'queue', mr.spelling,
         ARRAY['same_physical_table'],
         jsonb_build_object('group', to_jsonb(q.spellings), 'queue_table', q.q_table,
                            'archive_table', q.a_table,
                            'related_flows', coalesce(to_jsonb(om.owners), '[]'::jsonb)),
         format('PGMQ queue "%s" and %s are separate pgmq.meta rows for the same tables pgmq.%s / pgmq.%s',
                mr.spelling,
                (SELECT string_agg(format('"%s"', m), ', ' ORDER BY m COLLATE "C")
                   FROM unnest(q.spellings) AS m WHERE m <> mr.spelling),
                q.q_table, q.a_table),
         CASE
           -- this spelling is the one a flow uses, and no other spelling of the group is used
           WHEN coalesce(om.matches_owner, false) AND NOT EXISTS (
                  SELECT 1 FROM owned_meta AS o2
                  WHERE o2.q_table = mr.q_table AND o2.spelling <> mr.spelling AND o2.matches_owner)
             THEN format('Keep this row: flow "%s" uses this spelling. Remove the surplus row(s) with DELETE FROM '
                         || 'pgmq.meta WHERE queue_name IN (%s); never pgmq.drop_queue() a spelling, because that '
                         || 'drops the tables this flow still uses.',
                         om.flow_slug,
                         (SELECT string_agg(quote_literal(m), ', ' ORDER BY m COLLATE "C")
                            FROM unnest(q.spellings) AS m WHERE m <> mr.spelling))
           -- no flow uses this spelling, another spelling of the group is in use: this row is surplus
           WHEN NOT coalesce(om.matches_owner, false) AND EXISTS (
                  SELECT 1 FROM owned_meta AS o2
                  WHERE o2.q_table = mr.q_table AND o2.spelling <> mr.spelling AND o2.matches_owner)
             THEN format('This row is surplus: no flow uses the spelling "%s". Remove it with DELETE FROM pgmq.meta '
                         || 'WHERE queue_name = %L; never pgmq.drop_queue() it, because that drops the tables the '
                         || 'other spelling still uses.', mr.spelling, mr.spelling)
           ELSE 'Resolve the flows behind the other spellings first (see flow_slug_case_conflict). Then remove only '
                || 'the surplus pgmq.meta row (DELETE FROM pgmq.meta WHERE queue_name = <exact spelling>); never '
                || 'pgmq.drop_queue() one spelling, because that drops the tables the other spelling still uses.'
         END
  FROM meta_rows AS mr
  JOIN queues AS q ON q.q_table = mr.q_table
  LEFT JOIN owned_meta AS om ON om.spelling = mr.spelling
  WHERE cardinality(q.spellings) > 1

  UNION ALL
  -- a flow's default queue name over PGMQ's limits
  SELECT 'flow_queue_name_too_long', 'error', true,
         f.flow_slug, NULL, 'queue', f.default_queue,
         ARRAY(SELECT code FROM (VALUES
                 (1, 'too_many_characters', length(f.default_queue) > 47),
                 (2, 'too_many_bytes', octet_length('q_' || f.default_queue) > 63)) AS v(ord, code, hit)
               WHERE hit ORDER BY ord),
         jsonb_build_object('queue_name', f.default_queue, 'characters', length(f.default_queue),
                            'table_name_bytes', octet_length('q_' || f.default_queue),
                            'max_characters', 47, 'max_table_name_bytes', 63,
                            'related_flows', jsonb_build_array(f.flow_slug)),
         format('flow "%s" needs the queue name "%s" (%s characters), longer than PGMQ''s limit of 47',
                f.flow_slug, f.default_queue, length(f.default_queue)),
         'Define a new concrete flow whose slug has at most 47 characters, move workers and callers to it, '
         || 'let this flow drain, then delete it.'
  FROM flows_x AS f
  WHERE f.queue_mode <> 'step'
    AND (length(f.default_queue) > 47 OR octet_length('q_' || f.default_queue) > 63)

  UNION ALL
  -- existing queues (not a flow's) over PGMQ's limits
  SELECT 'queue_name_too_long', 'error', false,
         NULL, NULL, 'queue', q.display_name,
         ARRAY(SELECT code FROM (VALUES
                 (1, 'too_many_characters', q.max_chars > 47),
                 (2, 'too_many_bytes', q.max_bytes > 63)) AS v(ord, code, hit)
               WHERE hit ORDER BY ord),
         jsonb_build_object('characters', q.max_chars, 'table_name_bytes', q.max_bytes,
                            'max_characters', 47, 'max_table_name_bytes', 63,
                            'queue_table', q.q_table, 'related_flows', '[]'::jsonb),
         format('PGMQ queue "%s" has %s characters and a %s-byte table name; PGMQ allows 47 characters '
                || 'and PostgreSQL cuts identifiers at 63 bytes, so its table is really pgmq.%s',
                q.display_name, q.max_chars, q.max_bytes, q.q_table),
         'Not a pgflow queue: rename it in the application that uses it (a new, shorter queue), or drop it '
         || 'with pgmq.drop_queue(<exact spelling>) if nothing uses it.'
  FROM queues AS q
  WHERE (q.max_chars > 47 OR q.max_bytes > 63)
    AND NOT EXISTS (SELECT 1 FROM flow_queues AS fq WHERE fq.q_table = q.q_table)

  UNION ALL
  -- a queue a flow routes tasks to has no queue table or no archive table: its tasks get stuck
  SELECT 'flow_queue_missing', 'error', true,
         fq.flow_slug, NULL, 'queue', fq.queue_name,
         m.reasons,
         jsonb_build_object('queue_name', fq.queue_name, 'origin', fq.origin,
                            'meta_row', coalesce(cardinality(q.spellings), 0) > 0,
                            'queue_table', coalesce(q.has_queue_table, false),
                            'archive_table', coalesce(q.has_archive_table, false),
                            'queue_table_name', fq.q_table,
                            'queued_tasks', coalesce(tf.queued_tasks, 0), 'started_tasks', coalesce(tf.started_tasks, 0),
                            'related_flows', jsonb_build_array(fq.flow_slug)),
         format('queue "%s" of flow "%s" %s: %s', fq.queue_name, fq.flow_slug,
                (SELECT string_agg(rt.words, '; ' ORDER BY u.ord)
                   FROM unnest(m.reasons) WITH ORDINALITY AS u(code, ord)
                   JOIN reason_text AS rt ON rt.code = u.code),
                CASE WHEN NOT coalesce(q.has_queue_table, false)
                     THEN 'starting a run of this flow fails (its first message cannot be sent) and no worker '
                          || 'can read its queued tasks, so they stay queued'
                     ELSE 'runs start and workers read its messages, but completing or failing a task must '
                          || 'archive or delete its message, which fails without the archive table, on every '
                          || 'attempt, so tasks stay started (the queue-identity claim refuses such a batch as '
                          || 'fatal before any handler runs and pauses the worker function)'
                END),
         format('Recreate it with SELECT pgmq.create(%L) before migrating; that adds whatever is missing and '
                || 'keeps what exists. Delete the flow instead if it is no longer used.', fq.queue_name)
  FROM flow_queues AS fq
  LEFT JOIN queues AS q ON q.q_table = fq.q_table
  -- the flow's queued and started tasks, read only for a queue that lacks a table
  LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE st.status = 'queued') AS queued_tasks,
           count(*) FILTER (WHERE st.status = 'started') AS started_tasks
    FROM pgflow.step_tasks AS st
    WHERE st.flow_slug = fq.flow_slug
      AND (NOT coalesce(q.has_queue_table, false) OR NOT coalesce(q.has_archive_table, false))
  ) AS tf ON true
  CROSS JOIN LATERAL (
    SELECT ARRAY(SELECT code FROM (VALUES
             (1, 'meta_row_missing', coalesce(cardinality(q.spellings), 0) = 0),
             (2, 'queue_table_missing', NOT coalesce(q.has_queue_table, false)),
             (3, 'archive_table_missing', NOT coalesce(q.has_archive_table, false))) AS v(ord, code, hit)
           WHERE hit ORDER BY ord) AS reasons
  ) AS m
  WHERE (NOT coalesce(q.has_queue_table, false) OR NOT coalesce(q.has_archive_table, false))
    AND NOT EXISTS (SELECT 1 FROM legacy_elsewhere AS le
                     WHERE le.flow_slug = fq.flow_slug AND fq.origin = 'default')

  UNION ALL
  -- a queue a flow uses has both tables but no pgmq.meta row
  SELECT 'flow_queue_meta_missing', 'warning', false,
         fq.flow_slug, NULL, 'queue', fq.queue_name,
         ARRAY['meta_row_missing'],
         jsonb_build_object('queue_name', fq.queue_name, 'origin', fq.origin, 'queue_table_name', fq.q_table,
                            'related_flows', jsonb_build_array(fq.flow_slug)),
         format('queue "%s" of flow "%s" has its tables but no pgmq.meta row: sending, reading and archiving '
                || 'work, but pgmq.list_queues(), pgmq.metrics() and pgmq.drop_queue() do not see it',
                fq.queue_name, fq.flow_slug),
         format('SELECT pgmq.create(%L) adds the missing row and keeps the tables and their messages.', fq.queue_name)
  FROM flow_queues AS fq
  JOIN queues AS q ON q.q_table = fq.q_table
  WHERE q.has_queue_table AND q.has_archive_table AND cardinality(q.spellings) = 0

  UNION ALL
  -- a legacy queue whose tables the routed (ASCII-lowercase) queue name does not reach
  SELECT 'flow_queue_table_elsewhere', 'error', true,
         le.flow_slug, NULL, 'queue', le.routed_queue,
         ARRAY['routed_queue_table_elsewhere']
           || ARRAY(SELECT code FROM (VALUES
                (1, 'queue_table_missing', NOT le.routed_has_queue_table),
                (2, 'archive_table_missing', NOT le.routed_has_archive_table)) AS v(ord, code, hit)
              WHERE hit ORDER BY ord),
         jsonb_build_object('routed_queue', le.routed_queue, 'routed_queue_table', le.routed_q_table,
                            'routed_queue_table_exists', le.routed_has_queue_table,
                            'legacy_queue_table', le.legacy_q_table, 'legacy_archive_table', le.legacy_a_table,
                            'legacy_meta_spellings', to_jsonb(le.legacy_spellings),
                            'queued_tasks', le.queued_tasks, 'started_tasks', le.started_tasks,
                            'max_task_message_id', le.max_message_id,
                            'routed_next_message_id', le.routed_next_message_id,
                            'collation', dc.collation_name, 'collation_provider', dc.provider,
                            'related_flows', jsonb_build_array(le.flow_slug)),
         format('PGMQ keeps the messages of flow "%s" in pgmq.%s (it lowercased "%s" with this database''s '
                || 'collation %s), but the queue-identity release routes the flow''s tasks to queue "%s", whose '
                || 'table is pgmq.%s%s: after the upgrade its %s queued task(s) can never be read and its %s '
                || 'started task(s) can never be completed, and new runs %s',
                le.flow_slug, le.legacy_q_table, le.flow_slug, dc.collation_name, le.routed_queue,
                le.routed_q_table, CASE WHEN le.routed_has_queue_table THEN '' ELSE ' (it does not exist)' END,
                le.queued_tasks, le.started_tasks,
                CASE WHEN le.routed_has_queue_table AND le.routed_has_archive_table
                     THEN 'go to a different queue than the old workers poll'
                     ELSE 'cannot start' END),
         format('Do not migrate yet. Stop starting runs of flow "%s" and let its open tasks finish with the old '
                || 'workers (audit again until it reports no queued or started task). Then create the queue the '
                || 'upgrade routes to and start its message ids after the ones the flow''s tasks hold (the upgrade '
                || 'makes (queue, message id) unique): SELECT pgmq.create(%L); SELECT pg_catalog.setval('
                || 'pg_catalog.pg_get_serial_sequence(%L, ''msg_id''), %s). Or replace the flow with a new concrete '
                || 'flow whose slug this collation lowercases like ASCII (in tr-TR/az: no capital I).',
                le.flow_slug, le.routed_queue, format('pgmq.%I', le.routed_q_table), greatest(le.max_message_id, 1))
  FROM legacy_elsewhere AS le
  CROSS JOIN database_collation AS dc

  UNION ALL
  -- a flow's pgmq.meta row spelled otherwise than its canonical lowercase name
  -- info when PGMQ lists the queue exactly as the flow is spelled (the normal legacy camelCase
  -- case, handled by the upgrade); warning when the listed spelling is not the flow's.
  SELECT 'queue_meta_spelling', CASE WHEN om.matches_owner THEN 'info' ELSE 'warning' END, false,
         om.flow_slug, NULL, 'queue', om.spelling,
         ARRAY(SELECT code FROM (VALUES
                 (1, 'not_lowercase', om.spelling <> lower(om.spelling COLLATE "C")),
                 (2, 'differs_from_flow_slug', NOT om.matches_owner)) AS v(ord, code, hit)
               WHERE hit ORDER BY ord),
         jsonb_build_object('meta_spelling', om.spelling, 'canonical', lower(om.spelling COLLATE "C"),
                            'queue_table', om.q_table, 'related_flows', to_jsonb(om.owners)),
         format('pgmq.meta spells the queue of flow "%s" as "%s"; the queue-identity release names it "%s"',
                om.flow_slug, om.spelling, lower(om.spelling COLLATE "C")),
         format('Nothing breaks: PGMQ''s message functions lowercase the name, so the queue keeps working. '
                || 'But pgmq.drop_queue() and other metadata lookups need the exact spelling: use %L when you '
                || 'drop or inspect this queue by hand.', om.spelling)
  FROM owned_meta AS om
  WHERE om.spelling <> lower(om.spelling COLLATE "C") OR NOT om.matches_owner

  UNION ALL
  -- an existing queue already has the name a flow would generate for a private step queue
  SELECT 'step_queue_collision', 'warning', false,
         c.flow_slug, c.step_slug, 'queue', c.display_name,
         ARRAY['generated_step_queue_name'],
         jsonb_build_object('generated_name', c.generated_name, 'name_kind', c.name_kind,
                            'step_index', c.step_index, 'meta_row', cardinality(c.spellings) > 0,
                            'queue_table', c.has_queue_table, 'archive_table', c.has_archive_table,
                            'related_flows', jsonb_build_array(c.flow_slug)),
         format('queue "%s" already exists, and it is the private queue flow "%s" would generate for step "%s"',
                c.display_name, c.flow_slug, c.step_slug),
         format('Only matters if flow "%s" opts into private step queues: pgflow refuses to adopt a queue it did '
                || 'not create. Drop the queue first if it is unused (pgmq.drop_queue(%L)), or keep the flow on '
                || 'its default queue.', c.flow_slug, c.display_name)
  FROM collisions AS c

  UNION ALL
  -- queues no flow owns
  SELECT 'queue_unowned', 'info', false,
         NULL, NULL, 'queue', q.display_name,
         ARRAY['no_owning_flow'],
         jsonb_build_object('meta_row', cardinality(q.spellings) > 0, 'queue_table', q.has_queue_table,
                            'archive_table', q.has_archive_table, 'queue_table_name', q.q_table,
                            'related_flows', '[]'::jsonb),
         format('PGMQ queue "%s" is not the queue of any flow', q.display_name),
         'Nothing to do if another application uses it; pgflow leaves it alone. If it is left over from a '
         || format('deleted flow, drop it with pgmq.drop_queue(%L).', q.display_name)
  FROM queues AS q
  WHERE NOT EXISTS (SELECT 1 FROM flow_queues AS fq WHERE fq.q_table = q.q_table)
    AND NOT EXISTS (SELECT 1 FROM collisions AS c WHERE c.q_table = q.q_table)
    AND NOT EXISTS (SELECT 1 FROM legacy_elsewhere AS le WHERE le.legacy_q_table = q.q_table)

  UNION ALL
  -- flows whose private step queue names cannot be generated
  SELECT 'step_queues_unavailable', 'info', false,
         sn.flow_slug, NULL, 'flow', sn.flow_slug,
         ARRAY['queue_name_too_long'],
         jsonb_build_object(
           'steps', jsonb_agg(jsonb_build_object(
                      'step_slug', sn.step_slug, 'step_index', sn.step_index,
                      'readable_length', length(sn.flow_slug || '__' || sn.step_slug),
                      'index_length', length(sn.flow_slug || '__' || sn.step_index::text))
                    ORDER BY sn.step_index),
           'related_flows', jsonb_build_array(sn.flow_slug)),
         format('flow "%s" cannot use private step queues: for %s step(s) neither "%s__<step>" nor "%s__<index>" '
                || 'fits in 47 characters', sn.flow_slug, count(*), lower(sn.flow_slug COLLATE "C"),
                lower(sn.flow_slug COLLATE "C")),
         'Nothing to do while the flow keeps its default queue. To use private step queues, define a new '
         || 'concrete flow with a shorter slug (at most 44 characters leaves room for 10 steps).'
  FROM step_names AS sn
  WHERE sn.queue_name IS NULL
  GROUP BY sn.flow_slug

  UNION ALL
  -- message ids that repeat within one queue (the upgrade's unique index would fail)
  SELECT 'task_message_id_duplicate', 'error', true,
         d.flows[1], NULL, 'queue', d.queue_name,
         ARRAY['duplicate_message_id'],
         jsonb_build_object('duplicated_message_ids', d.duplicated_ids, 'tasks', d.tasks,
                            'sample_message_ids', to_jsonb(d.sample_message_ids),
                            'related_flows', to_jsonb(d.flows)),
         format('%s message id(s) of queue "%s" are held by more than one task (%s tasks); the upgrade makes '
                || '(queue_name, message_id) unique', d.duplicated_ids, d.queue_name, d.tasks),
         'The queue was dropped and re-created while old task rows kept their message ids. Delete the old, '
         || 'finished runs that hold them (see docs/audit.md) before migrating.'
  FROM task_dups AS d
)
SELECT check_id, severity, blocking, flow_slug, step_slug, object_type, object_name,
       reasons, evidence, message, fix
FROM findings
ORDER BY CASE severity WHEN 'error' THEN 1 WHEN 'warning' THEN 2 ELSE 3 END,
         flow_slug COLLATE "C" NULLS LAST,
         check_id COLLATE "C",
         step_slug COLLATE "C" NULLS FIRST,
         object_name COLLATE "C"
