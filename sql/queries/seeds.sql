-- Queries of the sandbox seeds.

--@name already_seeded
-- A seed is only loaded into a database without flows.
SELECT EXISTS (SELECT 1 FROM pgflow.flows) AS seeded;
--@end
