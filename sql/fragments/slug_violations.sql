-- Fragment: the flow/step slug rules (authoritative; mirrored by pgflow_cli.naming).
-- Input relation: slug_input(slug text). Output: (slug text, reasons text[]).
-- reasons lists every broken rule in a fixed order; an empty array means valid.
-- Included by the audit and by the migrations that define pgflow.slug_violations();
-- never edit one copy: there is only this one.
SELECT si.slug,
       CASE
         WHEN si.slug IS NULL OR si.slug = '' THEN ARRAY['empty']::text[]
         ELSE ARRAY(
           SELECT r.code
           FROM (VALUES
             (1, 'too_long',            length(si.slug) > 128),
             (2, 'invalid_character',   (si.slug COLLATE "C") !~ '^[A-Za-z0-9_]*$'),
             (3, 'leading_digit',       (si.slug COLLATE "C") ~ '^[0-9]'),
             (4, 'leading_underscore',  left(si.slug, 1) = '_'),
             (5, 'trailing_underscore', right(si.slug, 1) = '_'),
             (6, 'double_underscore',   strpos(si.slug, '__') > 0),
             (7, 'reserved_word',       si.slug = 'run')
           ) AS r(ord, code, hit)
           WHERE r.hit
           ORDER BY r.ord
         )
       END AS reasons
FROM slug_input AS si
