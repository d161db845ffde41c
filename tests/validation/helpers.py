"""Both ingestion versions behind one interface, with their workers as real processes.

``App(version, conninfo)``: ``setup()``, ``submit(documents, faults)`` (the step-queued version also
awaits the runs in the background, as its application does: ``stepqueues.settle`` through the run
client), ``start_worker(stage)`` (a hand-rolled stage worker, or `pgflow worker ... --step`),
``queue(stage)``, ``tick()`` (what production runs periodically: pgflow's stalled-task recovery,
which pg_cron runs in production), ``wait_terminal()`` and counting helpers over the domain tables.
Nothing is mocked; waits poll real rows.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import psycopg

from examples.ingest import common, domain
from examples.ingest.handrolled import app as handrolled
from examples.ingest.stepqueues import app as stepqueues
from examples.ingest.stepqueues.flow import ingest
from pgflow_cli.client import Client, PollPolicy
from tests.worker.helpers import DEADLINE, WorkerProcess, wait_until

VERSIONS = ("handrolled", "stepqueues")
TARGET = "examples.ingest.stepqueues.flow:ingest"


class App:
    def __init__(self, version: str, conninfo: str, env: dict[str, str] | None = None) -> None:
        self.version = version
        self.conninfo = conninfo
        self.env = env or {}
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.workers: list[WorkerProcess] = []
        self.module = handrolled if version == "handrolled" else stepqueues
        self.client = Client(conninfo, poll=PollPolicy(first_interval=0.05, max_interval=0.5))
        self.settlers: list[threading.Thread] = []
        self.settle_errors: list[BaseException] = []

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.client.close()  # waits still going fail; their threads end
        for settler in self.settlers:
            settler.join(30)
        self.conn.close()

    def setup(self) -> None:
        self.module.setup(self.conn)

    def submit(self, documents: list[tuple[int, str]], faults: list[tuple[int, str, str]] = ()) -> None:
        submitted = self.module.submit(self.conn, documents, list(faults))
        if self.version == "stepqueues":
            settler = threading.Thread(target=self._settle, args=(submitted,), daemon=True)
            self.settlers.append(settler)
            settler.start()

    def _settle(self, submitted: dict[str, int]) -> None:
        try:
            stepqueues.settle(self.client, submitted)
        except RuntimeError:
            pass  # the app closed while runs were still going (a test that stops early)
        except BaseException as exc:  # reported by wait_terminal
            self.settle_errors.append(exc)

    def queue(self, stage: str) -> str:
        return handrolled.QUEUES[stage] if self.version == "handrolled" else ingest.queue_for(stage)  # type: ignore[arg-type]

    def start_worker(self, stage: str, concurrency: int = 4) -> WorkerProcess:
        """Start one worker process for ``stage`` and wait until it polls."""
        if self.version == "handrolled":
            argv = ["-m", "examples.ingest.handrolled", "worker", "--stage", stage, "--dsn", self.conninfo,
                    "--concurrency", str(concurrency)]
            ready, stream = "polling", "stderr"
        else:
            argv = ["-m", "pgflow_cli", "worker", TARGET, "--step", stage, "--dsn", self.conninfo,
                    "--concurrency", str(concurrency), "--heartbeat-interval", "0.3", "--drain-timeout", "30"]
            ready, stream = " started: flow=", "stderr"
        env = {**common.child_env(self.conninfo), **self.env}
        popen = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env, cwd=str(common.REPO))
        worker = WorkerProcess(popen, "")
        self.workers.append(worker)
        worker.wait_for_line(ready, which=stream)
        return worker

    def start_all(self, per_stage: int = 1) -> None:
        for stage in domain.STAGES:
            for _ in range(per_stage):
                self.start_worker(stage)

    def tick(self) -> None:
        if self.version == "stepqueues":
            self.conn.execute("SELECT pgflow.requeue_stalled_tasks()")

    def wait_terminal(self, timeout: float = DEADLINE) -> None:
        def terminal() -> bool:
            assert not self.settle_errors, self.settle_errors
            self.tick()
            return domain.pending_count(self.conn) == 0

        wait_until(terminal, f"{self.version}: every document done or failed", timeout=timeout, interval=0.2,
                   describe=lambda: str(domain.status_counts(self.conn)))

    def calls(self, doc_id: int, stage: str) -> int:
        return self.conn.execute("SELECT count(*) FROM ingest.stage_calls WHERE doc_id = %s AND stage = %s",
                                 (doc_id, stage)).fetchone()[0]

    def effects(self) -> dict[tuple[int, str], int]:
        return {(d, s): n for d, s, n in self.conn.execute(
            "SELECT doc_id, stage, count(*) FROM ingest.stage_effects GROUP BY 1, 2").fetchall()}

    def status(self, doc_id: int) -> str:
        return self.conn.execute("SELECT status FROM ingest.documents WHERE id = %s", (doc_id,)).fetchone()[0]

    def archived(self, stage: str) -> list[object]:
        """Bodies archived in a stage queue (test-only read of PGMQ's archive table)."""
        return [m for (m,) in self.conn.execute(
            psycopg.sql.SQL("SELECT message FROM pgmq.{} ORDER BY msg_id").format(
                psycopg.sql.Identifier("a_" + self.queue(stage)))).fetchall()]

    def in_queue(self, stage: str) -> list[object]:
        return [m for (m,) in self.conn.execute(
            psycopg.sql.SQL("SELECT message FROM pgmq.{} ORDER BY msg_id").format(
                psycopg.sql.Identifier("q_" + self.queue(stage)))).fetchall()]


def documents(n: int) -> list[tuple[int, str]]:
    return domain.sample_documents(n)
