-- Sends one realtime broadcast when realtime.send(jsonb, text, text, boolean) exists
-- (Supabase); does nothing anywhere else.
CREATE OR REPLACE FUNCTION pgflow._broadcast(payload jsonb, event text, topic text)
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
