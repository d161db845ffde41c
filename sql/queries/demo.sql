-- Queries of the sandbox demo (pgflow_cli.demo).

--@name start_run
SELECT run_id FROM pgflow.start_flow(%(flow_slug)s, %(input)s);

--@name runs_in_flight
SELECT count(*) FROM pgflow.runs WHERE status = 'started' AND flow_slug = ANY (%(flows)s::text[]);

--@name run_counts
SELECT status, count(*) FROM pgflow.runs GROUP BY status ORDER BY status;

--@name flow_slugs
SELECT flow_slug FROM pgflow.flows;

--@name requeue_stalled
SELECT pgflow.requeue_stalled_tasks();
--@end
