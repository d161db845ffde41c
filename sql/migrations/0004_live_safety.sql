-- 0004 live safety: claims on a queue that lost a table stop the worker before any handler runs,
-- and a worker id reused for another route is refused instead of answered as its new owner.
--
-- What changes (issue 14; docs/claim-protocol.md):
--   * pgflow.claim_tasks: a queue without its queue table or its archive table is fatal for the
--     whole batch (reasons queue_table_missing, archive_table_missing) before anything is claimed,
--     so no attempt is burnt and no handler runs for a task that could never be completed; a call
--     for another route than the one the worker id registered raises PF007 and pauses nothing;
--   * pgflow.send_heartbeat(worker_id, function_name, queue_name, flow_slug, step_slug): a heartbeat
--     checked against the registered route (PF007 for a stale process under a reused id); the
--     one-argument form stays for workers that do not send their route;
--   * pgflow._listed_queue_name / pgflow._queue_exists: a pgmq.meta row belongs to a queue when it
--     names the same physical tables, derived as PGMQ derives them (lower() in the database
--     collation), not when the spellings are equal ignoring ASCII case: in a tr-TR database the
--     legacy row "Import" owns pgmq.q_ımport, not the tables of queue "import".
-- No table changes; the protocol version stays 2. Nothing is granted to PUBLIC.
--@apply functions/claim/claim_tasks.sql sha256=99d2901e0f5ed04ca51d6c54c4e8075e7b1bc156272e94fd849f4aa8fcf582fa
--@apply functions/workers/send_heartbeat.sql sha256=09b571f172a08e21c151d9ef6484f07a5e80337c23becb7ee79496adaa04179f
--@apply functions/queues/_listed_queue_name.sql sha256=35ef833216cfd734d9880cd3e09b0022c6031984ad95b183530db4a13dd829fb
--@apply functions/queues/_queue_exists.sql sha256=7f20c33421659abb4040ffc8cfeee7a5f9dabcd2bdab003ad3b3b6a21df008d6

-- Roles that could heartbeat before can send the route-checked heartbeat too (none: nothing to do).
DO $grants$
BEGIN
  EXECUTE coalesce((
    SELECT pg_catalog.string_agg(pg_catalog.format(
             'GRANT EXECUTE ON FUNCTION pgflow.send_heartbeat(uuid, text, text, text, text) TO %I', r.rolname), '; '
             ORDER BY r.rolname)
    FROM pg_catalog.pg_roles AS r
    WHERE NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_'
      AND pg_catalog.has_function_privilege(r.oid, 'pgflow.send_heartbeat(uuid)', 'EXECUTE')), 'SELECT 1');
END
$grants$;
