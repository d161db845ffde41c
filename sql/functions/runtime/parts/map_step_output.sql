                           -- a map step's output: its completed tasks' outputs in task_index order, [] for none
                           coalesce((SELECT pg_catalog.jsonb_agg(t.output ORDER BY t.task_index)
                                     FROM pgflow.step_tasks AS t
                                     WHERE t.run_id = ss.run_id AND t.step_slug = ss.step_slug AND t.status = 'completed'),
                                    '[]'::jsonb)
