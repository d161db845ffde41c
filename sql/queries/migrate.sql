-- Queries of `pgflow migrate` besides the ledger itself (sql/queries/installer.sql).

--@name blocking_sessions
-- Sessions blocking %(pid)s, without their query text (it may hold data or secrets).
SELECT a.pid,
       coalesce(nullif(a.application_name, ''), '(no application name)') AS application_name,
       a.state,
       a.usename                                                          AS user_name,
       extract(epoch FROM (clock_timestamp() - coalesce(a.xact_start, a.state_change)))::integer AS seconds,
       (SELECT string_agg(DISTINCT l.mode, ', ' ORDER BY l.mode)
          FROM pg_locks AS l
         WHERE l.pid = a.pid AND l.granted AND l.relation IS NOT NULL
           AND l.relation IN (SELECT w.relation FROM pg_locks AS w WHERE w.pid = %(pid)s AND NOT w.granted)) AS lock_modes
FROM pg_stat_activity AS a
WHERE a.pid = ANY (pg_blocking_pids(%(pid)s))
ORDER BY a.pid;

--@name waiting_on
-- What %(pid)s waits for right now (relation name and lock mode), if anything.
SELECT coalesce(l.relation::regclass::text, l.locktype) AS object, l.mode
FROM pg_locks AS l
WHERE l.pid = %(pid)s AND NOT l.granted
LIMIT 1;

--@name live_workers
-- Workers that would be refused after a protocol change: alive (recent heartbeat), not stopped.
SELECT count(*) AS alive,
       count(DISTINCT function_name) AS functions,
       (SELECT count(*) FROM pgflow.worker_functions WHERE enabled) AS enabled_functions
FROM pgflow.workers
WHERE stopped_at IS NULL AND last_heartbeat_at > now() - interval '30 seconds';
--@end
