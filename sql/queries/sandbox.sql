-- Queries of `pgflow sandbox`.

--@name database_exists
SELECT 1 FROM pg_database WHERE datname = %(name)s;

--@name counts
SELECT (SELECT count(*) FROM pgflow.flows)                          AS flows,
       (SELECT count(*) FROM pgflow.runs WHERE status = 'started')  AS runs_in_flight;
--@end
