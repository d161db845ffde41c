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
