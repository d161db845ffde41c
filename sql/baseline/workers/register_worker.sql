--@note Protocol-1 baseline: pgflow.register_worker as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/workers/register_worker.sql.
-- Registers a starting worker: tracks its function and inserts its worker row. A fenced
-- function (worker_functions.enabled = false) is refused with SQLSTATE PF001 and nothing is
-- written. The function row is locked by the upsert, so a concurrent fence either waits for
-- this registration (and then sees the worker) or wins and makes it fail.
--@include functions/workers/register_worker.sql lines=5-9
  step_slug text DEFAULT NULL
--@include functions/workers/register_worker.sql lines=12-20
--@include functions/workers/register_worker.sql lines=23-25
--@include functions/workers/register_worker.sql lines=56-63
    RAISE EXCEPTION 'worker function "%" is fenced (pgflow.worker_functions.enabled = false): worker % may not register',
      register_worker.function_name, register_worker.worker_id
      USING ERRCODE = 'PF001',
            HINT = 'a rollout disabled this function; finish the rollout and enable it again (UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = ...)';
  END IF;

  INSERT INTO pgflow.workers (worker_id, queue_name, function_name, flow_slug, step_slug, started_at, last_heartbeat_at)
  VALUES (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
          register_worker.flow_slug, register_worker.step_slug, pg_catalog.now(), pg_catalog.clock_timestamp());
END;
$$;
