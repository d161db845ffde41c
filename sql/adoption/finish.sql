-- Adoption, part 3 of 3: after pgflow-cli's baseline functions were created (part 2), restore
-- the slug checks, carry the replaced functions' grants over and leave privileges as the
-- baseline has them. Same transaction as parts 1 and 2.

-- Every existing row is checked against the baseline slug rule (flows and steps are small).
ALTER TABLE pgflow.flows ADD CONSTRAINT slug_is_valid CHECK (pgflow.is_valid_slug(flow_slug));
ALTER TABLE pgflow.steps ADD CONSTRAINT steps_step_slug_check CHECK (pgflow.is_valid_slug(step_slug));

-- Privileges on functions: exactly the grants the replaced function of the same name had to
-- named roles (remembered in part 1), nothing else. Default privileges of the schema may have
-- granted more to the functions just created; that is taken back, so adoption grants nothing new.
DO $grants$
DECLARE
  v record;
BEGIN
  FOR v IN
    SELECT p.oid::regprocedure AS function_oid, a.grantee::regrole AS grantee
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
    WHERE p.pronamespace = 'pgflow'::regnamespace
      AND p.proname::text IN (SELECT r.name FROM pg_temp.pgflow_adopt_replaced AS r)
      AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %s', v.function_oid, v.grantee);
  END LOOP;
  FOR v IN
    SELECT p.oid::regprocedure AS function_oid, g.grantee::regrole AS grantee, g.privilege_type, g.is_grantable
    FROM pg_temp.pgflow_adopt_grants AS g
    JOIN pg_catalog.pg_proc AS p ON p.proname::text = g.function_name AND p.pronamespace = 'pgflow'::regnamespace
  LOOP
    EXECUTE pg_catalog.format('GRANT %s ON FUNCTION %s TO %s%s', v.privilege_type, v.function_oid, v.grantee,
                              CASE WHEN v.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
  END LOOP;
END
$grants$;

-- A worker_functions table created by part 1 starts with the owner's privileges only.
DO $registry$
DECLARE
  v record;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_temp.pgflow_adopt_new_tables WHERE table_name = 'worker_functions') THEN
    FOR v IN
      SELECT DISTINCT a.grantee::regrole AS grantee
      FROM pg_catalog.pg_class AS c
      CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      WHERE c.oid = 'pgflow.worker_functions'::regclass AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
      EXECUTE pg_catalog.format('REVOKE ALL ON pgflow.worker_functions FROM %s', v.grantee);
    END LOOP;
  END IF;
END
$registry$;

-- Nothing in pgflow is reachable by PUBLIC (baseline rule; upstream relied on the schema's ACL).
REVOKE ALL ON SCHEMA pgflow FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgflow FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgflow FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgflow REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

COMMENT ON SCHEMA pgflow IS
  'pgflow workflow engine (installed by pgflow, adopted by pgflow-cli; see pgflow.schema_adoption and pgflow.schema_migrations)';

-- What was found and adopted; `pgflow migrate status` reads it back.
CREATE TABLE IF NOT EXISTS pgflow.schema_adoption (
  release           text        NOT NULL,
  releases          text[]      NOT NULL,
  assumed           boolean     NOT NULL,
  differences       jsonb       NOT NULL,
  cron_jobs         jsonb       NOT NULL,
  supabase_history  jsonb,
  checksum          text        NOT NULL,
  tool_version      text        NOT NULL,
  pending           jsonb       NOT NULL DEFAULT '[]',
  completed_at      timestamptz,
  adopted_by        text        NOT NULL DEFAULT session_user,
  adopted_at        timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgflow.schema_adoption IS
  'pgflow-cli adopted a schema installed by a published pgflow release: which release, how it differed, by whom';
REVOKE ALL ON pgflow.schema_adoption FROM PUBLIC;
