-- Every problem of a startup shape that the database would reject, before anything changes, in
-- step order: slug rules, case-only and exact duplicates, step type and execution mode, dependencies (must name an
-- earlier step; a map step takes at most one), whenUnmet/whenExhausted and option values.
CREATE OR REPLACE FUNCTION pgflow._shape_problems(p_flow_slug text, p_shape jsonb)
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
    SELECT s.idx, 3, pg_catalog.format('step %s (index %s): executionMode must be queue or manual, not %s',
                                       s.label, s.idx, s.e -> 'executionMode')
    FROM steps AS s
    WHERE s.e ? 'executionMode' AND coalesce(s.e ->> 'executionMode', '') NOT IN ('queue', 'manual')
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
