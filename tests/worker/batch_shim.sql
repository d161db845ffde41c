-- TEST SCAFFOLDING (issue 18), not part of the product: stand-ins for pgflow.complete_tasks(jsonb)
-- and pgflow.fail_tasks(jsonb), which migration 0010 adds. tests/worker/batch.py installs them
-- only in a test database that lacks the real ones, so the worker's batch path can be tested on
-- a schema without 0010; on a schema with 0010 the real functions are tested and this file is not
-- used. Each stand-in applies its elements in array order through the single-task function, in
-- one statement (so all or nothing).
CREATE FUNCTION pgflow.complete_tasks(tasks jsonb) RETURNS SETOF pgflow.step_tasks
LANGUAGE sql AS $$
  SELECT t.* FROM jsonb_array_elements(tasks) WITH ORDINALITY AS e(item, ord),
       LATERAL pgflow.complete_task((e.item->>'run_id')::uuid, e.item->>'step_slug',
                                    (e.item->>'task_index')::integer, e.item->'output') AS t
  ORDER BY e.ord
$$;

CREATE FUNCTION pgflow.fail_tasks(tasks jsonb) RETURNS SETOF pgflow.step_tasks
LANGUAGE sql AS $$
  SELECT t.* FROM jsonb_array_elements(tasks) WITH ORDINALITY AS e(item, ord),
       LATERAL pgflow.fail_task((e.item->>'run_id')::uuid, e.item->>'step_slug',
                                (e.item->>'task_index')::integer, e.item->>'error_message') AS t
  ORDER BY e.ord
$$;

REVOKE ALL ON FUNCTION pgflow.complete_tasks(jsonb), pgflow.fail_tasks(jsonb) FROM PUBLIC;
