-- Starts many runs of one flow in one call: inputs is a JSON array of run inputs; one run
-- per element, created in array order, each with start_flow's semantics (root map inputs must be
-- arrays, start delays, empty-map cascades, realtime events per run). Errors as start_flow's,
-- a bad element named by its 0-based index; nothing is started then. Returns the runs in array
-- order (docs/runtime.md "Starting many runs"; core: _start_runs).
CREATE OR REPLACE FUNCTION pgflow.start_flows(flow_slug text, inputs jsonb)
RETURNS SETOF pgflow.runs
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  SELECT * FROM pgflow._start_runs('start_flows', flow_slug, inputs);
$$;
REVOKE ALL ON FUNCTION pgflow.start_flows(text, jsonb) FROM PUBLIC;
