-- The upgrade recheck: the blocking rules of `pgflow audit` (sql/audit/findings.sql), run under the
-- migration's locks in its first and its last transaction. Any blocking finding raises PF005 with
-- every offending flow and step in the detail; the transaction rolls back.
DO $recheck$
DECLARE
  v_count integer;
  v_detail text;
BEGIN
  SELECT pg_catalog.count(*)::integer,
         pg_catalog.string_agg(pg_catalog.format('%s %s: %s [%s]', f.check_id, f.object_name, f.message,
                                                 pg_catalog.array_to_string(f.reasons, ', ')),
                               E'\n' ORDER BY f.flow_slug, f.check_id, f.object_name)
  INTO v_count, v_detail
  FROM (
--@include released/0003/audit/findings.sql
  ) AS f
  WHERE f.blocking;
  IF v_count > 0 THEN
    RAISE EXCEPTION 'pgflow queue-identity upgrade refused: % incompatible definition(s) found under the migration''s locks; this transaction was rolled back', v_count
      USING ERRCODE = 'PF005',
            DETAIL = v_detail,
            HINT = 'run `pgflow audit` for the report with fixes: a rejected name needs a new concrete flow under a compliant slug; pgflow never renames or deletes flows. On the phased path, rerun `pgflow migrate apply` afterwards to finish, or `pgflow migrate abort 3` to undo the prepared phases';
  END IF;
END
$recheck$;