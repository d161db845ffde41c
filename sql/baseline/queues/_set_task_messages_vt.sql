--@note Protocol-1 baseline: pgflow._set_task_messages_vt as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/queues/_set_task_messages_vt.sql.
-- Sets vt = clock_timestamp() + offset seconds on the messages of the given tasks (matched by
-- position in the four arrays), one UPDATE per queue. Returns how many messages it found and
-- changed; a caller that needs every message (start_tasks) compares that with its own count.
--@include functions/queues/_set_task_messages_vt.sql lines=1-20
    SELECT t.flow_slug,
--@include functions/queues/_set_task_messages_vt.sql lines=22-29
    JOIN pgflow.step_tasks AS t
      ON t.run_id = k.run_id AND t.step_slug = k.step_slug AND t.task_index = k.task_index
    WHERE t.message_id IS NOT NULL
    GROUP BY t.flow_slug
    ORDER BY t.flow_slug
  LOOP
    EXECUTE pg_catalog.format(
      'UPDATE pgmq.%I AS q
          SET vt = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => v.vt_offset)
         FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::integer[])) AS v (msg_id, vt_offset)
        WHERE q.msg_id = v.msg_id',
--@include functions/queues/_set_task_messages_vt.sql lines=39-46
