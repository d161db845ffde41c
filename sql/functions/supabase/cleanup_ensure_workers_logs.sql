-- Deletes pg_cron run history older than retention_hours. Returns one row: how many history
-- rows it deleted (0 when pg_cron is not installed). Result type as released pgflow's,
-- TABLE (cron_deleted bigint) (docs/compatibility.md item 2).
--
-- The released baseline's version returned integer. A result type cannot be replaced in place, so an
-- older definition is first moved aside; after the new one exists it inherits the roles that
-- could execute the old one, and the old one is dropped. Running this file again changes nothing.
DO $move_aside$
BEGIN
  IF pg_catalog.to_regprocedure('pgflow.cleanup_ensure_workers_logs(integer)') IS NOT NULL
     AND pg_catalog.pg_get_function_result('pgflow.cleanup_ensure_workers_logs(integer)'::regprocedure) = 'integer' THEN
    ALTER FUNCTION pgflow.cleanup_ensure_workers_logs(integer) RENAME TO _cleanup_ensure_workers_logs_integer;
  END IF;
END
$move_aside$;

CREATE OR REPLACE FUNCTION pgflow.cleanup_ensure_workers_logs(retention_hours integer DEFAULT 24)
RETURNS TABLE (cron_deleted bigint)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
DECLARE
  v_count bigint := 0;
BEGIN
  IF pg_catalog.to_regclass('cron.job_run_details') IS NOT NULL THEN
    EXECUTE 'DELETE FROM cron.job_run_details AS d WHERE d.end_time < pg_catalog.now() - pg_catalog.make_interval(hours => $1)'
      USING cleanup_ensure_workers_logs.retention_hours;
    GET DIAGNOSTICS v_count = ROW_COUNT;
  END IF;
  cron_deleted := v_count;
  RETURN NEXT;
END;
$$;

REVOKE ALL ON FUNCTION pgflow.cleanup_ensure_workers_logs(integer) FROM PUBLIC;

DO $hand_over$
DECLARE
  v_role text;
BEGIN
  IF pg_catalog.to_regprocedure('pgflow._cleanup_ensure_workers_logs_integer(integer)') IS NULL THEN
    RETURN;
  END IF;
  FOR v_role IN
    SELECT r.rolname
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
    JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
    WHERE p.oid = 'pgflow._cleanup_ensure_workers_logs_integer(integer)'::regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    ORDER BY r.rolname
  LOOP
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgflow.cleanup_ensure_workers_logs(integer) TO %I', v_role);
  END LOOP;
  DROP FUNCTION pgflow._cleanup_ensure_workers_logs_integer(integer);
END
$hand_over$;
