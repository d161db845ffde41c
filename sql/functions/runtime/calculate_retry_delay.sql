-- Delay before the next attempt. attempts_count has already been incremented by the claim, so
-- the first retry waits 2 * base_delay, the second 4 * base_delay, and so on.
CREATE OR REPLACE FUNCTION pgflow.calculate_retry_delay(base_delay numeric, attempts_count integer)
RETURNS integer
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$
  SELECT pg_catalog.floor(base_delay * pg_catalog.power(2::numeric, attempts_count::numeric))::integer
$$;
