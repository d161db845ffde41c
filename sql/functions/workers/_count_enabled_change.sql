-- Trigger of worker_functions: counts each change of enabled's value (the fence's compare-and-set key).
CREATE OR REPLACE FUNCTION pgflow._count_enabled_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = ''
AS $$
BEGIN
  NEW.enabled_changes := OLD.enabled_changes + 1;
  RETURN NEW;
END;
$$;

REVOKE ALL ON FUNCTION pgflow._count_enabled_change() FROM PUBLIC;
