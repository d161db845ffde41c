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

--@name transaction_changes
-- Rows this transaction inserted, updated and deleted so far, per table (for --dry-run).
SELECT schemaname || '.' || relname AS table_name, n_tup_ins AS inserted, n_tup_upd AS updated, n_tup_del AS deleted
FROM pg_stat_xact_user_tables
WHERE n_tup_ins + n_tup_upd + n_tup_del > 0
  AND schemaname !~ '^pg_(toast_)?temp_'  -- the migration's own scratch tables
ORDER BY 1;

--@name transaction_locks
-- Relation locks this transaction holds (for --dry-run): what workers would wait on. A relation
-- this transaction dropped (an index it replaced) has no name any more.
SELECT coalesce(n.nspname || '.' || c.relname, 'a relation dropped by this migration (oid ' || l.relation || ')') AS relation,
       string_agg(l.mode, ', ' ORDER BY l.mode) AS modes
FROM pg_locks AS l
LEFT JOIN pg_class AS c ON c.oid = l.relation
LEFT JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE l.pid = pg_backend_pid() AND l.granted AND l.relation IS NOT NULL AND l.locktype = 'relation'
  AND coalesce(n.nspname, '') NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  AND coalesce(n.nspname, '') !~ '^pg_(toast_)?temp_'  -- the migration's own scratch tables
GROUP BY 1
ORDER BY 1;
--@name live_workers
-- Workers that would be refused after a protocol change: alive (recent heartbeat), not stopped.
SELECT count(*) AS alive,
       count(DISTINCT function_name) AS functions,
       (SELECT count(*) FROM pgflow.worker_functions WHERE enabled) AS enabled_functions
FROM pgflow.workers
WHERE stopped_at IS NULL AND last_heartbeat_at > now() - interval '30 seconds';
--@end
