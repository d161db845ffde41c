    -- one primary-key probe per task, whatever the table size
    JOIN LATERAL (
      SELECT st.queue_name, st.message_id FROM pgflow.step_tasks AS st
      WHERE st.run_id = k.run_id AND st.step_slug = k.step_slug AND st.task_index = k.task_index
      LIMIT 1  -- the primary key; keeps the planner from flattening this into a hash join
    ) AS t ON true
    WHERE t.message_id IS NOT NULL
    GROUP BY t.queue_name
    ORDER BY t.queue_name
