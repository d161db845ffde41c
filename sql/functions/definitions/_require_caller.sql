-- pgflow._require_caller(role_name, action): the caller check of the operator and trusted entry
-- points. Every pgflow function runs with its caller's rights and the worker recipe grants EXECUTE
-- on all of them, so EXECUTE cannot tell a worker from an operator: membership does. Passes for
-- the owner of the pgflow tables (and its members) and for members of role_name when that role
-- exists; pgflow_operator members also pass where pgflow_trusted is asked (an operator may finish
-- a manual task: `pgflow task`). Returns nothing; raises 42501 naming the caller, the action and
-- the roles that may, before the caller has locked or changed anything.
CREATE OR REPLACE FUNCTION pgflow._require_caller(role_name text, action text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_owner name;
  v_roles text[];
BEGIN
  SELECT pg_catalog.pg_get_userbyid(c.relowner) INTO v_owner
  FROM pg_catalog.pg_class AS c WHERE c.oid = 'pgflow.flows'::regclass;
  IF pg_catalog.pg_has_role(current_user, v_owner, 'USAGE') THEN
    RETURN;
  END IF;
  v_roles := CASE _require_caller.role_name WHEN 'pgflow_trusted' THEN ARRAY['pgflow_trusted', 'pgflow_operator']
                                            ELSE ARRAY[_require_caller.role_name] END;
  IF EXISTS (SELECT 1 FROM pg_catalog.unnest(v_roles) AS r (name)
             WHERE pg_catalog.to_regrole(r.name) IS NOT NULL AND pg_catalog.pg_has_role(current_user, r.name, 'USAGE')) THEN
    RETURN;
  END IF;
  RAISE EXCEPTION 'role "%" may not %: only the owner of the pgflow tables ("%") or a member of % may',
    current_user, _require_caller.action, v_owner, pg_catalog.array_to_string(v_roles, ' or ')
    USING ERRCODE = '42501',
          HINT = pg_catalog.format('GRANT %s TO the role (docs/permissions.md "Three roles")', _require_caller.role_name);
END;
$$;
