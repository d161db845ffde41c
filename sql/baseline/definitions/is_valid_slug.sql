--@note Protocol-1 baseline: pgflow.is_valid_slug as migration 0001 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/definitions/is_valid_slug.sql.
-- Released slug rule. Replaced (not weakened) by the queue-identity migration.
--@include functions/definitions/is_valid_slug.sql lines=1-4
SET search_path = ''
AS $$
  SELECT slug IS NOT NULL
     AND slug <> ''
     AND length(slug) <= 128
     AND (slug COLLATE "C") ~ '^[A-Za-z_][A-Za-z0-9_]*$'
     AND slug <> 'run'
$$;
