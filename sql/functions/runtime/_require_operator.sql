-- Refuses (42501) a caller that is neither the owner of the pgflow tables nor a member of the role
-- pgflow_operator: the run operations (cancel_run, retry_run, resume_run) are an operator's, and
-- a worker role, which holds EXECUTE on every pgflow function (docs/permissions.md "Workers"),
-- must not be able to cancel or restart runs. p_action names what was refused, in the message.
CREATE OR REPLACE FUNCTION pgflow._require_operator(p_action text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_owner text;
BEGIN
  SELECT pg_catalog.pg_get_userbyid(c.relowner) INTO v_owner
  FROM pg_catalog.pg_class AS c WHERE c.oid = 'pgflow.runs'::regclass;
  IF NOT (pg_catalog.pg_has_role(current_user, v_owner, 'USAGE')
          OR (pg_catalog.to_regrole('pgflow_operator') IS NOT NULL
              AND pg_catalog.pg_has_role(current_user, 'pgflow_operator', 'USAGE'))) THEN
    RAISE EXCEPTION 'role "%" may not %: only the owner of the pgflow tables ("%") or a member of pgflow_operator may',
      current_user, p_action, v_owner
      USING ERRCODE = '42501',
            HINT = 'run it as the schema owner, or GRANT pgflow_operator TO the role (docs/permissions.md "Run operators")';
  END IF;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._require_operator(text) FROM PUBLIC;
