-- pgflow prune: bounded history (docs/commands/prune.md). The batches themselves are the SQL
-- functions pgflow.prune_runs and pgflow.prune_archive (sql/functions/maintenance); these statements
-- only find them, fix the cutoff and name the queues.

--@name installed
-- Whether this database has the prune batches (migration 0003).
SELECT pg_catalog.to_regprocedure('pgflow.prune_runs(timestamptz, uuid, integer, boolean)') IS NOT NULL
   AND pg_catalog.to_regprocedure('pgflow.prune_archive(text, timestamptz, integer, boolean)') IS NOT NULL
   AS installed;

--@name cutoff
-- The one cutoff of a whole prune, on the server's clock: %(older_than)s seconds before now.
SELECT pg_catalog.now() - pg_catalog.make_interval(secs => %(older_than)s::double precision) AS cutoff;

--@name queues
-- The queues whose archives a prune reaches: every queue a step routes to.
SELECT DISTINCT s.queue_name FROM pgflow.steps AS s WHERE s.queue_name IS NOT NULL ORDER BY s.queue_name;

--@name runs
SELECT pgflow.prune_runs(%(cutoff)s, %(after)s, %(batch_size)s, %(dry_run)s) AS batch;

--@name archive
SELECT pgflow.prune_archive(%(queue_name)s, %(cutoff)s, %(batch_size)s, %(dry_run)s) AS rows;
--@end
