-- The table locks the installer takes FIRST in each transaction of migration 0003, before any
-- of its SQL runs (pgflow_cli.installer.runner, docs/architecture.md "Locks a migration takes").
-- 0003 was released before the --@lock directive existed, so its lines live here: this file is
-- not part of 0003's text and not in its checksum. Migrations from 0004 on write their --@lock
-- lines in their own phases.
--
-- The one-transaction path takes the strongest mode of every phase it runs, per table. The
-- locks are taken in docs/runtime.md's order and all or none: a transaction that cannot get
-- the next one quickly gives every lock back and tries again, so it never waits while holding a
-- lock a producer or worker waits for long enough to form a deadlock.

--@phase prepare
-- definitions frozen for the recheck; the task table for the column, check and trigger
--@lock pgflow.flows SHARE ROW EXCLUSIVE
--@lock pgflow.steps SHARE ROW EXCLUSIVE
--@lock pgflow.step_tasks ACCESS EXCLUSIVE
--@lock pgflow.worker_functions ACCESS EXCLUSIVE

--@phase backfill
--@lock pgflow.step_tasks ROW EXCLUSIVE

--@phase validate
--@lock pgflow.step_tasks SHARE UPDATE EXCLUSIVE

--@phase main
--@lock pgflow.flows ACCESS EXCLUSIVE
--@lock pgflow.steps ACCESS EXCLUSIVE
--@lock pgflow.step_tasks ACCESS EXCLUSIVE
--@lock pgflow.worker_functions ACCESS EXCLUSIVE

--@phase abort
--@lock pgflow.step_tasks ACCESS EXCLUSIVE
