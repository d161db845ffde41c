-- Queries of the sandbox seeds.

--@name already_seeded
-- The demo seed marks its flows with this comment-free convention: any flow present means seeded.
SELECT EXISTS (SELECT 1 FROM pgflow.flows) AS seeded;
--@end
