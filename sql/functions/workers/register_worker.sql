-- Registration checks the route: a worker of a concrete flow polls exactly that flow's queue, a
-- step worker exactly its step's private queue (PF004 otherwise), so coverage can trust worker
-- rows. worker_version is free text the worker reports (its release), shown by `pgflow coverage`;
-- callers that do not pass it register as before.
CREATE OR REPLACE FUNCTION pgflow.register_worker(
  worker_id uuid,
  function_name text,
  queue_name text,
  flow_slug text,
  step_slug text DEFAULT NULL,
  worker_version text DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_enabled boolean;
  v_mode text;
  v_route text;
BEGIN
  IF register_worker.worker_id IS NULL OR register_worker.function_name IS NULL OR register_worker.queue_name IS NULL THEN
    RAISE EXCEPTION 'register_worker(): worker_id, function_name and queue_name are required' USING ERRCODE = '22004';
  END IF;

  IF register_worker.flow_slug IS NOT NULL THEN
    SELECT f.queue_mode INTO v_mode FROM pgflow.flows AS f WHERE f.flow_slug = register_worker.flow_slug;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'worker % names flow "%", which does not exist', register_worker.worker_id, register_worker.flow_slug
        USING ERRCODE = 'PF006', HINT = 'workers compile their flow (ensure_flow_compiled) before registering';
    END IF;
    IF v_mode = 'flow' THEN
      v_route := pg_catalog.lower(register_worker.flow_slug COLLATE "C");
      IF register_worker.step_slug IS NOT NULL THEN
        RAISE EXCEPTION 'worker % selects step "%" of flow "%", which has no private step queues',
          register_worker.worker_id, register_worker.step_slug, register_worker.flow_slug
          USING ERRCODE = 'PF004', HINT = 'start a whole-flow worker (no step) for a plain flow';
      END IF;
    ELSE
      SELECT s.queue_name INTO v_route FROM pgflow.steps AS s
      WHERE s.flow_slug = register_worker.flow_slug AND s.step_slug = register_worker.step_slug;
      IF v_route IS NULL THEN
        RAISE EXCEPTION 'worker % of step-queued flow "%" must select one of its steps (got %)',
          register_worker.worker_id, register_worker.flow_slug, coalesce(pg_catalog.quote_literal(register_worker.step_slug), 'none')
          USING ERRCODE = 'PF004';
      END IF;
    END IF;
    IF register_worker.queue_name IS DISTINCT FROM v_route THEN
      RAISE EXCEPTION 'worker % would poll queue "%", but the route of flow "%"% is queue "%"',
        register_worker.worker_id, register_worker.queue_name, register_worker.flow_slug,
        coalesce(' step "' || register_worker.step_slug || '"', ''), v_route
        USING ERRCODE = 'PF004', HINT = 'worker and database must derive the same queue names: upgrade them together';
    END IF;
  END IF;

  INSERT INTO pgflow.worker_functions AS wf (function_name, updated_at)
  VALUES (register_worker.function_name, pg_catalog.clock_timestamp())
  ON CONFLICT (function_name) DO UPDATE SET updated_at = pg_catalog.clock_timestamp()
  RETURNING wf.enabled INTO v_enabled;

  IF NOT v_enabled THEN
    RAISE EXCEPTION 'worker function "%" is disabled (pgflow.worker_functions.enabled = false): worker % may not register',
      register_worker.function_name, register_worker.worker_id
      USING ERRCODE = 'PF001',
            HINT = 'a rollout fence or a fatal claim paused this function (see worker_functions.paused_reason); enable it again when the rollout is done (docs/upgrade.md step 7) or once the cause is fixed (docs/claim-protocol.md)';
  END IF;

  INSERT INTO pgflow.workers (worker_id, queue_name, function_name, flow_slug, step_slug, started_at, last_heartbeat_at,
                              worker_version)
  VALUES (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
          register_worker.flow_slug, register_worker.step_slug, pg_catalog.now(), pg_catalog.clock_timestamp(),
          register_worker.worker_version);
END;
$$;
