--@note Protocol-1 baseline: pgflow._archive_task_messages as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/queues/_archive_task_messages.sql.
-- Archives the messages of the given tasks (matched by position in the three arrays), one
-- pgmq.archive call per queue. Tasks without a message, unknown tasks and messages that are
-- already gone are skipped, so the call is idempotent. Returns how many messages it archived.
--@include functions/queues/_archive_task_messages.sql lines=1-14
    SELECT t.flow_slug,
           pg_catalog.array_agg(DISTINCT t.message_id ORDER BY t.message_id)
    FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes)) AS k (run_id, step_slug, task_index)
    JOIN pgflow.step_tasks AS t
      ON t.run_id = k.run_id AND t.step_slug = k.step_slug AND t.task_index = k.task_index
    WHERE t.message_id IS NOT NULL
    GROUP BY t.flow_slug
    ORDER BY t.flow_slug
--@include functions/queues/_archive_task_messages.sql lines=19-25
