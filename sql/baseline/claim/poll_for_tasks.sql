--@note Protocol-1 baseline: pgflow.poll_for_tasks as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/claim/poll_for_tasks.sql.
-- Deprecated upstream entry point kept for old callers: polls nothing.
--@include functions/claim/poll_for_tasks.sql lines=1-13
  RAISE NOTICE 'pgflow.poll_for_tasks() is deprecated and returns nothing: read with pgmq.read_with_poll() and claim with pgflow.start_tasks()';
--@include functions/claim/poll_for_tasks.sql lines=15-17
