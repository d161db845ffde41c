-- Queries of `pgflow sandbox`.

--@name database_exists
SELECT 1 FROM pg_database WHERE datname = %(name)s;

--@name local_mode
-- The database runs in local mode (pgflow.is_local()'s first rule): set by `pgflow sandbox up`.
SELECT coalesce(pg_catalog.current_setting('pgflow.environment', true), '') = 'local';

--@name counts
SELECT (SELECT count(*) FROM pgflow.flows)                          AS flows,
       (SELECT count(*) FROM pgflow.runs WHERE status = 'started')  AS runs_in_flight;
--@end
