-- The table locks the installer takes FIRST in each transaction of migration 0003, before any
-- of its SQL runs (pgflow_cli.installer.runner, docs/architecture.md "Locks a migration takes").
-- 0003 was released before the --@lock directive existed, so its lines live here: this file is
-- not part of 0003's text and not in its checksum. Migrations from 0004 on write their --@lock
-- lines in their own phases.
--
-- The one-transaction path takes the strongest mode of every phase it runs, per table. The
-- locks are taken all or none (installer.runner.take_locks): a transaction never queues while it
-- holds a lock, gives every lock back at once when a holder of the next one waits for it, and
-- never waits while holding past the point where a waiting producer or worker would check for a
-- deadlock.

--@phase prepare
-- definitions frozen for the recheck, which reads the task table with ordinary read locks (a
-- full scan: 1-2 s on a million tasks, while workers go on)
--@lock pgflow.flows SHARE ROW EXCLUSIVE
--@lock pgflow.steps SHARE ROW EXCLUSIVE
-- the task table for the column, check and trigger: taken late, just before the statement of
-- 0003's text that locks it (after the recheck), never queued for, the whole transaction rolled
-- back and run again when it must give way (installer.runner.take_late_locks). The
-- one-transaction path takes these up front with the rest.
--@lock-at LOCK TABLE pgflow.step_tasks, pgflow.worker_functions IN ACCESS EXCLUSIVE MODE;
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
