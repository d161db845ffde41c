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
ORDER BY 1;

--@name transaction_locks
-- Relation locks this transaction holds (for --dry-run): what workers would wait on.
SELECT l.relation::regclass::text AS relation, string_agg(l.mode, ', ' ORDER BY l.mode) AS modes
FROM pg_locks AS l
WHERE l.pid = pg_backend_pid() AND l.granted AND l.relation IS NOT NULL
  AND l.relation::regclass::text NOT LIKE 'pg\_%'
  AND l.relation::regclass::text NOT LIKE 'information\_schema.%'
GROUP BY l.relation
ORDER BY 1;
--@end
