-- Enabling a function again clears the reason a fatal claim recorded.
CREATE OR REPLACE FUNCTION pgflow._clear_pause_on_enable()
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
CREATE OR REPLACE TRIGGER worker_functions_clear_pause
  BEFORE UPDATE OF enabled ON pgflow.worker_functions
  FOR EACH ROW WHEN (NEW.enabled AND NOT OLD.enabled)
  EXECUTE FUNCTION pgflow._clear_pause_on_enable();
