-- Batch checks of the naming rules over arrays of candidates: the SQL side of the
-- Python/SQL parity proof, and a way to ask the database which names it accepts.

--@name check_slugs
-- %(slugs)s: text[]. One row per distinct input: (slug, reasons text[]).
WITH slug_input AS (
  SELECT DISTINCT unnest(%(slugs)s::text[]) AS slug
), checked AS (
--@include fragments/slug_violations.sql
)
SELECT slug, reasons FROM checked;

--@name check_step_queue_names
-- %(flows)s text[], %(steps)s text[], %(indexes)s int[] (same length, valid slugs).
WITH route_input AS (
  SELECT f AS flow_slug, s AS step_slug, i AS step_index
  FROM unnest(%(flows)s::text[], %(steps)s::text[], %(indexes)s::integer[]) AS u(f, s, i)
), named AS (
--@include fragments/step_queue_names.sql
)
SELECT flow_slug, step_slug, step_index, queue_name, name_kind, reason FROM named;
--@end
