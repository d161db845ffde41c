-- Queries of pgflow_cli.upstream.adopt (adopting a schema a published pgflow release installed).

--@name replaced_table
-- The functions adoption replaces, by name (read by sql/adoption/*.sql); gone at commit.
CREATE TEMP TABLE pgflow_adopt_replaced (
  name         text PRIMARY KEY,
  replaced_by  text
) ON COMMIT DROP

--@name replaced_rows
INSERT INTO pg_temp.pgflow_adopt_replaced (name, replaced_by)
SELECT r.name, r.replaced_by
FROM unnest(%(names)s::text[], %(replaced_by)s::text[]) AS r (name, replaced_by)

--@name adoption_insert
INSERT INTO pgflow.schema_adoption (release, releases, assumed, differences, cron_jobs, supabase_history,
                                    checksum, tool_version)
VALUES (%(release)s, %(releases)s, %(assumed)s, %(differences)s, %(cron_jobs)s, %(supabase_history)s,
        %(checksum)s, %(tool_version)s)
--@end
